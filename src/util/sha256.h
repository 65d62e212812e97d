// SHA-256 of files and strings (Nettle), as lowercase hex.
#pragma once

#include <string>
#include <string_view>

#include "util/status.h"

namespace trybox {

Result<std::string> Sha256File(const std::string& path);
std::string Sha256Hex(std::string_view data);

// The hash git names its objects with (a repository's `extensions.objectFormat`).
enum class GitObjectHash { kNone, kSha1, kSha256 };

// One read of a file, two digests: its SHA-256, and (unless `git` is kNone) the id git gives
// it as a blob, the object hash of "blob SIZE\0" then the content. `size` is what lstat
// said; a file whose length turns out otherwise has no blob id ("": git must hash it).
struct FileDigests {
  std::string sha256;
  std::string git_blob;
};
Result<FileDigests> DigestFile(const std::string& path, GitObjectHash git, uint64_t size);
// A git blob id of `content` (kSha1 or kSha256).
std::string GitBlobId(std::string_view content, GitObjectHash git);

}  // namespace trybox
