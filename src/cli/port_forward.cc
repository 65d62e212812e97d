// trybox port (cli/terminal.h): a local TCP listener whose every connection is one `port`
// stream to the daemon, relayed with channel::RelaySocket until either side is done.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <iostream>
#include <thread>

#include "channel/socket_relay.h"
#include "cli/terminal.h"
#include "util/fd.h"
#include "util/utf8.h"

namespace trybox::cli {
namespace {

int g_stop_pipe[2] = {-1, -1};

void OnStop(int) {
  int saved = errno;
  (void)!::write(g_stop_pipe[1], "s", 1);
  errno = saved;
}

struct Listener {
  UniqueFd fd;
  std::string shown;  // ADDR:PORT as bound
};

Result<Listener> Listen(const HostAddress& a) {
  sockaddr_storage ss = {};
  socklen_t len;
  const bool v6 = a.host.find(':') != std::string::npos;
  if (v6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(static_cast<uint16_t>(a.port));
    ::inet_pton(AF_INET6, a.host.c_str(), &s6->sin6_addr);
    len = sizeof *s6;
  } else {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
    s4->sin_family = AF_INET;
    s4->sin_port = htons(static_cast<uint16_t>(a.port));
    ::inet_pton(AF_INET, a.host.c_str(), &s4->sin_addr);
    len = sizeof *s4;
  }
  Listener l;
  l.fd.Reset(::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!l.fd.valid()) return ErrnoError("socket");
  int one = 1;
  ::setsockopt(l.fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const std::string want = (v6 ? "[" + a.host + "]" : a.host) + ":" + std::to_string(a.port);
  if (::bind(l.fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return ErrnoError("listen on " + want);
  }
  if (::listen(l.fd.get(), 128) != 0) return ErrnoError("listen on " + want);
  len = sizeof ss;
  ::getsockname(l.fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
  int port = v6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  l.shown = (v6 ? "[" + a.host + "]" : a.host) + ":" + std::to_string(port);
  return l;
}

// One accepted connection, relayed to the VM's port until both sides are done.
void Forward(Client& client, const std::string& vm, int port, UniqueFd sock) {
  auto s = client.Open({{"verb", "port"}, {"vm", vm}, {"port", port}});
  if (!s.ok()) {
    std::cerr << "trybox: port " << port << ": " << OneLine(s.status().message()) << "\n";
    return;
  }
  auto r = channel::RelaySocket(**s, sock.get(), channel::RelaySide::kOpener);
  // The local client aborting its own connection is its business, not an error of ours.
  if (!r.socket_failure.ok()) return;
  Status st = r.end ? StatusFromReply(*r.end) : r.stream_failure;
  if (st.ok()) return;
  std::cerr << "trybox: port " << port << ": " << OneLine(st.message()) << "\n";
  // The local client sees the failure as a reset, not as an empty answer.
  linger hard = {1, 0};
  ::setsockopt(sock.get(), SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
}

Status CheckRunning(Client& client, const std::string& vm) {
  ASSIGN_OR_RETURN(Json r, client.Call({{"verb", "list"}}));
  if (r.contains("vms") && r["vms"].is_array()) {
    for (const auto& v : r["vms"]) {
      if (v.is_object() && v.value("id", Json()) == vm) {
        if (v.value("state", Json()) == "running") return Status::Ok();
        const Json state = v.value("state", Json());
        return FailedPrecondition("VM " + vm + " is " +
                                  (state.is_string() ? state.get<std::string>() : "?"));
      }
    }
  }
  return NotFound("no running VM with id " + vm);
}

}  // namespace

Result<HostAddress> ParseHostAddress(const std::string& s) {
  HostAddress a;
  std::string port;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find("]:");
    if (close == std::string::npos) return InvalidArgument("--host: expected [ADDR]:PORT");
    a.host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string::npos) return InvalidArgument("--host: expected ADDR:PORT");
    a.host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (a.host.find(':') != std::string::npos) {
      return InvalidArgument("--host: write an IPv6 address in brackets, [ADDR]:PORT");
    }
  }
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
    return InvalidArgument("--host: the port must be a number from 0 to 65535");
  }
  a.port = std::stoi(port);
  if (a.host == "localhost") a.host = "127.0.0.1";
  in_addr v4;
  in6_addr v6;
  if (::inet_pton(AF_INET, a.host.c_str(), &v4) == 1) {
    a.loopback = (ntohl(v4.s_addr) >> 24) == 127;
  } else if (::inet_pton(AF_INET6, a.host.c_str(), &v6) == 1) {
    a.loopback = IN6_IS_ADDR_LOOPBACK(&v6);
  } else {
    return InvalidArgument("--host: " + a.host.substr(0, 64) +
                           " is not a numeric IPv4 or IPv6 address");
  }
  return a;
}

int CmdPort(Client& client, const TerminalOptions& t, const std::string& vm) {
  HostAddress a{"127.0.0.1", t.guest_port, true};
  if (!t.host.empty()) {
    auto parsed = ParseHostAddress(t.host);
    if (!parsed.ok()) return Failed(parsed.status());
    a = *parsed;
  }
  Status running = CheckRunning(client, vm);
  if (!running.ok()) return Failed(running);
  auto l = Listen(a);
  if (!l.ok()) return Failed(l.status());
  if (::pipe2(g_stop_pipe, O_CLOEXEC) != 0) return Failed(ErrnoError("pipe2"));
  struct sigaction sa = {};
  sa.sa_handler = OnStop;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  if (!a.loopback) {
    std::cerr << "trybox: warning: " << l->shown
              << " is not a loopback address: other machines can reach port " << t.guest_port
              << " of VM " << vm << " through it\n";
  }
  std::cout << "forwarding " << l->shown << " -> VM " << vm << " port " << t.guest_port
            << " (Ctrl-C to stop)" << std::endl;
  for (;;) {
    pollfd p[2] = {{l->fd.get(), POLLIN, 0}, {g_stop_pipe[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return Failed(ErrnoError("poll"));
    }
    if (p[1].revents) return 0;
    int fd = ::accept4(l->fd.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the client gave up, or EMFILE: the next accept may do
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // Connections live until their peers are done or we exit; nothing joins them.
    std::thread(Forward, std::ref(client), vm, t.guest_port, UniqueFd(fd)).detach();
  }
}

}  // namespace trybox::cli
