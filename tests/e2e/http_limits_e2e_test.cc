// End to end: what `trybox serve` does with callers that show no key (issue 41, items 4, 6
// and 8), against a private tryboxd over real loopback sockets. No VM is started: the
// daemon's image directory is an empty one of the test's own, so that nothing here can
// build into (or from) the images the machine shares.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/process.h"
#include "util/tcp.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

constexpr size_t kUpload = size_t{64} << 20;  // the largest body POST /files takes

// A connection whose reads and writes give up after a minute, so that a server that never
// answers fails the test instead of hanging it.
UniqueFd Connect(uint16_t port) {
  auto fd = ConnectTcpLoopback(port);
  if (!fd.ok()) return UniqueFd();
  timeval tv{60, 0};
  ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd->get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return std::move(*fd);
}

bool SendAll(int fd, const std::string& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

std::string ReadToClose(int fd) {
  std::string out;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  return out;
}

// "VmRSS" or "VmHWM" of a process, in MiB.
double StatusMiB(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024;
  }
  return -1;
}

// The head of an upload of `kUpload` bytes to a sandbox, with a wrong token or none at all.
std::string UploadHead(bool with_sandbox) {
  std::string head = "POST /files?path=/tmp/big HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  if (with_sandbox) head += "E2b-Sandbox-Id: 0123456789ab\r\nX-Access-Token: wrong\r\n";
  return head +
         "Content-Type: application/octet-stream\r\nContent-Length: " + std::to_string(kUpload) +
         "\r\n\r\n";
}

class HttpLimitsE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto dir = TempDir::Make("/tmp", "tbx-noimages-");
    ASSERT_TRUE(dir.ok());
    images_ = new TempDir(std::move(*dir));
    auto h = Harness::Start({"TRYBOX_IMAGES=" + images_->path()});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    h_ = std::move(*h).release();
    CliResult s = h_->Cli({"serve", "--listen", "127.0.0.1:0"});
    ASSERT_EQ(s.code, 0) << s.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(s.out, m, std::regex("http://127\\.0\\.0\\.1:([0-9]+)")))
        << s.out;
    url_ = m[0];
    port_ = static_cast<uint16_t>(std::stoi(m[1]));
    CliResult k = h_->Cli({"api-key", "create", "limits", "--operator"});
    ASSERT_EQ(k.code, 0) << k.err;
    key_ = k.out.substr(0, k.out.find('\n'));
  }
  static void TearDownTestSuite() {
    delete h_;
    h_ = nullptr;
    delete images_;
    images_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(h_, nullptr); }

  // One request with the operator key, read to the server's close: the whole response.
  static std::string Call(const std::string& method, const std::string& path,
                          const std::string& body = "") {
    UniqueFd fd = Connect(port_);
    std::string req = method + " " + path +
                      " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                      "X-API-KEY: " + key_ + "\r\n";
    if (!body.empty()) {
      req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n";
    }
    if (!fd.valid() || !SendAll(fd.get(), req + "\r\n" + body)) return "";
    return ReadToClose(fd.get());
  }
  static std::string Body(const std::string& resp) {
    const size_t at = resp.find("\r\n\r\n");
    return at == std::string::npos ? "" : resp.substr(at + 4);
  }

  static inline Harness* h_ = nullptr;
  static inline TempDir* images_ = nullptr;
  static inline std::string url_;
  static inline std::string key_;
  static inline uint16_t port_ = 0;
};

// 41.4: uploads without a key were read whole (64 MiB each) before the key was checked.
TEST_F(HttpLimitsE2E, AnUploadWithoutCredentialsIsRefusedAtItsHeadAndItsBodyIsNeverRead) {
  // The head alone: the answer comes without a byte of the body.
  for (bool with_sandbox : {true, false}) {
    UniqueFd fd = Connect(port_);
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(SendAll(fd.get(), UploadHead(with_sandbox)));
    const std::string resp = ReadToClose(fd.get());
    EXPECT_EQ(resp.rfind("HTTP/1.1 401", 0), 0u) << with_sandbox << ": " << resp;
  }

  // Four senders of whole bodies at once: the daemon stops reading each after its head, so
  // none can send its body, and the daemon's memory stays where it was.
  const pid_t daemon = h_->daemon_pid();
  const double rss_before = StatusMiB(daemon, "VmRSS");
  constexpr int kSenders = 4;
  std::atomic<int> sent_whole{0};
  std::vector<size_t> sent(kSenders, 0);
  std::vector<std::thread> senders;
  for (int i = 0; i < kSenders; ++i) {
    senders.emplace_back([i, &sent, &sent_whole] {
      UniqueFd fd = Connect(port_);
      if (!fd.valid() || !SendAll(fd.get(), UploadHead(i % 2 == 0))) return;
      const std::string chunk(1 << 16, 'x');
      while (sent[i] < kUpload) {
        const ssize_t n = ::send(fd.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL);
        if (n <= 0) return;  // the daemon closed the connection
        sent[i] += static_cast<size_t>(n);
      }
      ++sent_whole;
    });
  }
  for (auto& t : senders) t.join();
  const double rss_after = StatusMiB(daemon, "VmRSS");
  const double peak = StatusMiB(daemon, "VmHWM");
  EXPECT_EQ(sent_whole, 0);
  for (int i = 0; i < kSenders; ++i) EXPECT_LT(sent[i], kUpload) << i;
  std::printf(
      "daemon RSS %.1f MiB before %d unauthenticated 64 MiB uploads, %.1f MiB after "
      "(peak of its life %.1f MiB); bytes each sender got into the socket: %zu %zu %zu "
      "%zu\n",
      rss_before, kSenders, rss_after, peak, sent[0], sent[1], sent[2], sent[3]);
  RecordProperty("rss_before_mib", std::to_string(rss_before));
  RecordProperty("rss_after_mib", std::to_string(rss_after));
}

// 41.6: seventy half-sent heads filled the 64 connections, and a request with a key waited.
TEST_F(HttpLimitsE2E, SeventyHalfSentHeadsDoNotKeepCurlWithAKeyOut) {
  std::vector<UniqueFd> half;
  for (int i = 0; i < 70; ++i) {
    half.push_back(Connect(port_));
    ASSERT_TRUE(half.back().valid()) << i;
    ASSERT_TRUE(SendAll(half.back().get(), "GET /sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-AP"));
  }
  // --max-time only ends a run that would otherwise hang: the daemon closes idle
  // connections after 60 s, which once let the request in late.
  CliResult r =
      RunProgram({FindInPath("curl").value_or("curl"), "-sS", "--max-time", "45", "-o", "-", "-w",
                  "\n%{http_code}", "-H", "X-API-KEY: " + key_, url_ + "/sandboxes"},
                 h_->Env());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.substr(r.out.rfind('\n') + 1), "200") << r.out << r.err;
  EXPECT_EQ(r.out.substr(0, r.out.rfind('\n')), "[]") << r.out;
}

// 41.8: `--rebuild-rootfs` as an image name reached `trybox image build` as an option.
TEST_F(HttpLimitsE2E, AnImageBuildNamedLikeAnOptionIs400NamingTheRule) {
  for (const char* name : {"--rebuild-rootfs", "-f"}) {
    const std::string body =
        Json{{"name", name}, {"recipe", {{"from", "debian-12"}, {"check", {"true"}}}}}.dump();
    const std::string resp = Call("POST", "/trybox/v1/image-builds", body);
    EXPECT_EQ(resp.rfind("HTTP/1.1 400", 0), 0u) << resp;
    EXPECT_NE(resp.find("does not start with '-'"), std::string::npos) << resp;
  }
  Json builds = Json::parse(Body(Call("GET", "/trybox/v1/image-builds")), nullptr, false);
  EXPECT_EQ(builds.value("builds", Json()), Json::array()) << builds.dump();

  // A name that passes reaches the real CLI after "--", which takes it as the name: the
  // build gets as far as the recipe's base, which this daemon's empty image directory lacks.
  const std::string started = Call(
      "POST", "/trybox/v1/image-builds",
      Json{{"name", "limits-probe"}, {"recipe", {{"from", "no-such-base"}, {"check", {"true"}}}}}
          .dump());
  ASSERT_EQ(started.rfind("HTTP/1.1 202", 0), 0u) << started;
  const std::string id = Json::parse(Body(started), nullptr, false)["build"].value("id", "");
  ASSERT_FALSE(id.empty()) << started;
  const std::string events = Call("GET", "/trybox/v1/image-builds/" + id + "/events");
  EXPECT_NE(events.find("event: end"), std::string::npos) << events;
  EXPECT_NE(events.find("no-such-base"), std::string::npos) << events;
  EXPECT_EQ(events.find("not expected"), std::string::npos) << events;
}

}  // namespace
}  // namespace trybox::e2e
