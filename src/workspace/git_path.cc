#include "workspace/git_path.h"

#include <cstdint>

#include "util/ascii.h"

namespace trybox::workspace {
namespace {

constexpr const char* kDotGit = "a '.git' component (git refuses it)";
constexpr const char* kNtfsDotGit =
    "a spelling of '.git' that Windows opens as the repository (git refuses it)";
constexpr const char* kHfsDotGit =
    "a spelling of '.git' that macOS opens as the repository (git refuses it)";
constexpr const char* kGitmodulesLink = "a symbolic link named .gitmodules (git refuses it)";

// ASCII case-insensitive: does `s` start with `lower` (given in lower case)?
bool StartsWithFolded(std::string_view s, std::string_view lower) {
  if (s.size() < lower.size()) return false;
  for (size_t i = 0; i < lower.size(); ++i) {
    if (AsciiLower(s[i]) != lower[i]) return false;
  }
  return true;
}

bool EndOrSlash(std::string_view s, size_t i) { return i >= s.size() || s[i] == '/'; }

// One code point as git's own UTF-8 reader takes it: besides the usual overlong forms,
// surrogates and values past U+10FFFF, it refuses U+FFFE and U+FFFF. False when malformed.
bool NextCodePoint(std::string_view s, size_t* i, uint32_t* cp) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[*i + k]); };
  size_t left = s.size() - *i;
  unsigned char c = b(0);
  if (c < 0x80) {
    *cp = c;
    *i += 1;
    return true;
  }
  auto cont = [&](size_t k) { return k < left && (b(k) & 0xC0) == 0x80; };
  if ((c & 0xE0) == 0xC0) {
    if (!cont(1) || (c & 0xFE) == 0xC0) return false;
    *cp = (c & 0x1Fu) << 6 | (b(1) & 0x3Fu);
    *i += 2;
    return true;
  }
  if ((c & 0xF0) == 0xE0) {
    if (!cont(1) || !cont(2) || (c == 0xE0 && (b(1) & 0xE0) == 0x80) ||
        (c == 0xED && (b(1) & 0xE0) == 0xA0) ||
        (c == 0xEF && b(1) == 0xBF && (b(2) & 0xFE) == 0xBE)) {
      return false;
    }
    *cp = (c & 0x0Fu) << 12 | (b(1) & 0x3Fu) << 6 | (b(2) & 0x3Fu);
    *i += 3;
    return true;
  }
  if ((c & 0xF8) == 0xF0) {
    if (!cont(1) || !cont(2) || !cont(3) || (c == 0xF0 && (b(1) & 0xF0) == 0x80) ||
        (c == 0xF4 && b(1) > 0x8F) || c > 0xF4) {
      return false;
    }
    *cp = (c & 0x07u) << 18 | (b(1) & 0x3Fu) << 12 | (b(2) & 0x3Fu) << 6 | (b(3) & 0x3Fu);
    *i += 4;
    return true;
  }
  return false;
}

// Code points HFS+ leaves out of a name when it compares names.
bool HfsIgnorable(uint32_t cp) {
  return (cp >= 0x200C && cp <= 0x200F) || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x206A && cp <= 0x206F) || cp == 0xFEFF;
}

// Does the component at the start of `s` read as "." + `needle` on HFS+ (ignorable code points
// dropped, ASCII case folded)? As in git, a malformed sequence right after the name counts
// as its end.
bool HfsDotName(std::string_view s, std::string_view needle) {
  size_t i = 0;
  // The next significant code point; 0 at the end of `s`, -1 for a malformed sequence.
  auto next = [&]() -> int64_t {
    for (;;) {
      if (i >= s.size()) return 0;
      uint32_t cp;
      if (!NextCodePoint(s, &i, &cp)) return -1;
      if (!HfsIgnorable(cp)) return cp;
    }
  };
  if (next() != '.') return false;
  for (char n : needle) {
    int64_t c = next();
    if (c <= 0 || c > 127 || AsciiLower(static_cast<char>(c)) != n) return false;
  }
  int64_t c = next();
  return c <= 0 || c == '/';
}

// ".git" or "git~1" (ASCII case folded), then only dots and spaces up to the end of the
// name: a '/', a '\', a ':' (an NTFS stream) or the end of `s`.
bool NtfsDotGit(std::string_view s) {
  size_t i;
  if (!s.empty() && s[0] == '.' && StartsWithFolded(s.substr(1), "git")) {
    i = 4;
  } else if (StartsWithFolded(s, "git") && s.size() >= 5 && s[3] == '~' && s[4] == '1') {
    i = 5;
  } else {
    return false;
  }
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '/' || c == '\\' || c == ':') return true;
    if (c != '.' && c != ' ') return false;
  }
  return true;
}

// From `i` on, only dots and spaces up to the end of `s` or a ':'.
bool OnlyDotsAndSpaces(std::string_view s, size_t i) {
  for (; i < s.size(); ++i) {
    if (s[i] == ':') return true;
    if (s[i] != '.' && s[i] != ' ') return false;
  }
  return true;
}

// ".gitmodules" as NTFS may spell it: the long name, the short name "gitmod~N" (N 1..4), or
// a fallback short name built from the hash prefix "gi7eba" and "~" digits.
bool NtfsDotGitmodules(std::string_view s) {
  if (!s.empty() && s[0] == '.' && StartsWithFolded(s.substr(1), "gitmodules")) {
    return OnlyDotsAndSpaces(s, 11);
  }
  if (StartsWithFolded(s, "gitmod") && s.size() >= 8 && s[6] == '~' && s[7] >= '1' && s[7] <= '4') {
    return OnlyDotsAndSpaces(s, 8);
  }
  static constexpr char kPrefix[] = "gi7eba";
  bool tilde = false;
  size_t i = 0;
  for (; i < 8; ++i) {
    if (i >= s.size()) return false;
    char c = s[i];
    if (tilde) {
      if (c < '0' || c > '9') return false;
    } else if (c == '~') {
      ++i;
      if (i >= s.size() || s[i] < '1' || s[i] > '9') return false;
      tilde = true;
    } else if (i >= 6 || (static_cast<unsigned char>(c) & 0x80) || AsciiLower(c) != kPrefix[i]) {
      return false;
    }
  }
  return OnlyDotsAndSpaces(s, i);
}

// The checks git makes where a name starts (a component, or the text after a '\').
const char* AliasAt(std::string_view rest, bool symlink, bool component_start) {
  if (component_start) {
    if (HfsDotName(rest, "git")) return kHfsDotGit;
    if (symlink && HfsDotName(rest, "gitmodules")) return kGitmodulesLink;
  }
  if (NtfsDotGit(rest)) return kNtfsDotGit;
  if (symlink && NtfsDotGitmodules(rest)) return kGitmodulesLink;
  return nullptr;
}

// A component starting with '.': `rest` is what follows the dot, to the end of the path.
const char* DotComponent(std::string_view rest, bool symlink) {
  if (EndOrSlash(rest, 0)) return "a '.' component";
  if (rest[0] == '.' && EndOrSlash(rest, 1)) return "a '..' component";
  if (StartsWithFolded(rest, "git")) {
    if (EndOrSlash(rest, 3)) return kDotGit;
    if (symlink && StartsWithFolded(rest.substr(3), "modules") && EndOrSlash(rest, 10)) {
      return kGitmodulesLink;
    }
  }
  return nullptr;
}

}  // namespace

PathRefusal GitPathRefusal(std::string_view path, bool symlink) {
  size_t start = 0;
  for (;;) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    auto refuse = [&](const char* why) { return PathRefusal{why, end}; };
    std::string_view rest = path.substr(start);
    if (const char* why = AliasAt(rest, symlink, true)) return refuse(why);
    if (start == end) return refuse("an empty path component");
    if (path[start] == '.') {
      if (const char* why = DotComponent(rest.substr(1), symlink)) return refuse(why);
    }
    // As in git, a '\' starts a name for NTFS anywhere but at the start of a component.
    for (size_t i = start + 1; i < end; ++i) {
      if (path[i] != '\\') continue;
      if (const char* why = AliasAt(path.substr(i + 1), symlink, false)) return refuse(why);
    }
    if (end == path.size()) return {};
    start = end + 1;
  }
}

PathRefusal UnstorablePath(std::string_view path, bool symlink) {
  size_t nl = path.find('\n');
  PathRefusal git = GitPathRefusal(path, symlink);
  if (nl == std::string_view::npos || (!git.ok() && git.prefix <= nl)) return git;
  size_t end = path.find('/', nl);
  return {"a newline in the name (trybox does not record such names)",
          end == std::string_view::npos ? path.size() : end};
}

}  // namespace trybox::workspace
