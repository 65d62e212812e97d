#include "egress/hostname.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "util/ascii.h"

namespace trybox::egress {
namespace {

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// What an IPv4 parser (inet_aton, WHATWG URL) accepts as one number: decimal, octal with a
// leading 0, hex with 0x. A name whose last label is such a number is an address to them.
bool IsNumericLabel(std::string_view l) {
  if (IsDigits(l)) return true;
  if (l.size() >= 2 && l[0] == '0' && l[1] == 'x') {
    return std::all_of(l.begin() + 2, l.end(), [](char c) { return std::isxdigit(c) != 0; });
  }
  return false;
}

Status Refuse(std::string_view raw, const std::string& why) {
  std::string shown(raw.substr(0, 80));
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return InvalidArgument("host '" + shown + (raw.size() > 80 ? "...'" : "'") + ": " + why);
}

}  // namespace

Result<std::string> CanonicalHostname(std::string_view raw) {
  if (raw.empty()) return Refuse(raw, "empty hostname");
  for (char c : raw) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      return Refuse(raw, "non-ASCII hostname (send internationalised names as punycode xn--)");
    }
  }
  size_t colons = std::count(raw.begin(), raw.end(), ':');
  if (raw.front() == '[' || colons > 1) return Refuse(raw, "IP literal (IPv6) is not a hostname");
  if (colons == 1) return Refuse(raw, "':' (a port) is not part of a hostname");
  if (raw.find('@') != std::string_view::npos) return Refuse(raw, "userinfo ('@') is not allowed");
  for (char c : raw) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.';
    if (!ok) {
      return Refuse(raw, std::string("character '") +
                             (std::isprint(static_cast<unsigned char>(c)) ? std::string(1, c)
                                                                          : std::string("?")) +
                             "' is not allowed in a hostname");
    }
  }
  std::string name = AsciiLower(raw);
  // One trailing dot is the fully qualified spelling of the same name.
  if (name.back() == '.') name.pop_back();
  if (name.empty()) return Refuse(raw, "empty hostname");
  if (name.size() > kMaxHostnameLength) {
    return Refuse(raw, "hostname longer than " + std::to_string(kMaxHostnameLength) + " bytes");
  }
  std::vector<std::string_view> labels;
  std::string_view rest(name);
  for (;;) {
    size_t dot = rest.find('.');
    labels.push_back(rest.substr(0, dot));
    if (dot == std::string_view::npos) break;
    rest.remove_prefix(dot + 1);
  }
  for (std::string_view l : labels) {
    if (l.empty()) return Refuse(raw, "empty label");
    if (l.size() > kMaxLabelLength) {
      return Refuse(raw, "label longer than " + std::to_string(kMaxLabelLength) + " bytes");
    }
    if (l.front() == '-' || l.back() == '-') {
      return Refuse(raw, "label starts or ends with '-'");
    }
  }
  if (IsNumericLabel(labels.back())) {
    return Refuse(raw, "IP literal (numeric IPv4 in decimal, octal or hex form) is not a hostname");
  }
  return name;
}

}  // namespace trybox::egress
