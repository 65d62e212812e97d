#include "util/names.h"

#include <sys/random.h>

#include <cstdio>

#include "util/utf8.h"

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
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) {
      return InvalidArgument(std::string(what) + " " + QuoteForMessage(name) +
                             " may contain only A-Z, a-z, 0-9, '_' and '-'");
    }
  }
  // Names reach child processes' command lines (`trybox image build NAME`): one that starts
  // with '-' would be read there as an option.
  if (name[0] == '-') {
    return InvalidArgument(std::string(what) + " " + QuoteForMessage(name) +
                           " starts with '-': a name is A-Z, a-z, 0-9, '_' and '-', and does "
                           "not start with '-'");
  }
  return Status::Ok();
}

std::string RandomHex(size_t n) {
  std::string bytes(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::getrandom(bytes.data() + got, n - got, 0);
    if (r > 0) got += static_cast<size_t>(r);
  }
  return HexEncode(bytes);
}

std::string NewId() { return RandomHex(6); }

}  // namespace trybox
