#include "guest/egress.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <system_error>
#include <thread>

#include "util/log.h"
#include "util/tcp.h"

namespace trybox::guest {
namespace {

using channel::Stream;
using Kind = Stream::Message::Kind;
using Clock = std::chrono::steady_clock;

constexpr size_t kChunk = 256 * 1024;
constexpr int kAcceptRetryMs = 100;  // after a failed accept (EMFILE)
// After the host's END, unread client bytes are drained this long before the close, so the
// close does not turn into a RST that could destroy the answer the client has not read yet.
constexpr auto kDrainAfterEnd = std::chrono::seconds(1);

void Answer503(int fd, const std::string& why) {
  std::string body = "trybox egress: " + why + "\n";
  (void)WriteFull(fd, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
}

// The program sees its connection reset, not closed: what a refused connect() looks like
// once the kernel has already accepted it.
void ResetOnClose(int fd) {
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
}

// Host -> client: channel 1 to the socket. Sets `ended` on the host's END or RESET (and
// `reset` on a RESET) and writes a byte to `wake` so the upstream loop notices without
// polling on a timer.
// For a transparent connection a RESET leaves the socket alone: the caller closes it with a
// reset, and a FIN first would tell the program the host merely closed.
void Downstream(Stream& s, int fd, bool transparent, std::atomic<bool>& ended,
                std::atomic<bool>& reset, int wake) {
  auto finish = [&] {
    ended = true;
    (void)!::write(wake, "x", 1);
  };
  for (;;) {
    auto m = s.Next();
    if (!m.ok()) break;
    if (m->kind == Kind::kData && m->channel == channel::kChanOut) {
      if (!WriteFull(fd, m->data).ok()) {
        (void)s.Reset("the guest client closed its connection");
        break;
      }
    } else if (m->kind == Kind::kEof && m->channel == channel::kChanOut) {
      ::shutdown(fd, SHUT_WR);
    } else if (m->kind == Kind::kEnd) {
      ::shutdown(fd, SHUT_WR);
      finish();
      return;
    } else if (m->kind == Kind::kReset) {
      reset = true;
      if (transparent) {
        finish();
        return;
      }
      break;
    }
  }
  // The tunnel is gone without an orderly end: the client sees its connection close.
  ::shutdown(fd, SHUT_RDWR);
  finish();
}

}  // namespace

void RelayConnection(UniqueFd sock, std::shared_ptr<channel::Mux> mux, const channel::Json& request,
                     bool transparent) {
  auto fail = [&](const std::string& why) {
    if (transparent) {
      ResetOnClose(sock.get());
    } else {
      Answer503(sock.get(), why);
    }
  };
  if (!mux) return fail("no host session");
  auto opened = mux->Open(request);
  if (!opened.ok()) return fail("the host is not connected: " + opened.status().message());
  std::shared_ptr<Stream> s = std::move(*opened);
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) {
    (void)s->Reset("trybox-init: pipe2 failed");
    return;
  }
  UniqueFd wake_r(wake[0]), wake_w(wake[1]);
  std::atomic<bool> ended{false}, reset{false};
  std::thread down([&] { Downstream(*s, sock.get(), transparent, ended, reset, wake_w.get()); });
  // Client -> host: the socket to channel 0, until the client's EOF or the host's END.
  std::string buf(kChunk, '\0');
  bool open = true;
  std::optional<Clock::time_point> drain_until;
  for (;;) {
    if (reset && transparent) break;
    if (ended && !drain_until) drain_until = Clock::now() + kDrainAfterEnd;
    int timeout = -1;
    if (drain_until) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*drain_until - Clock::now());
      if (left.count() <= 0) break;
      timeout = static_cast<int>(left.count());
    }
    pollfd p[2] = {{sock.get(), POLLIN, 0}, {wake_r.get(), POLLIN, 0}};
    if (::poll(p, drain_until ? 1 : 2, timeout) <= 0) continue;
    if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;  // woken by the END
    auto n = ReadSome(sock.get(), buf.data(), buf.size());
    if (!n.ok() || *n == 0) {
      if (open && !ended) {
        if (n.ok()) {
          (void)s->CloseWrite(channel::kChanIn);
        } else {
          (void)s->Reset("the guest client aborted its connection");
        }
      }
      break;
    }
    if (open && !ended && !s->Write(channel::kChanIn, std::string_view(buf.data(), *n)).ok()) {
      open = false;  // the host is finished with this stream; keep draining until it says so
    }
  }
  down.join();
  if (reset && transparent) ResetOnClose(sock.get());
}

UniqueFd AcceptRetrying(int listen_fd) {
  for (;;) {
    auto c = AcceptTcp(listen_fd);
    if (c.ok()) return std::move(*c);
    LogError("egress", c.status().message());
    std::this_thread::sleep_for(std::chrono::milliseconds(kAcceptRetryMs));
  }
}

bool SpawnDetached(std::function<void()> f) {
  try {
    std::thread(std::move(f)).detach();
    return true;
  } catch (const std::system_error& e) {
    LogError("egress", std::string("cannot start a thread: ") + e.what());
    return false;
  }
}

Status StartEgressListener(CurrentMux current) {
  ASSIGN_OR_RETURN(TcpListener l, ListenTcpLoopback(kEgressPort));
  std::thread([l = std::move(l), current = std::move(current)] {
    for (;;) {
      UniqueFd sock = AcceptRetrying(l.fd.get());
      std::shared_ptr<channel::Mux> mux = current();
      // std::function needs a copyable callable: the socket travels as a shared_ptr.
      auto fd = std::make_shared<UniqueFd>(std::move(sock));
      SpawnDetached([fd, mux]() mutable {
        RelayConnection(std::move(*fd), std::move(mux), {{"op", "egress"}}, false);
      });
    }
  }).detach();
  return Status::Ok();
}

}  // namespace trybox::guest
