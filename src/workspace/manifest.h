// Manifests of a workspace and the diff between two of them.
//
// A manifest lists the regular files and symbolic links of a tree (directories are implied,
// as in git): path, type, permission bits, size and sha256 of the content (of the link
// target for a symlink). The daemon builds one of what it sends into a VM and one of what
// comes back, from its own reads of the host's files, and diffs them. Pure data otherwise;
// values are thread-compatible.
//
// Paths and symlink targets are bytes (a guest names its files as it likes). In every JSON
// made here they are written with SetBytesField (util/utf8.h): "path" is the name when it is
// valid UTF-8, a display form otherwise, and then "path_b64" holds the exact bytes; likewise
// "target"/"target_b64" and "from"/"from_b64" (docs/workspace.md, "Names in JSON").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/sha256.h"
#include "util/status.h"
#include "workspace/exclude.h"

namespace trybox::workspace {

using Json = nlohmann::json;

struct Entry {
  std::string path;  // relative, '/'-separated
  bool symlink = false;
  uint32_t mode = 0;  // st_mode & 07777
  uint64_t size = 0;
  std::string sha256;
  std::string target;  // symlinks: the link text
  std::string blob;  // the git blob id (in the user's repository once the plan or commit wrote it)
  // The git mode: 120000, 100755 or 100644.
  const char* GitMode() const;
  bool operator==(const Entry&) const = default;
};

using Manifest = std::map<std::string, Entry>;

// An entry that was not copied, and why ("a socket", "an absolute path", ...).
struct Skipped {
  std::string path;
  std::string reason;
};

// [{path, path_b64?, reason}], always dump-safe. The daemon's `skipped` fields.
Json SkippedToJson(const std::vector<Skipped>& skipped);

// The entries of `paths` (relative to `root`), each examined with lstat. Excluded paths,
// paths that no longer exist (a tracked file deleted in the working tree), directories (a
// submodule), special files and paths a commit cannot hold (UnstorablePath) are left out;
// all but excluded ones are added to `skipped`. With `blob_ids`, each entry's `blob` is the
// id git would give its content, computed in the same read as its SHA-256 (the repository
// may not hold it yet), or "" for a file whose length changed while it was read.
//
// With `listed`: once every path is examined (types, sizes, modes and symlink targets known,
// files not yet read), `listed` is called on a thread of its own with that manifest (files
// without digests or blob ids) while the files are read and hashed. Its error is the
// result (the reading stops early); otherwise the first read error is.
Result<Manifest> ManifestFromList(const std::string& root, const std::vector<std::string>& paths,
                                  const ExcludeList& excludes, std::vector<Skipped>* skipped,
                                  GitObjectHash blob_ids = GitObjectHash::kNone,
                                  const std::function<Status(const Manifest&)>& listed = nullptr);
// Every regular file and symlink below `root`, never following a link, minus exclusions and
// minus paths a commit cannot hold (UnstorablePath), which are added to `skipped` if given (a
// refused directory once, for everything below it).
Result<Manifest> ManifestFromTree(const std::string& root, const ExcludeList& excludes,
                                  std::vector<Skipped>* skipped = nullptr);

uint64_t TotalBytes(const Manifest& m);
Json ManifestToJson(const Manifest& m);
Result<Manifest> ManifestFromJson(const Json& j);

// One difference between what went in and what came back.
struct Change {
  enum class Kind { kAdded, kModified, kDeleted, kModeChanged, kRenamed };
  Kind kind;
  std::string path;      // the new path (the only path unless renamed)
  std::string old_path;  // renamed: where it was
  uint64_t old_size = 0, new_size = 0;
  uint32_t old_mode = 0, new_mode = 0;
};

const char* KindName(Change::Kind k);
Result<Change::Kind> KindFromName(const std::string& name);

// Added, modified (content or type), deleted, mode-changed (content equal, permission bits
// not). A deleted path and an added path with the same type and content hash are one
// rename, paired one to one in path order. Sorted by path. O(n log n): a guest controls
// how many entries come back.
std::vector<Change> Diff(const Manifest& before, const Manifest& after);

// [{change, path, path_b64?, from?, from_b64?, old_size?, new_size?, old_mode?, new_mode?}]
Json ChangesToJson(const std::vector<Change>& changes);

}  // namespace trybox::workspace
