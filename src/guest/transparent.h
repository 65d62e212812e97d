// Egress for programs that ignore the proxy variables (docs/protocol/egress.md,
// "Transparent egress"): trybox-init's resolver, its listener for steered connections and
// its sink for steered UDP.
//  - DNS on 127.0.0.53:53 (UDP; /etc/resolv.conf names it): each question is asked of the
//    host ({"op":"resolve"}), which decides by name with the same policy as every
//    connection; an allowed name gets an address from a private pool (guest/dns.h), a
//    refused one NXDOMAIN.
//  - Every TCP connection to a non-loopback IPv4 address lands on one listener
//    (guest/steer.h); the address dialled maps back to its name (or is sent as the IP
//    literal it is, which the host refuses), and the connection becomes an egress stream
//    {"op":"egress","target":{"host":H,"port":P}} carrying raw bytes.
//  - Every UDP datagram to a non-loopback IPv4 address is discarded and reported to the
//    host ({"op":"udp"}), which records it.
#pragma once

#include <cstdint>

#include "guest/egress.h"
#include "util/status.h"

namespace trybox::guest {

inline constexpr uint16_t kTransparentPort = 3129;
inline constexpr uint16_t kUdpSinkPort = 3130;
inline constexpr const char* kResolverAddress = "127.0.0.53";

// Binds the sockets, installs the steering and writes /etc/resolv.conf, then serves each on
// a detached thread. On an error nothing is steered and resolv.conf is left alone: programs
// that use the proxy variables still get out.
Status StartTransparentEgress(CurrentMux current);

}  // namespace trybox::guest
