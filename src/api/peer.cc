#include "api/peer.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "util/fd.h"

namespace trybox::api {
namespace {

bool Addresses(int fd, sockaddr_storage* local, sockaddr_storage* peer) {
  socklen_t len = sizeof(*local);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(local), &len) != 0) return false;
  len = sizeof(*peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(peer), &len) != 0) return false;
  return local->ss_family == peer->ss_family &&
         (local->ss_family == AF_INET || local->ss_family == AF_INET6);
}

// Fills the port and address of `sa` into a sock_diag id's fields.
void Endpoint(const sockaddr_storage& sa, __be16* port, __be32* addr) {
  if (sa.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
    *port = in->sin_port;
    std::memcpy(addr, &in->sin_addr, sizeof(in->sin_addr));
  } else {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    *port = in6->sin6_port;
    std::memcpy(addr, &in6->sin6_addr, sizeof(in6->sin6_addr));
  }
}

}  // namespace

std::optional<uid_t> LocalPeerUid(int fd) {
  sockaddr_storage local{}, peer{};
  if (!Addresses(fd, &local, &peer)) return std::nullopt;
  UniqueFd nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl.valid()) return std::nullopt;
  // The client's socket: its source is our peer, its destination is us.
  struct {
    nlmsghdr head;
    inet_diag_req_v2 req;
  } ask{};
  ask.head.nlmsg_len = sizeof(ask);
  ask.head.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  ask.head.nlmsg_flags = NLM_F_REQUEST;
  ask.req.sdiag_family = static_cast<__u8>(local.ss_family);
  ask.req.sdiag_protocol = IPPROTO_TCP;
  ask.req.idiag_states = ~0u;
  Endpoint(peer, &ask.req.id.idiag_sport, ask.req.id.idiag_src);
  Endpoint(local, &ask.req.id.idiag_dport, ask.req.id.idiag_dst);
  ask.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  ask.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(nl.get(), &ask, sizeof(ask), 0, reinterpret_cast<sockaddr*>(&kernel),
               sizeof(kernel)) != static_cast<ssize_t>(sizeof(ask))) {
    return std::nullopt;
  }
  alignas(nlmsghdr) char buf[8192];
  const ssize_t n = ::recv(nl.get(), buf, sizeof(buf), 0);
  if (n < static_cast<ssize_t>(NLMSG_LENGTH(sizeof(inet_diag_msg)))) return std::nullopt;
  const auto* head = reinterpret_cast<const nlmsghdr*>(buf);
  if (!NLMSG_OK(head, static_cast<unsigned>(n)) || head->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
      head->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
    return std::nullopt;  // NLMSG_ERROR: no such socket (it closed already)
  }
  const auto* msg = static_cast<const inet_diag_msg*>(NLMSG_DATA(head));
  return static_cast<uid_t>(msg->idiag_uid);
}

std::string PeerKey(int fd) {
  if (const std::optional<uid_t> uid = LocalPeerUid(fd)) return "uid " + std::to_string(*uid);
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  char host[INET6_ADDRSTRLEN] = "unknown";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0) {
    if (peer.ss_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&peer)->sin_addr, host, sizeof(host));
    } else if (peer.ss_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr, host, sizeof(host));
    }
  }
  return std::string("address ") + host;
}

}  // namespace trybox::api
