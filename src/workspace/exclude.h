// The exclude list of a workspace: which paths never cross into or out of a VM.
//
// Built in, at any depth: the directories target/, node_modules/, build/, .venv/ and
// __pycache__/, and anything named exactly .git (a repository; other spellings of it are
// refused by git and are skipped and named instead, see git_path.h).
// Then the project's own `.trybox/exclude`, one pattern per line:
//   - blank lines and lines starting with '#' are ignored; '!' (negation) is refused;
//   - a trailing '/' matches directories only;
//   - a pattern with no other '/' matches a name at any depth (fnmatch on each component);
//   - a pattern with a '/' is anchored at the workspace root and matched against the whole
//     relative path (fnmatch with FNM_PATHNAME; a leading '/' is dropped).
// A directory that matches excludes everything below it. The same list, as read at inject
// time, is applied on the way in and on the way out. Immutable once built; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trybox::workspace {

class ExcludeList {
 public:
  struct Pattern {
    std::string glob;
    bool dir_only = false;
    bool anchored = false;
  };

  // The built-in list only.
  ExcludeList();
  // The built-in list plus the lines of a `.trybox/exclude` file. A refused line is an
  // error naming its line number.
  static Result<ExcludeList> WithProjectFile(std::string_view contents);

  // `path` is relative to the workspace root, '/'-separated, without "./". `is_dir` is the
  // type of the last component; every earlier component is a directory.
  bool Excluded(std::string_view path, bool is_dir) const;

  // The project patterns as given (for the record), one per line.
  const std::vector<std::string>& project_lines() const { return project_lines_; }
  // Names of directories excluded at any depth by a plain name (no glob, no '/'); a guest
  // may drop them early. The host's own check stays authoritative.
  std::vector<std::string> PlainDirNames() const;

 private:
  bool Matches(const Pattern& p, std::string_view prefix, std::string_view name, bool is_dir) const;
  std::vector<Pattern> patterns_;
  std::vector<std::string> project_lines_;
};

// The built-in directory names.
const std::vector<std::string>& DefaultExcludedDirs();

}  // namespace trybox::workspace
