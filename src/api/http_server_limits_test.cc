// HttpServer against clients that show no credentials (issue 41, items 4 and 6): the gate
// answers at the head, before any body is read; half-sent heads cannot keep out a request
// with a key; a head that does not come in time, or a peer with too many connections, loses
// its connection. Real sockets on loopback; the gate stands in for the daemon's key check.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "api/http_server.h"
#include "api/peer.h"
#include "util/mutex.h"
#include "util/tcp.h"

namespace trybox::api {
namespace {

// A request with header `X-Key: good` is proven; one without, to a path under /open, is
// admitted unproven; any other is refused with 401.
Admission Gate(const HttpRequest& r) {
  if (r.Header("x-key") == "good") return {std::nullopt, true, 1 << 20};
  if (r.path.rfind("/open", 0) == 0) return {std::nullopt, false, 16};
  return {JsonError(401, "no key"), false, 0};
}

// A connection whose reads give up after a minute, so that a server that never answers
// fails the test instead of hanging it.
UniqueFd Connect(uint16_t port) {
  auto fd = ConnectTcpLoopback(port);
  if (!fd.ok()) return UniqueFd();
  timeval tv{60, 0};
  ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return std::move(*fd);
}

bool SendAll(int fd, const std::string& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Everything until the server closes; "timeout" if it did not within the minute.
std::string ReadToClose(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return out + "timeout";
    return out;
  }
}

// Whether the server has closed `fd` (its end readable: EOF or a reset) without waiting.
bool ClosedNow(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

class HttpServerLimitsTest : public ::testing::Test {
 protected:
  void Start(const HttpLimits& limits) {
    auto s = HttpServer::Start(
        {"127.0.0.1", 0}, limits,
        [this](const HttpRequest& r) {
          ++calls_;
          if (r.path == "/hold") {
            MutexLock lock(mu_);
            held_ = true;
            changed_.SignalAll();
            while (!release_) changed_.Wait(mu_);
          }
          return HttpResponse{200, "text/plain", {}, "served " + r.path};
        },
        [this](const HttpRequest& r) {
          ++gated_;
          return Gate(r);
        });
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
  }

  std::unique_ptr<HttpServer> server_;
  std::atomic<int> calls_{0};
  std::atomic<int> gated_{0};
  Mutex mu_;
  CondVar changed_;
  bool held_ GUARDED_BY(mu_) = false;
  bool release_ GUARDED_BY(mu_) = false;
};

TEST_F(HttpServerLimitsTest, ARefusedRequestIsAnsweredAtItsHeadWithoutItsBody) {
  Start({});
  UniqueFd fd = Connect(server_->port());
  ASSERT_TRUE(fd.valid());
  // The head of a 64 MiB upload, and not a byte of the body: the answer comes anyway.
  ASSERT_TRUE(SendAll(fd.get(),
                      "POST /files HTTP/1.1\r\nHost: h\r\nContent-Type: application/octet-stream"
                      "\r\nContent-Length: 67108864\r\n\r\n"));
  const std::string resp = ReadToClose(fd.get());
  EXPECT_EQ(resp.rfind("HTTP/1.1 401", 0), 0u) << resp;
  EXPECT_NE(resp.find("no key"), std::string::npos) << resp;
  EXPECT_EQ(calls_, 0);
  EXPECT_EQ(gated_, 1);
}

TEST_F(HttpServerLimitsTest, TheGateChoosesTheBodyLimit) {
  Start({});
  for (const auto& [head, status] : std::vector<std::pair<std::string, std::string>>{
           {"POST /open HTTP/1.1\r\nContent-Length: 17\r\n", "413"},
           {"POST /open HTTP/1.1\r\nContent-Length: 16\r\n", "200"},
           {"POST /x HTTP/1.1\r\nX-Key: good\r\nContent-Length: 1000\r\n", "200"}}) {
    UniqueFd fd = Connect(server_->port());
    ASSERT_TRUE(fd.valid());
    const size_t length = std::stoul(head.substr(head.find("Length: ") + 8));
    ASSERT_TRUE(SendAll(fd.get(), head + "Host: h\r\nConnection: close\r\n\r\n" +
                                      std::string(status == "413" ? 0 : length, 'x')));
    const std::string resp = ReadToClose(fd.get());
    EXPECT_EQ(resp.rfind("HTTP/1.1 " + status, 0), 0u) << head << resp;
  }
}

// 41.6: seventy half-sent heads once filled the cap of 64, and a request with a key waited.
TEST_F(HttpServerLimitsTest, HalfSentHeadsCannotKeepOutARequestWithAKey) {
  HttpLimits limits;
  limits.max_connections = 12;
  limits.reserved_connections = 4;  // at most 8 unproven
  limits.max_unproven_per_peer = 12;
  limits.head_timeout_s = 3600;  // only the caps are at work here
  Start(limits);
  std::vector<UniqueFd> half;
  for (int i = 0; i < 70; ++i) {
    half.push_back(Connect(server_->port()));
    ASSERT_TRUE(half.back().valid());
    ASSERT_TRUE(SendAll(half.back().get(), "GET /sandboxes HTTP/1.1\r\nHost: h\r\nX-Ke"));
  }
  UniqueFd keyed = Connect(server_->port());
  ASSERT_TRUE(keyed.valid());
  ASSERT_TRUE(SendAll(
      keyed.get(), "GET /keyed HTTP/1.1\r\nHost: h\r\nX-Key: good\r\nConnection: close\r\n\r\n"));
  const std::string resp = ReadToClose(keyed.get());
  EXPECT_EQ(resp.rfind("HTTP/1.1 200", 0), 0u) << resp;
  EXPECT_NE(resp.find("served /keyed"), std::string::npos) << resp;
  // The oldest heads made room, the newest wait on: when the keyed connection came, 8
  // unproven ones were kept, and one more went for it.
  for (int i = 0; i < 63; ++i) EXPECT_NE(ReadToClose(half[i].get()), "timeout") << i;
  for (int i = 63; i < 70; ++i) EXPECT_FALSE(ClosedNow(half[i].get())) << i;
  EXPECT_EQ(calls_, 1);
}

TEST_F(HttpServerLimitsTest, AConnectionServingAKeyedRequestIsNeverCut) {
  HttpLimits limits;
  limits.max_connections = 8;
  limits.reserved_connections = 4;
  limits.head_timeout_s = 3600;
  Start(limits);
  UniqueFd held = Connect(server_->port());
  ASSERT_TRUE(held.valid());
  ASSERT_TRUE(SendAll(held.get(),
                      "GET /hold HTTP/1.1\r\nHost: h\r\nX-Key: good\r\nConnection: close\r\n\r\n"));
  {
    MutexLock lock(mu_);
    while (!held_) changed_.Wait(mu_);
  }
  std::vector<UniqueFd> half;
  for (int i = 0; i < 20; ++i) {
    half.push_back(Connect(server_->port()));
    ASSERT_TRUE(SendAll(half.back().get(), "GET / HTTP/1.1\r\nHo"));
  }
  // The last of them was accepted (so every cut that its arrival made was made) once its
  // oldest neighbours are closed.
  for (int i = 0; i < 16; ++i) EXPECT_NE(ReadToClose(half[i].get()), "timeout") << i;
  EXPECT_FALSE(ClosedNow(held.get()));
  {
    MutexLock lock(mu_);
    release_ = true;
    changed_.SignalAll();
  }
  EXPECT_NE(ReadToClose(held.get()).find("served /hold"), std::string::npos);
}

TEST_F(HttpServerLimitsTest, AHeadThatDoesNotComeInTimeLosesItsConnection) {
  HttpLimits limits;
  limits.head_timeout_s = 1;
  Start(limits);
  UniqueFd slow = Connect(server_->port());
  ASSERT_TRUE(slow.valid());
  ASSERT_TRUE(SendAll(slow.get(), "POST /x HTTP/1.1\r\nHost: h\r\n"));
  const std::string cut = ReadToClose(slow.get());
  EXPECT_EQ(cut.find("timeout"), std::string::npos) << cut;
  EXPECT_EQ(cut.find("HTTP/1.1 2"), std::string::npos) << cut;
  // A kept-alive connection waits for its next head on the same terms.
  UniqueFd kept = Connect(server_->port());
  ASSERT_TRUE(kept.valid());
  ASSERT_TRUE(SendAll(kept.get(), "GET /a HTTP/1.1\r\nHost: h\r\nX-Key: good\r\n\r\n"));
  const std::string resp = ReadToClose(kept.get());
  EXPECT_EQ(resp.rfind("HTTP/1.1 200", 0), 0u) << resp;
  EXPECT_NE(resp.find("served /a"), std::string::npos) << resp;
  EXPECT_EQ(resp.find("timeout"), std::string::npos) << resp;
  EXPECT_EQ(gated_, 1);
  EXPECT_EQ(calls_, 1);
}

TEST(PeerTest, TheUidOfALocalClientIsItsSocketsOwner) {
  auto listener = ListenTcpLoopback(0);
  ASSERT_TRUE(listener.ok());
  auto client = ConnectTcpLoopback(listener->port);
  ASSERT_TRUE(client.ok());
  auto accepted = AcceptTcp(listener->fd.get());
  ASSERT_TRUE(accepted.ok());
  EXPECT_EQ(LocalPeerUid(accepted->get()), ::geteuid());
  EXPECT_EQ(PeerKey(accepted->get()), "uid " + std::to_string(::geteuid()));
  if (::geteuid() != 0) GTEST_SKIP() << "another uid's client needs root to make";
  // A client of another user (nobody) is told apart.
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(listener->port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // system calls only: the parent may have threads
    ::close(ready[0]);
    if (::setuid(65534) != 0) ::_exit(1);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) ::_exit(2);
    char c = 0;
    (void)!::write(ready[1], "x", 1);
    (void)!::read(fd, &c, 1);  // until the parent closes its end
    ::_exit(0);
  }
  ::close(ready[1]);
  auto other = AcceptTcp(listener->fd.get());
  ASSERT_TRUE(other.ok());
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  EXPECT_EQ(LocalPeerUid(other->get()), uid_t{65534});
  other->Reset();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace trybox::api
