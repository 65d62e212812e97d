// Moving files between the host and a VM through tryboxd's put/get verbs.
//
// Single files travel as raw bytes with their mode and mtime; directory trees travel as a
// tar stream built and unpacked on the host by libarchive. Unpacking refuses absolute paths,
// ".." components and writes through symlinks, so a guest can never write outside the
// destination tree.
#pragma once

#include <string>

#include "cli/client.h"

namespace trybox::cli {

struct TransferStats {
  uint64_t bytes = 0;
  std::string kind;  // "file" or "tar"
};

// Copies host `src` (file or directory) to `guest_path` in VM `vm`.
Result<TransferStats> PutPath(Client& client, const std::string& vm, const std::string& src,
                              const std::string& guest_path);
// Copies `guest_path` from VM `vm` to host `dst`. A file lands at `dst` (or inside it if
// `dst` is a directory); a directory's contents are unpacked into `dst` (created).
Result<TransferStats> GetPath(Client& client, const std::string& vm, const std::string& guest_path,
                              const std::string& dst);

// Unpacks a tar stream (from `next_chunk`, which returns "" at the end) into `dest`.
// Exposed for tests of the path-safety rules.
Status ExtractTarSafely(const std::function<Result<std::string>()>& next_chunk,
                        const std::string& dest);

}  // namespace trybox::cli
