// Which paths a workspace commit can hold.
//
// git refuses some paths in an index (its verify_path): empty, "." and ".." components, ".git"
// in any case, and, with core.protectNTFS and core.protectHFS (both forced on by
// HardenedGitArgs), every spelling of ".git" that Windows or macOS would open as the
// repository itself: "git~1", ".git. ", ".git::$INDEX_ALLOCATION", ".g\u200Cit"; and a
// symbolic link named .gitmodules in any of those spellings. `update-index` drops such a path
// with a warning and exits 0, so a path that is not checked here first would be claimed by
// the record and missing from the commit. trybox also never records a name with a newline.
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace trybox::workspace {

struct PathRefusal {
  std::string reason;  // empty: the path can be committed
  size_t prefix = 0;   // bytes of the path up to the end of the offending component
  bool ok() const { return reason.empty(); }
};

// git's own rules (verify_path with protectNTFS and protectHFS) for `path`, relative and
// '/'-separated. `symlink`: the entry is a symbolic link.
PathRefusal GitPathRefusal(std::string_view path, bool symlink);

// GitPathRefusal, plus trybox's own: no newline anywhere in the path.
PathRefusal UnstorablePath(std::string_view path, bool symlink);

}  // namespace trybox::workspace
