#include "egress/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>
#include <cstring>

namespace trybox::egress {
namespace {

bool In(uint32_t a, uint32_t net, int bits) {
  uint32_t mask = bits == 0 ? 0 : ~uint32_t{0} << (32 - bits);
  return (a & mask) == (net & mask);
}

constexpr uint32_t V4(int a, int b, int c, int d) {
  return static_cast<uint32_t>(a) << 24 | static_cast<uint32_t>(b) << 16 |
         static_cast<uint32_t>(c) << 8 | static_cast<uint32_t>(d);
}

AddressClass ClassifyV4(uint32_t a) {
  for (uint32_t m :
       {V4(169, 254, 169, 254), V4(169, 254, 170, 2), V4(100, 100, 100, 200), V4(192, 0, 0, 192)}) {
    if (a == m) return AddressClass::kMetadata;
  }
  if (a == V4(255, 255, 255, 255)) return AddressClass::kBroadcast;
  if (In(a, V4(0, 0, 0, 0), 8)) return AddressClass::kUnspecified;
  if (In(a, V4(127, 0, 0, 0), 8)) return AddressClass::kLoopback;
  if (In(a, V4(10, 0, 0, 0), 8) || In(a, V4(172, 16, 0, 0), 12) || In(a, V4(192, 168, 0, 0), 16)) {
    return AddressClass::kPrivate;
  }
  if (In(a, V4(169, 254, 0, 0), 16)) return AddressClass::kLinkLocal;
  if (In(a, V4(100, 64, 0, 0), 10)) return AddressClass::kCgnat;
  if (In(a, V4(224, 0, 0, 0), 4)) return AddressClass::kMulticast;
  if (In(a, V4(240, 0, 0, 0), 4) || In(a, V4(192, 0, 0, 0), 24) || In(a, V4(192, 0, 2, 0), 24) ||
      In(a, V4(198, 18, 0, 0), 15) || In(a, V4(198, 51, 100, 0), 24) ||
      In(a, V4(203, 0, 113, 0), 24) || In(a, V4(192, 88, 99, 0), 24)) {
    return AddressClass::kReserved;
  }
  return AddressClass::kPublic;
}

uint32_t V4At(const uint8_t* b) {
  return static_cast<uint32_t>(b[0]) << 24 | static_cast<uint32_t>(b[1]) << 16 |
         static_cast<uint32_t>(b[2]) << 8 | b[3];
}

AddressClass ClassifyV6(const uint8_t* b) {
  static const uint8_t kZero[16] = {};
  static const uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static const uint8_t kNat64Prefix[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  static const uint8_t kEc2Metadata[16] = {0xfd, 0, 0x0e, 0xc2, 0, 0, 0,    0,
                                           0,    0, 0,    0,    0, 0, 0x02, 0x54};
  if (std::memcmp(b, kZero, 16) == 0) return AddressClass::kUnspecified;
  if (std::memcmp(b, kZero, 15) == 0 && b[15] == 1) return AddressClass::kLoopback;
  if (std::memcmp(b, kMappedPrefix, 12) == 0) return ClassifyV4(V4At(b + 12));
  if (std::memcmp(b, kNat64Prefix, 12) == 0) return ClassifyV4(V4At(b + 12));
  // ::a.b.c.d, the deprecated v4-compatible form: no legitimate destination uses it.
  if (std::memcmp(b, kZero, 12) == 0) return AddressClass::kReserved;
  if (std::memcmp(b, kEc2Metadata, 16) == 0) return AddressClass::kMetadata;
  if (b[0] == 0xff) return AddressClass::kMulticast;
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return AddressClass::kLinkLocal;
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return AddressClass::kPrivate;
  if ((b[0] & 0xfe) == 0xfc) return AddressClass::kPrivate;
  if (b[0] == 0x20 && b[1] == 0x02) return ClassifyV4(V4At(b + 2));  // 6to4
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0) {      // Teredo 2001::/32
    return AddressClass::kReserved;
  }
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8) {  // documentation
    return AddressClass::kReserved;
  }
  if ((b[0] & 0xe0) != 0x20) return AddressClass::kReserved;  // outside 2000::/3
  return AddressClass::kPublic;
}

}  // namespace

const char* AddressClassName(AddressClass c) {
  switch (c) {
    case AddressClass::kPublic:
      return "public";
    case AddressClass::kUnspecified:
      return "unspecified";
    case AddressClass::kLoopback:
      return "loopback";
    case AddressClass::kPrivate:
      return "private";
    case AddressClass::kLinkLocal:
      return "link-local";
    case AddressClass::kCgnat:
      return "CGNAT";
    case AddressClass::kMulticast:
      return "multicast";
    case AddressClass::kBroadcast:
      return "broadcast";
    case AddressClass::kMetadata:
      return "cloud metadata";
    case AddressClass::kReserved:
      return "reserved";
  }
  return "unknown";
}

AddressClass Classify(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    return ClassifyV4(ntohl(reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr));
  }
  if (a.ss_family == AF_INET6) {
    return ClassifyV6(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr.s6_addr);
  }
  return AddressClass::kReserved;
}

std::string FormatAddress(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(v4->sin_port));
  }
  if (a.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(v6->sin6_port));
  }
  return "?";
}

}  // namespace trybox::egress
