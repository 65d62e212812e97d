// How connections that ignore the proxy variables reach trybox-init
// (docs/protocol/egress.md, "Transparent egress"). The guest has no network card; this adds
//  - a `local` default route on lo, so that connect() to any IPv4 address does not fail
//    with "network unreachable" but is delivered inside the guest, and
//  - a BPF sk_lookup program attached to the guest's network namespace, which hands every
//    TCP connection to a non-loopback IPv4 address to one listening socket of trybox-init
//    (whose accept() then sees the address the program dialled as its local address), and
//    every UDP datagram to a non-loopback IPv4 address to one UDP socket of trybox-init,
//    which counts it (by the address it was sent to) and discards it.
// Loopback traffic (127.0.0.0/8, ::1) is untouched. No netfilter module and no userspace
// tool is needed: the program is a few dozen instructions assembled here, and the kernel's
// verifier checks it at load. Commands cannot undo it: they run without CAP_NET_ADMIN,
// CAP_BPF and CAP_SYS_ADMIN (guest/credentials.h).
#pragma once

#include <cstdint>
#include <string>

#include "util/fd.h"
#include "util/status.h"

namespace trybox::guest {

class Steering {
 public:
  // Adds the route, loads the program with `tcp_listener` (a bound, listening IPv4 TCP
  // socket) as the target of every steered connection and `udp_sink` (a bound IPv4 UDP
  // socket) of every steered datagram, and attaches it. Fails, naming the step, when the
  // kernel refuses any of it; nothing is left attached then.
  static Result<Steering> Install(int tcp_listener, int udp_sink);

 private:
  UniqueFd sockmap_;
  UniqueFd prog_;
  UniqueFd link_;
};

// "198.18.0.5" for an IPv4 address in host byte order.
std::string Ipv4Text(uint32_t host_order);

// The UDP sink's side: asks the kernel for each datagram's destination (IP_RECVORIGDSTADDR),
// then reads one datagram (MSG_DONTWAIT with `flags`) and returns where it was sent,
// "ip:port" ("unknown" if the kernel gave none). The payload is discarded.
Status AskForDestinations(int udp_sink);
Result<std::string> ReceiveSteered(int udp_sink, int flags = 0);

// The route alone: `local 0.0.0.0/0 dev lo` in the main table (an existing one is fine).
Status AddLocalDefaultRoute();

}  // namespace trybox::guest
