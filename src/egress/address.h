// Classifies the address egress is about to dial. Only kPublic may be dialled unless the
// operator's override names the exact address and port.
#pragma once

#include <sys/socket.h>

#include <string>

namespace trybox::egress {

enum class AddressClass {
  kPublic,
  kUnspecified,  // 0.0.0.0/8, ::
  kLoopback,     // 127/8, ::1
  kPrivate,      // RFC 1918, fc00::/7 (ULA), fec0::/10 (site-local)
  kLinkLocal,    // 169.254/16, fe80::/10
  kCgnat,        // 100.64/10
  kMulticast,    // 224/4, ff00::/8
  kBroadcast,    // 255.255.255.255
  kMetadata,     // cloud instance metadata: 169.254.169.254, 169.254.170.2, 100.100.100.200,
                 // 192.0.0.192, fd00:ec2::254
  kReserved,     // documentation, benchmarking, 240/4, IETF 192.0.0/24, Teredo, v4-compatible,
                 // anything outside 2000::/3
};

const char* AddressClassName(AddressClass c);

// v4-mapped (::ffff:a.b.c.d), NAT64 (64:ff9b::/96) and 6to4 (2002::/16) addresses are
// classified by the IPv4 address they carry.
AddressClass Classify(const sockaddr_storage& a);

// "1.2.3.4:443" or "[2001:db8::1]:443".
std::string FormatAddress(const sockaddr_storage& a);

}  // namespace trybox::egress
