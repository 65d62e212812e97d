// RelayHttp2 between a test HTTP/2 client (tests/h2/h2_client.h: nghttp2's client session, the
// library curl uses) and test upstreams. The guest's side is a real socketpair wrapped in FdStream;
// every upstream connection the relay dials is another socketpair, whose far end the test reads raw
// HTTP/1.1 from and answers. The relay runs on its own thread.
#include "egress/intercept_h2.h"

#include <gtest/gtest.h>
#include <nghttp2/nghttp2.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "egress/intercept_test_util.h"
#include "tests/h2/h2_client.h"
#include "util/fd.h"

namespace trybox::egress {
namespace {

constexpr char kHost[] = "api.test";
constexpr char kValue[] = "sk-live-0123456789abcdefXYZ";

using Fields = std::vector<std::pair<std::string, std::string>>;

using h2test::Fields;
using h2test::H2Response;

// The shared client (tests/h2/h2_client.h) with its failures turned into test failures.
class TestClient {
 public:
  explicit TestClient(int fd) : stream_(fd), c_(stream_, std::chrono::milliseconds(kStuckMs)) {}

  int32_t Submit(const std::string& method, const std::string& path, Fields fields = {},
                 std::optional<std::string> body = std::nullopt,
                 const std::string& authority = kHost, const std::string& scheme = "https") {
    auto id = c_.Submit(method, path, std::move(fields), std::move(body), authority, scheme);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : -1;
  }
  H2Response Wait(int32_t id) {
    auto r = c_.Wait(id);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : H2Response{};
  }
  void WaitForBody(int32_t id, size_t n) { EXPECT_TRUE(c_.WaitForBody(id, n).ok()); }
  void Reset(int32_t id) { EXPECT_TRUE(c_.Reset(id).ok()); }
  void SendRaw(std::string_view b) { EXPECT_TRUE(c_.SendRaw(b).ok()); }
  bool PumpOnce() {
    auto more = c_.PumpOnce();
    return more.ok() && *more;
  }
  bool goaway() const { return c_.goaway(); }

 private:
  FdStream stream_;
  h2test::H2Client c_;
};

// A socket end the relay owns as its upstream connection.
class OwnedFdStream : public ByteStream {
 public:
  explicit OwnedFdStream(UniqueFd fd) : fd_(std::move(fd)), stream_(fd_.get()) {}
  Result<std::string> Read(size_t max,
                           std::optional<std::chrono::steady_clock::time_point> d) override {
    return stream_.Read(max, d);
  }
  Status Write(std::string_view data) override { return stream_.Write(data); }
  Status CloseWrite() override { return stream_.CloseWrite(); }
  void Abort() override { stream_.Abort(); }

 private:
  UniqueFd fd_;
  FdStream stream_;
};

class InterceptH2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ::signal(SIGPIPE, SIG_IGN); }

  void Start(std::vector<SecretInput> inputs, std::vector<std::string> rules = {},
             InterceptLimits limits = {}) {
    MakeSecretsAndRules(std::move(inputs), rules, &secrets_, &rules_);
    if (HasFatalFailure()) return;
    int g[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, g), 0);
    guest_.Reset(g[0]);
    relay_guest_.Reset(g[1]);
    guest_stream_ = std::make_unique<FdStream>(g[1]);
    dial_ = [this]() -> Result<std::unique_ptr<ByteStream>> {
      std::lock_guard<std::mutex> l(mu_);
      ++dials_;
      if (!dial_error_.empty()) return Unavailable(dial_error_);
      int u[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, u) != 0) {
        return Unavailable("socketpair");
      }
      upstreams_.emplace_back(u[0]);
      cv_.notify_all();
      return std::unique_ptr<ByteStream>(new OwnedFdStream(UniqueFd(u[1])));
    };
    relay_ = std::thread([this, limits] {
      result_ = RelayHttp2(*guest_stream_, dial_, *secrets_, kHost, limits,
                           rules_.empty() ? nullptr : &rules_);
    });
    client_ = std::make_unique<TestClient>(guest_.get());
  }

  void TearDown() override {
    if (!relay_.joinable()) return;
    ::shutdown(guest_.get(), SHUT_RDWR);
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& u : upstreams_) ::shutdown(u.get(), SHUT_RDWR);
    }
    relay_.join();
  }

  // The next upstream connection the relay dials (the test fails after kStuckMs).
  int NextUpstream() {
    std::unique_lock<std::mutex> l(mu_);
    bool got = cv_.wait_for(l, std::chrono::milliseconds(kStuckMs),
                            [&] { return upstreams_.size() > taken_; });
    if (!got) {
      ADD_FAILURE() << "the relay dialled no upstream";
      return -1;
    }
    return upstreams_[taken_++].get();
  }

  int dials() {
    std::lock_guard<std::mutex> l(mu_);
    return dials_;
  }

  // The guest closes; the relay ends and says what it did.
  InterceptResult CloseAndJoin() {
    ::shutdown(guest_.get(), SHUT_WR);
    relay_.join();
    return result_;
  }

  std::string Placeholder(const std::string& name) { return secrets_->GuestEnv().at(name); }
  TestClient& client() { return *client_; }
  int guest() const { return guest_.get(); }
  void FailDials(std::string why) {
    std::lock_guard<std::mutex> l(mu_);
    dial_error_ = std::move(why);
  }

 private:
  std::shared_ptr<const SecretSet> secrets_;
  HttpRules rules_;
  UniqueFd guest_, relay_guest_;
  std::unique_ptr<FdStream> guest_stream_;
  UpstreamDialer dial_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<UniqueFd> upstreams_;
  size_t taken_ = 0;
  int dials_ = 0;
  std::string dial_error_;
  std::thread relay_;
  std::unique_ptr<TestClient> client_;
  InterceptResult result_;
};

TEST_F(InterceptH2Test, APlaceholderInAHeaderReachesTheUpstreamAsTheRealValueOverHttp11) {
  Start({Declare("API_KEY", kValue, {kHost}, false, false, /*target=*/true)});
  std::string ph = Placeholder("API_KEY");
  int32_t id = client().Submit("GET", "/v1/models?k=" + ph,
                               {{"authorization", "Bearer " + ph},
                                {"cookie", "a=1"},
                                {"cookie", "b=2"},
                                {"te", "trailers"}});
  int up = NextUpstream();
  EXPECT_EQ(ReadHead(up), std::string("GET /v1/models?k=") + kValue +
                              " HTTP/1.1\r\nHost: api.test\r\nauthorization: Bearer " + kValue +
                              "\r\ncookie: a=1; b=2\r\n\r\n");
  Write(up,
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nSet-Cookie: s=1\r\nConnection: keep-alive, "
        "X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-Kept: yes\r\n\r\nok");
  H2Response r = client().Wait(id);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok");
  EXPECT_EQ(r.error_code, 0u);
  EXPECT_EQ(r.headers, (Fields{{"content-length", "2"}, {"x-kept", "yes"}}));
  InterceptResult res = CloseAndJoin();
  EXPECT_EQ(res.requests, 1);
  EXPECT_EQ(res.substitutions, (std::map<std::string, int>{{"API_KEY", 1}}));
  EXPECT_EQ(res.refused_status, 0);
  EXPECT_EQ(res.error, "");
  EXPECT_GT(res.bytes_up, 0);
  EXPECT_GT(res.bytes_down, 0);
  ExpectNoValue(res, kValue);
}

TEST_F(InterceptH2Test, BasicCredentialsAreSubstitutedInsideTheirBase64) {
  Start({Declare("API_KEY", kValue, {kHost})});
  auto b64 = [](const std::string& s) {
    std::string out(4 * ((s.size() + 2) / 3), '\0');
    EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                    reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
    return out;
  };
  int32_t id = client().Submit(
      "GET", "/u", {{"authorization", "Basic " + b64("bot:" + Placeholder("API_KEY"))}});
  int up = NextUpstream();
  std::string head = ReadHead(up);
  EXPECT_NE(head.find("authorization: Basic " + b64(std::string("bot:") + kValue)),
            std::string::npos)
      << head;
  Write(up, "HTTP/1.1 204 No Content\r\n\r\n");
  EXPECT_EQ(client().Wait(id).status, 204);
}

TEST_F(InterceptH2Test, SequentialStreamsReuseOneUpstreamConnection) {
  Start({Declare("API_KEY", kValue, {kHost})});
  int up = -1;
  for (int i = 0; i < 3; ++i) {
    int32_t id = client().Submit("GET", "/n" + std::to_string(i));
    if (i == 0) up = NextUpstream();
    EXPECT_EQ(ReadHead(up), "GET /n" + std::to_string(i) + " HTTP/1.1\r\nHost: api.test\r\n\r\n");
    Write(up, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n" + std::to_string(i));
    H2Response r = client().Wait(id);
    EXPECT_EQ(r.body, std::to_string(i));
  }
  EXPECT_EQ(dials(), 1);
  EXPECT_EQ(CloseAndJoin().requests, 3);
}

TEST_F(InterceptH2Test, ConcurrentStreamsGetTheirOwnUpstreamConnections) {
  Start({Declare("API_KEY", kValue, {kHost})});
  int32_t a = client().Submit("GET", "/a");
  int up_a = NextUpstream();
  EXPECT_EQ(ReadHead(up_a), "GET /a HTTP/1.1\r\nHost: api.test\r\n\r\n");
  int32_t b = client().Submit("GET", "/b");
  int up_b = NextUpstream();
  EXPECT_EQ(ReadHead(up_b), "GET /b HTTP/1.1\r\nHost: api.test\r\n\r\n");
  // Answered in the other order: neither waits for the other.
  Write(up_b, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nB");
  EXPECT_EQ(client().Wait(b).body, "B");
  Write(up_a, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nA");
  EXPECT_EQ(client().Wait(a).body, "A");
  EXPECT_EQ(dials(), 2);
  EXPECT_EQ(CloseAndJoin().requests, 2);
}

TEST_F(InterceptH2Test, AForeignPlaceholderIsRefusedWith403AndNothingReachesTheUpstream) {
  Start({Declare("API_KEY", kValue, {kHost}),
         Declare("OTHER", "other-0123456789abcdef", {"b.test"})});
  int32_t id = client().Submit("GET", "/x", {{"x-key", Placeholder("OTHER")}});
  int up = NextUpstream();
  H2Response r = client().Wait(id);
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(r.Header("x-trybox-reason").find("OTHER"), std::string::npos);
  EXPECT_EQ(ReadUntilEof(up), "");
  // The connection goes on: another stream is served.
  int32_t next = client().Submit("GET", "/y");
  int up2 = NextUpstream();
  EXPECT_EQ(ReadHead(up2), "GET /y HTTP/1.1\r\nHost: api.test\r\n\r\n");
  Write(up2, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(client().Wait(next).status, 200);
  InterceptResult res = CloseAndJoin();
  EXPECT_EQ(res.refused_status, 403);
  EXPECT_EQ(res.requests, 1);
  ExpectNoValue(res, kValue);
}

TEST_F(InterceptH2Test, AnAuthorityNamingAnotherHostIsRefused) {
  Start({Declare("API_KEY", kValue, {kHost})});
  int32_t id = client().Submit("GET", "/x", {{"authorization", Placeholder("API_KEY")}},
                               std::nullopt, "elsewhere.test");
  int up = NextUpstream();
  H2Response r = client().Wait(id);
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(r.Header("x-trybox-reason").find("does not name api.test"), std::string::npos)
      << r.Header("x-trybox-reason");
  EXPECT_EQ(ReadUntilEof(up), "");
}

TEST_F(InterceptH2Test, HttpRulesRefuseARequestNamingTheRule) {
  Start({}, {"allow GET api.test/repos/me/proj"});
  int32_t ok = client().Submit("GET", "/repos/me/proj/issues");
  int up = NextUpstream();
  EXPECT_EQ(ReadHead(up), "GET /repos/me/proj/issues HTTP/1.1\r\nHost: api.test\r\n\r\n");
  Write(up, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(client().Wait(ok).status, 200);
  int32_t refused = client().Submit("DELETE", "/repos/me/proj");
  H2Response r = client().Wait(refused);
  EXPECT_EQ(r.status, 403) << r.Header("x-trybox-reason");
  EXPECT_NE(r.Header("x-trybox-reason").find("no HTTP rule for api.test allows DELETE"),
            std::string::npos);
}

TEST_F(InterceptH2Test, ABodyWithoutLengthGoesUpChunkedAndOneWithLengthAsItCame) {
  Start({Declare("API_KEY", kValue, {kHost})});
  int32_t a = client().Submit("POST", "/a", {}, std::string("hello"));
  int up = NextUpstream();
  EXPECT_EQ(ReadHead(up),
            "POST /a HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n");
  EXPECT_EQ(ReadN(up, 15), "5\r\nhello\r\n0\r\n\r\n");
  Write(up, "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(client().Wait(a).status, 201);
  int32_t b = client().Submit("PUT", "/b", {{"content-length", "3"}}, std::string("abc"));
  EXPECT_EQ(ReadHead(up), "PUT /b HTTP/1.1\r\nHost: api.test\r\ncontent-length: 3\r\n\r\n");
  EXPECT_EQ(ReadN(up, 3), "abc");
  Write(up, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(client().Wait(b).status, 200);
  int32_t c = client().Submit("POST", "/c");
  EXPECT_EQ(ReadHead(up), "POST /c HTTP/1.1\r\nHost: api.test\r\nContent-Length: 0\r\n\r\n");
  Write(up, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(client().Wait(c).status, 200);
}

TEST_F(InterceptH2Test, WithBodySubstitutionTheValueGoesIntoTheBody) {
  Start({Declare("API_KEY", kValue, {kHost}, /*body=*/true)});
  std::string body = "{\"key\":\"" + Placeholder("API_KEY") + "\"}";
  int32_t id = client().Submit("POST", "/b", {{"content-type", "application/json"}}, body);
  int up = NextUpstream();
  std::string want = std::string("{\"key\":\"") + kValue + "\"}";
  EXPECT_EQ(ReadHead(up),
            "POST /b HTTP/1.1\r\nHost: api.test\r\ncontent-type: application/json\r\n"
            "Content-Length: " +
                std::to_string(want.size()) + "\r\n\r\n");
  EXPECT_EQ(ReadN(up, want.size()), want);
  Write(up, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(client().Wait(id).status, 200);
}

// Issue 41.2: a host reflecting the value (a Location, a body split inside the value across
// chunks) hands an HTTP/2 guest the placeholder, by the same relay as HTTP/1.1.
TEST_F(InterceptH2Test, AReflectedValueReachesTheGuestAsThePlaceholder) {
  Start({Declare("API_KEY", kValue, {kHost})});
  const std::string ph = Placeholder("API_KEY");
  int32_t id = client().Submit("GET", "/r", {{"authorization", "Bearer " + ph}});
  int up = NextUpstream();
  EXPECT_NE(ReadHead(up).find(kValue), std::string::npos);
  const std::string v = kValue;
  Write(up, "HTTP/1.1 302 Found\r\nLocation: /next?k=" + v +
                "\r\nTransfer-Encoding: chunked\r\n\r\n" + Hex(4 + v.size() / 2) +
                "\r\nkey=" + v.substr(0, v.size() / 2) + "\r\n");
  Write(up, Hex(v.size() - v.size() / 2) + "\r\n" + v.substr(v.size() / 2) + "\r\n0\r\n\r\n");
  H2Response r = client().Wait(id);
  EXPECT_EQ(r.status, 302);
  EXPECT_EQ(r.Header("location"), "/next?k=" + ph);
  EXPECT_EQ(r.body, "key=" + ph);
  InterceptResult res = CloseAndJoin();
  EXPECT_EQ(res.scrubbed, 2);
}

TEST_F(InterceptH2Test, TraceIsRefusedWith405OnItsStream) {
  Start({Declare("API_KEY", kValue, {kHost})});
  int32_t id = client().Submit("TRACE", "/");
  int up = NextUpstream();
  H2Response r = client().Wait(id);
  EXPECT_EQ(r.status, 405);
  EXPECT_NE(r.Header("x-trybox-reason").find("TRACE is refused"), std::string::npos);
  EXPECT_EQ(ReadUntilEof(up), "") << "the TRACE went upstream";
}

TEST_F(InterceptH2Test, AChunkedResponseArrivesDechunkedAndHeadHasNoBody) {
  Start({Declare("API_KEY", kValue, {kHost})});
  int32_t id = client().Submit("GET", "/c");
  int up = NextUpstream();
  ReadHead(up);
  Write(up,
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n"
        "A\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n");
  H2Response r = client().Wait(id);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "abc0123456789");
  EXPECT_EQ(r.Header("transfer-encoding"), "");
  int32_t head = client().Submit("HEAD", "/c");
  EXPECT_EQ(ReadHead(up), "HEAD /c HTTP/1.1\r\nHost: api.test\r\n\r\n");
  Write(up, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n");
  H2Response h = client().Wait(head);
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.Header("content-length"), "1000");
  EXPECT_EQ(h.body, "");
  EXPECT_EQ(dials(), 1);
}

TEST_F(InterceptH2Test, LargeBodiesCrossBothWaysIntactUnderFlowControl) {
  Start({Declare("API_KEY", kValue, {kHost})});
  std::string up_body(3 << 20, '\0');
  std::string down_body(5 << 20, '\0');
  for (size_t i = 0; i < up_body.size(); ++i) up_body[i] = static_cast<char>('a' + i % 26);
  for (size_t i = 0; i < down_body.size(); ++i) down_body[i] = static_cast<char>('A' + i % 23);
  int32_t id = client().Submit("POST", "/big", {{"content-length", std::to_string(up_body.size())}},
                               up_body);
  int up = NextUpstream();
  // The upstream reads on its own thread while the client pumps the connection.
  std::string got_up;
  std::thread upstream([&] {
    ReadHead(up);
    got_up = ReadN(up, up_body.size());
    Write(up, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(down_body.size()) +
                  "\r\n\r\n" + down_body);
  });
  H2Response r = client().Wait(id);
  upstream.join();
  EXPECT_TRUE(got_up == up_body) << got_up.size();
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.body == down_body) << r.body.size();
}

TEST_F(InterceptH2Test, AStreamTheGuestResetsEndsItsUpstreamConnectionOnly) {
  Start({Declare("API_KEY", kValue, {kHost})});
  int32_t a = client().Submit("GET", "/slow");
  int up_a = NextUpstream();
  ReadHead(up_a);
  // ".:.:" cannot begin a secret's value, so the scrubber holds none of it back.
  Write(up_a, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n.:.:");
  client().WaitForBody(a, 4);
  client().Reset(a);
  EXPECT_EQ(ReadUntilEof(up_a), "");  // the relay closed that connection
  int32_t b = client().Submit("GET", "/next");
  int up_b = NextUpstream();
  EXPECT_EQ(ReadHead(up_b), "GET /next HTTP/1.1\r\nHost: api.test\r\n\r\n");
  Write(up_b, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  EXPECT_EQ(client().Wait(b).body, "ok");
}

TEST_F(InterceptH2Test, AnUpstreamCutShortResetsTheStream) {
  Start({Declare("API_KEY", kValue, {kHost})});
  int32_t id = client().Submit("GET", "/cut");
  int up = NextUpstream();
  ReadHead(up);
  Write(up, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart");
  ::shutdown(up, SHUT_RDWR);
  H2Response r = client().Wait(id);
  EXPECT_EQ(r.status, 200) << r.Header("x-trybox-reason");
  EXPECT_TRUE(r.closed);
  EXPECT_NE(r.error_code, 0u) << "a body cut short must not look complete";
}

TEST_F(InterceptH2Test, AnUpstreamThatCannotBeReachedGives502WithTheReason) {
  Start({Declare("API_KEY", kValue, {kHost})});
  FailDials("connect to 127.0.0.1:443: refused");
  int32_t id = client().Submit("GET", "/x");
  H2Response r = client().Wait(id);
  EXPECT_EQ(r.status, 502);
  EXPECT_EQ(r.Header("x-trybox-reason"), "connect to 127.0.0.1:443: refused");
  EXPECT_EQ(CloseAndJoin().refused_status, 502);
}

TEST_F(InterceptH2Test, APlainHttpSchemeIsRefusedWith400) {
  Start({Declare("API_KEY", kValue, {kHost})});
  int32_t id = client().Submit("GET", "/x", {}, std::nullopt, kHost, "http");
  H2Response r = client().Wait(id);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.Header("x-trybox-reason").find("must be https"), std::string::npos);
  EXPECT_EQ(dials(), 0);
}

TEST_F(InterceptH2Test, ATooLargeRequestHeadIsRefusedWith431) {
  InterceptLimits limits;
  limits.max_head = 1024;
  Start({Declare("API_KEY", kValue, {kHost})}, {}, limits);
  int32_t id = client().Submit("GET", "/x", {{"x-big", std::string(2000, 'a')}});
  H2Response r = client().Wait(id);
  EXPECT_EQ(r.status, 431);
  EXPECT_EQ(dials(), 0);
}

TEST_F(InterceptH2Test, BytesThatAreNotHttp2EndTheSessionWithAnError) {
  Start({Declare("API_KEY", kValue, {kHost})});
  client().SendRaw("GET / HTTP/1.1\r\nHost: api.test\r\n\r\n");
  InterceptResult res = CloseAndJoin();
  EXPECT_NE(res.error.find("HTTP/2 from the guest"), std::string::npos) << res.error;
  EXPECT_EQ(res.requests, 0);
}

TEST_F(InterceptH2Test, AnIdleConnectionIsClosedWithGoaway) {
  InterceptLimits limits;
  limits.head_timeout = std::chrono::milliseconds(200);
  Start({}, {}, limits);
  while (!client().goaway() && client().PumpOnce()) {
  }
  EXPECT_TRUE(client().goaway());
}

}  // namespace
}  // namespace trybox::egress
