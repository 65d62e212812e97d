#include "util/names.h"

#include <sys/random.h>

#include <cstdio>

namespace trybox {

std::string QuoteForMessage(std::string_view s, size_t max) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max) out += "...";
  return out + "'";
}

Status ValidateName(std::string_view what, std::string_view name) {
  if (name.empty()) return InvalidArgument(std::string(what) + " is empty");
  if (name.size() > 64) {
    return InvalidArgument(std::string(what) + " " + QuoteForMessage(name) +
                           " is longer than 64 characters");
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) {
      return InvalidArgument(std::string(what) + " " + QuoteForMessage(name) +
                             " may contain only A-Z, a-z, 0-9, '_' and '-'");
    }
  }
  return Status::Ok();
}

std::string NewId() {
  unsigned char b[6];
  size_t got = 0;
  while (got < sizeof b) {
    ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string id;
  for (unsigned char c : b) {
    id += kHex[c >> 4];
    id += kHex[c & 15];
  }
  return id;
}

}  // namespace trybox
