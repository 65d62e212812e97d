// Moving files between the host and a VM through tryboxd's put/get verbs.
//
// Single files travel as raw bytes with their mode and mtime; directory trees travel as a
// tar stream built and unpacked on the host by trybox-tar, a process beside the CLI
// (cli/tree_tar.h). Unpacking refuses absolute paths, ".." components and writes through
// symlinks, so a guest can never write outside the destination tree.
//
// What comes from a guest is never privileged on the host and never lands half-done
// (docs/security.md, "The CLI and the host"): set-uid, set-gid and sticky bits are dropped;
// a file or tree is written under a random hidden name beside its destination
// (".NAME.trybox-tmp-RANDOM", created with O_EXCL|O_NOFOLLOW, mode 0600 or 0700 until
// complete) and renamed into place only when complete; a helper process in its own session
// removes that temporary entry if the copy fails or the CLI dies, even by SIGKILL.
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
// Copies `guest_path` from VM `vm` to host `dst`. If `dst` is an existing directory the
// copy lands inside it under the source's name; otherwise it lands at `dst`. A file replaces
// an existing regular file; a tree never replaces or merges into anything that exists
// (kAlreadyExists). A `dst`, or an entry inside the `dst` directory, that is a symbolic link
// is refused (kFailedPrecondition); end `dst` with "/" to copy into the directory a link
// points to.
Result<TransferStats> GetPath(Client& client, const std::string& vm, const std::string& guest_path,
                              const std::string& dst);

}  // namespace trybox::cli
