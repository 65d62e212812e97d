#include "workspace/exclude.h"

#include <fnmatch.h>

#include "util/utf8.h"

namespace trybox::workspace {

const std::vector<std::string>& DefaultExcludedDirs() {
  static const std::vector<std::string> kDirs = {"target", "node_modules", "build", ".venv",
                                                 "__pycache__"};
  return kDirs;
}

ExcludeList::ExcludeList() {
  for (const auto& d : DefaultExcludedDirs()) patterns_.push_back({d, true, false});
}

Result<ExcludeList> ExcludeList::WithProjectFile(std::string_view contents) {
  ExcludeList l;
  size_t line_no = 0;
  while (!contents.empty()) {
    size_t nl = contents.find('\n');
    std::string line(contents.substr(0, nl));
    contents.remove_prefix(nl == std::string_view::npos ? contents.size() : nl + 1);
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
      line.pop_back();
    }
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    line = line.substr(start);
    // The lines are kept in the workspace record (JSON), and applied again at collect time:
    // a line that is not UTF-8 could not come back as it was.
    if (!IsValidUtf8(line)) {
      return InvalidArgument(".trybox/exclude line " + std::to_string(line_no) +
                             ": not valid UTF-8");
    }
    if (line[0] == '!') {
      return InvalidArgument(".trybox/exclude line " + std::to_string(line_no) +
                             ": negated patterns ('!') are not supported");
    }
    Pattern p;
    std::string g = line;
    if (g.back() == '/') {
      p.dir_only = true;
      g.pop_back();
    }
    if (!g.empty() && g[0] == '/') {
      p.anchored = true;
      g.erase(0, 1);
    }
    if (g.find('/') != std::string::npos) p.anchored = true;
    if (g.empty()) {
      return InvalidArgument(".trybox/exclude line " + std::to_string(line_no) +
                             ": the pattern is empty");
    }
    p.glob = g;
    l.patterns_.push_back(p);
    l.project_lines_.push_back(line);
  }
  return l;
}

bool ExcludeList::Matches(const Pattern& p, std::string_view prefix, std::string_view name,
                          bool is_dir) const {
  if (p.dir_only && !is_dir) return false;
  std::string subject(p.anchored ? prefix : name);
  return ::fnmatch(p.glob.c_str(), subject.c_str(), p.anchored ? FNM_PATHNAME : 0) == 0;
}

bool ExcludeList::Excluded(std::string_view path, bool is_dir) const {
  size_t start = 0;
  for (;;) {
    size_t slash = path.find('/', start);
    bool last = slash == std::string_view::npos;
    std::string_view name = path.substr(start, last ? std::string_view::npos : slash - start);
    std::string_view prefix = path.substr(0, last ? path.size() : slash);
    bool dir = last ? is_dir : true;
    // The repository's own directory. Other spellings (".GIT", "git~1") are not excluded but
    // skipped and named (git_path.h): a guest made them, and the report says so.
    if (name == ".git") return true;
    for (const auto& p : patterns_) {
      if (Matches(p, prefix, name, dir)) return true;
    }
    if (last) return false;
    start = slash + 1;
  }
}

std::vector<std::string> ExcludeList::PlainDirNames() const {
  std::vector<std::string> out = {".git"};
  for (const auto& p : patterns_) {
    if (p.dir_only && !p.anchored && p.glob.find_first_of("*?[\\") == std::string::npos) {
      out.push_back(p.glob);
    }
  }
  return out;
}

}  // namespace trybox::workspace
