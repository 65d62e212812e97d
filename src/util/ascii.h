// ASCII letter case for protocol text (HTTP header names, host names, hex ids): the same
// answer in every locale, which std::tolower does not promise, and nothing outside A-Z
// changed (UTF-8 bytes pass through as they are).
#pragma once

#include <algorithm>
#include <string>
#include <string_view>

namespace trybox {

inline char AsciiLower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

inline std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = AsciiLower(c);
  return out;
}

// Equal but for the case of ASCII letters ("Content-Length" and "content-length").
inline bool AsciiEqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return AsciiLower(x) == AsciiLower(y);
         });
}

}  // namespace trybox
