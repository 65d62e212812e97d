// Hostname syntax for the egress proxy. The guest is untrusted, so every name it sends is
// checked here before anything is matched or resolved.
#pragma once

#include <string>
#include <string_view>

#include "util/status.h"

namespace trybox::egress {

inline constexpr size_t kMaxHostnameLength = 253;
inline constexpr size_t kMaxLabelLength = 63;

// The canonical form of `raw`: lowercase ASCII, one trailing dot removed. Refused (with a
// reason naming the rule) unless it is a DNS hostname of letters, digits and hyphens:
//  - IP literals in every spelling: dotted v4, decimal ("2130706433"), octal ("0177.1"),
//    hex ("0x7f.1"), short forms ("127.1"), bracketed or bare IPv6;
//  - userinfo ("a@b"), paths, ports, percent-encoding, whitespace, any other punctuation;
//  - non-ASCII (IDNs must arrive as punycode "xn--...");
//  - empty labels, labels over 63 bytes or starting/ending with '-', names over 253 bytes.
Result<std::string> CanonicalHostname(std::string_view raw);

}  // namespace trybox::egress
