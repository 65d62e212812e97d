#include "util/tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace trybox {
namespace {

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

}  // namespace

Result<TcpListener> ListenTcpLoopback(uint16_t port, int backlog) {
  TcpListener l;
  l.fd.Reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!l.fd.valid()) return ErrnoError("socket");
  int one = 1;
  ::setsockopt(l.fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = Loopback(port);
  if (::bind(l.fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    return ErrnoError("bind 127.0.0.1:" + std::to_string(port));
  }
  if (::listen(l.fd.get(), backlog) != 0) return ErrnoError("listen");
  socklen_t len = sizeof a;
  ::getsockname(l.fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  l.port = ntohs(a.sin_port);
  return l;
}

Result<UniqueFd> AcceptTcp(int listen_fd) {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return UniqueFd(fd);
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    return ErrnoError("accept");
  }
}

Result<UniqueFd> ConnectTcpLoopback(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket");
  sockaddr_in a = Loopback(port);
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) break;
    if (errno == EINTR) continue;
    return ErrnoError("connect 127.0.0.1:" + std::to_string(port));
  }
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace trybox
