#include "agent/text.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace trybox::agent {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 if it is not one.
size_t SeqLen(std::string_view s, size_t i, uint32_t* cp) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t n;
  uint32_t v;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    v = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    v = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    v = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(i + k) & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
  if ((n == 2 && v < 0x80) || (n == 3 && v < 0x800) || (n == 4 && v < 0x10000) ||
      (v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF) {
    return 0;
  }
  *cp = v;
  return n;
}

// The byte offset <= `at` where a character starts.
size_t Boundary(std::string_view s, size_t at) {
  while (at > 0 && at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) --at;
  return at;
}

bool Dangerous(uint32_t cp) {
  if (cp == '\t') return false;
  if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F)) return true;
  if (cp == 0x2028 || cp == 0x2029) return true;  // line/paragraph sep
  if ((cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069)) return true;  // bidi
  if (cp == 0x200B || cp == 0x200C || cp == 0x200D || cp == 0x200E || cp == 0x200F ||
      cp == 0x061C || cp == 0xFEFF) {
    return true;
  }
  return false;
}

// `clean` (valid UTF-8) with each Dangerous character written with `fmt`; a newline is kept
// and followed by `*line_prefix` when that is given, else escaped like the rest.
std::string EscapeUnsafe(const std::string& clean, const char* fmt,
                         const std::string_view* line_prefix) {
  std::string out;
  for (size_t i = 0; i < clean.size();) {
    uint32_t cp = 0;
    size_t n = std::max<size_t>(SeqLen(clean, i, &cp), 1);
    if (cp == '\n' && line_prefix) {
      out += '\n';
      out += *line_prefix;
    } else if (Dangerous(cp)) {
      char buf[16];
      std::snprintf(buf, sizeof buf, fmt, cp);
      out += buf;
    } else {
      out.append(clean, i, n);
    }
    i += n;
  }
  return out;
}

}  // namespace

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t n = SeqLen(s, i, &cp);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string CapHead(std::string_view s, size_t max, bool* truncated) {
  if (truncated) *truncated = s.size() > max;
  if (s.size() <= max) return SanitizeUtf8(s);
  return SanitizeUtf8(s.substr(0, Boundary(s, max)));
}

std::string CapChars(std::string_view s, size_t max_chars, bool* truncated) {
  std::string clean = SanitizeUtf8(s);
  size_t chars = 0;
  for (size_t i = 0; i < clean.size(); ++i) {
    if ((static_cast<unsigned char>(clean[i]) & 0xC0) == 0x80) continue;
    if (chars++ == max_chars) {
      if (truncated) *truncated = true;
      return clean.substr(0, i);
    }
  }
  if (truncated) *truncated = false;
  return clean;
}

std::string CapTail(std::string_view s, size_t max, bool* truncated) {
  if (truncated) *truncated = s.size() > max;
  if (s.size() <= max) return SanitizeUtf8(s);
  size_t from = s.size() - max;
  while (from < s.size() && (static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) ++from;
  return "[... " + std::to_string(from) + " bytes before ...]\n" + SanitizeUtf8(s.substr(from));
}

std::string CapMiddle(std::string_view s, size_t max, bool* truncated) {
  if (truncated) *truncated = s.size() > max;
  if (s.size() <= max) return SanitizeUtf8(s);
  // A quarter for the head, the rest for the tail, where errors usually are.
  size_t head = Boundary(s, max / 4);
  size_t tail_from = s.size() - (max - max / 4);
  while (tail_from < s.size() && (static_cast<unsigned char>(s[tail_from]) & 0xC0) == 0x80) {
    ++tail_from;
  }
  return SanitizeUtf8(s.substr(0, head)) + "\n[... " + std::to_string(tail_from - head) +
         " bytes omitted ...]\n" + SanitizeUtf8(s.substr(tail_from));
}

std::string InlineQuote(std::string_view s, size_t max) {
  bool cut = false;
  std::string v = CapHead(s, max, &cut);
  // JSON escapes controls; the rest of the dangerous set is escaped here.
  std::string safe =
      EscapeUnsafe(nlohmann::json(v).dump(-1, ' ', /*ensure_ascii=*/false), "\\u%04X", nullptr);
  if (cut) safe += " [cut at " + std::to_string(max) + " bytes]";
  return safe;
}

std::string QuoteBlock(std::string_view s, std::string_view prefix) {
  std::string out(prefix);
  out += EscapeUnsafe(SanitizeUtf8(s), "\\u{%04X}", &prefix);
  out += '\n';
  return out;
}

}  // namespace trybox::agent
