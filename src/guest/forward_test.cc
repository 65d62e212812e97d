// The port request over a real Mux on a socketpair, to real TCP servers on loopback: bytes
// both ways, half-close each way, a refused connection, a host reset.
#include "guest/forward.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <functional>
#include <thread>

#include "util/fd.h"
#include "util/tcp.h"

namespace trybox::guest {
namespace {

using channel::Json;
using channel::Mux;
using channel::Stream;
using Kind = Stream::Message::Kind;

class Forwarder {
 public:
  Forwarder() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    host_ = std::make_unique<Mux>(UniqueFd(sv[0]), channel::Role::kHost);
    guest_ = std::make_unique<Mux>(UniqueFd(sv[1]), channel::Role::kGuest);
    guest_->OnOpen([](std::shared_ptr<Stream> s, Json req) { ServePort(*s, req); });
    guest_->Start();
    host_->Start();
  }
  std::shared_ptr<Stream> Open(int port) { return *host_->Open({{"op", "port"}, {"port", port}}); }

 private:
  std::unique_ptr<Mux> host_, guest_;
};

struct Received {
  std::string out;
  bool eof = false;
  Json end;
};

// Reads until the END (or RESET), or until EOF 1 when `until_eof`.
Received Read(Stream& s, bool until_eof = false) {
  Received r;
  for (;;) {
    auto m = s.Next(std::chrono::steady_clock::now() + std::chrono::seconds(30));
    if (!m.ok()) return r;
    if (m->kind == Kind::kData) r.out += m->data;
    if (m->kind == Kind::kEof && m->channel == channel::kChanOut) {
      r.eof = true;
      if (until_eof) return r;
    }
    if (m->kind == Kind::kEnd || m->kind == Kind::kReset) {
      r.end = m->body;
      return r;
    }
  }
}

// A loopback server for one connection: `serve` runs on it in a thread, joined by Join().
class OneConnection {
 public:
  explicit OneConnection(std::function<void(int fd)> serve) {
    auto l = ListenTcpLoopback(0);
    EXPECT_TRUE(l.ok());
    port_ = l->port;
    thread_ = std::thread([l = std::move(*l), serve = std::move(serve)] {
      auto c = AcceptTcp(l.fd.get());
      if (c.ok()) serve(c->get());
    });
  }
  ~OneConnection() { Join(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  uint16_t port() const { return port_; }

 private:
  uint16_t port_ = 0;
  std::thread thread_;
};

std::string ReadAll(int fd) {
  std::string all;
  char buf[65536];
  for (;;) {
    auto n = ReadSome(fd, buf, sizeof buf);
    if (!n.ok() || *n == 0) return all;
    all.append(buf, *n);
  }
}

TEST(PortForwardTest, RelaysBothWaysAndTheClientsHalfCloseReachesTheServer) {
  // Answers only once the client has finished sending: it needs the half-close.
  OneConnection server([](int fd) {
    std::string got = ReadAll(fd);
    EXPECT_TRUE(WriteFull(fd, "got " + std::to_string(got.size()) + " bytes").ok());
  });
  Forwarder f;
  auto s = f.Open(server.port());
  const std::string big(3 << 20, 'x');  // more than a frame, less than the window
  ASSERT_TRUE(s->Write(channel::kChanIn, big).ok());
  ASSERT_TRUE(s->CloseWrite(channel::kChanIn).ok());
  Received r = Read(*s);
  server.Join();
  EXPECT_EQ(r.out, "got 3145728 bytes");
  EXPECT_TRUE(r.eof);
  EXPECT_EQ(r.end.value("ok", false), true) << r.end.dump();
  EXPECT_EQ(r.end.value("bytes_in", -1), 3 << 20);
  EXPECT_EQ(r.end.value("bytes_out", -1), 17);
}

TEST(PortForwardTest, AServerThatClosesFirstStillGetsTheClientsLastBytes) {
  std::string server_got;
  OneConnection server([&](int fd) {
    EXPECT_TRUE(WriteFull(fd, "hello").ok());
    ::shutdown(fd, SHUT_WR);
    server_got = ReadAll(fd);
  });
  Forwarder f;
  auto s = f.Open(server.port());
  Received first = Read(*s, /*until_eof=*/true);
  EXPECT_EQ(first.out, "hello");
  EXPECT_TRUE(first.eof);
  EXPECT_TRUE(first.end.is_null()) << "ended before the client finished: " << first.end.dump();
  ASSERT_TRUE(s->Write(channel::kChanIn, "bye").ok());
  ASSERT_TRUE(s->CloseWrite(channel::kChanIn).ok());
  Received rest = Read(*s);
  server.Join();
  EXPECT_EQ(server_got, "bye");
  EXPECT_EQ(rest.end.value("ok", false), true) << rest.end.dump();
}

TEST(PortForwardTest, ARefusedConnectionIsItsOwnErrorNamingThePort) {
  uint16_t port;
  {
    auto l = ListenTcpLoopback(0);
    ASSERT_TRUE(l.ok());
    port = l->port;
  }  // closed: nothing listens there now
  Forwarder f;
  auto s = f.Open(port);
  Received r = Read(*s);
  EXPECT_EQ(r.end.value("ok", true), false) << r.end.dump();
  EXPECT_EQ(r.end.value("error", ""), "connect_failed");
  EXPECT_NE(r.end.value("message", "").find(std::to_string(port)), std::string::npos);
}

TEST(PortForwardTest, AHostResetClosesTheServersConnection) {
  std::string server_got;
  // ReadAll returns once the guest closes the connection.
  OneConnection server([&](int fd) { server_got = ReadAll(fd); });
  Forwarder f;
  auto s = f.Open(server.port());
  ASSERT_TRUE(s->Write(channel::kChanIn, "partial").ok());
  ASSERT_TRUE(s->Reset("the client went away").ok());
  server.Join();
  EXPECT_EQ(server_got, "partial");
}

TEST(PortForwardTest, ABadPortIsABadRequest) {
  Forwarder f;
  auto s = f.Open(0);
  Received r = Read(*s);
  EXPECT_EQ(r.end.value("error", ""), "bad_request") << r.end.dump();
}

}  // namespace
}  // namespace trybox::guest
