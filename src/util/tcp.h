// Loopback TCP: the guest's egress listener, and the local upstreams of tests and benchmarks.
#pragma once

#include <cstdint>
#include <string>

#include "util/fd.h"
#include "util/status.h"

namespace trybox {

struct TcpListener {
  UniqueFd fd;
  uint16_t port = 0;  // the bound port (useful after binding port 0)
};

// Listens on 127.0.0.1:`port` (0 picks a free port), SO_REUSEADDR, close-on-exec.
Result<TcpListener> ListenTcpLoopback(uint16_t port, int backlog = 512);
// Blocking accept, EINTR retried.
Result<UniqueFd> AcceptTcp(int listen_fd);
// Connects to 127.0.0.1:`port`, TCP_NODELAY.
Result<UniqueFd> ConnectTcpLoopback(uint16_t port);

}  // namespace trybox
