// End to end (issue 41.2): a secret's host that reflects the request hands the guest nothing
// of the value. An HTTPS origin on the host's loopback echoes the Authorization header and
// the path it received (so, with the real value the relay put in) in every way the attack
// campaign used: a 301's Location, a 404 page, a JSON error, a gzip body, a chunked body
// split inside the value, base64 of Basic credentials. A real guest asks with curl (HTTP/2
// and HTTP/1.1) and Python; what it receives must hold the placeholder and never the value,
// in any form, and after it all the value is nowhere in the guest's memory or disk.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <zlib.h>

#include <csignal>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "egress/tls.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/secrets_support.h"
#include "util/ascii.h"
#include "util/fd.h"
#include "util/tcp.h"
#include "util/utf8.h"

namespace trybox::e2e {
namespace {

using Clock = std::chrono::steady_clock;

// The real value: '/' and '+' make its percent, JSON and base64 forms differ from it.
constexpr char kValue[] = "ghs-R3FL3CT/echo+0f3c9a7e51d24b6b8a1e";
constexpr char kHost[] = "echo.secret.test";

std::string Percent(const std::string& v) {
  std::string out;
  char b[4];
  for (unsigned char c : v) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      std::snprintf(b, sizeof b, "%%%02X", c);
      out += b;
    }
  }
  return out;
}

std::string JsonEscaped(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '/') {
      out += "\\/";
    } else if (c == '+') {
      out += "\\u002b";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Gzip(const std::string& text) {
  z_stream z{};
  if (::deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return "";
  std::string out(::deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  ::deflate(&z, Z_FINISH);
  out.resize(out.size() - z.avail_out);
  ::deflateEnd(&z);
  return out;
}

// Every form of the value the origin writes; none may reach the guest.
std::vector<std::string> Forms() {
  const std::string v = kValue;
  return {v,
          Percent(v),
          JsonEscaped(v),
          Base64Encode(v),
          Base64Encode("x-access-token:" + v),
          AsciiLower(Percent(v))};
}

// An HTTPS origin that reflects. The path picks the reflection; the request is answered from
// its Authorization header (the token after "Bearer ", or Basic credentials as they came) and
// its target. One request per connection.
class ReflectingOrigin {
 public:
  ReflectingOrigin(egress::CertAuthority& ca, const std::string& name) {
    ctx_ = ca.ServerContext(name).value();
    l_ = ListenTcpLoopback(0, 64).value();
    accept_ = std::thread([this] {
      for (;;) {
        auto c = AcceptTcp(l_.fd.get());
        if (!c.ok()) return;
        std::lock_guard<std::mutex> lock(mu_);
        conns_.emplace_back([this, fd = std::move(*c)]() mutable { Serve(std::move(fd)); });
      }
    });
  }
  ~ReflectingOrigin() {
    ::shutdown(l_.fd.get(), SHUT_RDWR);
    accept_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : conns_) t.join();
  }
  uint16_t port() const { return l_.port; }
  std::vector<std::string> heads() {
    std::lock_guard<std::mutex> lock(mu_);
    return heads_;
  }

 private:
  void Serve(UniqueFd fd) {
    auto tls =
        egress::TlsStream::Accept(std::move(fd), ctx_, Clock::now() + std::chrono::seconds(30));
    if (!tls.ok()) return;
    std::string head;
    while (head.find("\r\n\r\n") == std::string::npos) {
      auto more = (*tls)->Read(16384, Clock::now() + std::chrono::seconds(30));
      if (!more.ok() || more->empty()) return;
      head += *more;
    }
    head = head.substr(0, head.find("\r\n\r\n") + 2);
    {
      std::lock_guard<std::mutex> lock(mu_);
      heads_.push_back(head);
    }
    std::string line = head.substr(0, head.find("\r\n"));
    std::string target = line.substr(line.find(' ') + 1);
    target = target.substr(0, target.find(' '));
    std::string auth = TlsOrigin::Header(head, "authorization");
    std::string token = auth.rfind("Bearer ", 0) == 0 ? auth.substr(7) : auth;
    auto& t = **tls;
    if (target.rfind("/redirect", 0) == 0) {
      // from=: the path asked for, percent-encoded again (a login redirect's next=).
      (void)t.Write("HTTP/1.1 301 Moved to " + token + "\r\nLocation: https://" + kHost + ":" +
                    std::to_string(port()) + "/landing?auth=" + Percent(token) + "&from=" +
                    Percent(target) + "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    } else if (target.rfind("/json", 0) == 0) {
      std::string body = "{\"error\":\"invalid token\",\"token\":\"" + JsonEscaped(token) +
                         "\",\"auth\":\"" + auth + "\"}";
      (void)t.Write(
          "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
          "Content-Length: " +
          std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    } else if (target.rfind("/gzip", 0) == 0) {
      std::string body = Gzip(std::string(3000, ' ') + "{\"you sent\":\"" + token + "\"}\n");
      (void)t.Write(
          "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
          "Content-Encoding: gzip\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    } else if (target.rfind("/chunked", 0) == 0) {
      // The value split in the middle, across two chunks sent apart.
      std::string text = "data: " + token + "\n\n";
      size_t cut = 6 + token.size() / 2;
      char size[24];
      (void)t.Write(
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
          "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
      std::snprintf(size, sizeof size, "%zx\r\n", cut);
      (void)t.Write(size + text.substr(0, cut) + "\r\n");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::snprintf(size, sizeof size, "%zx\r\n", text.size() - cut);
      (void)t.Write(size + text.substr(cut) + "\r\n0\r\n\r\n");
    } else if (target.rfind("/basic", 0) == 0) {
      std::string body = "your credentials: " + auth + "\n";
      (void)t.Write("HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\nConnection: close\r\n\r\n" + body);
    } else {
      std::string body = "<html><body><h1>404</h1><p>No page at " + target + "</p><p>" + token +
                         "</p></body></html>\n";
      (void)t.Write("HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    }
    (void)t.CloseWrite();
  }

  std::shared_ptr<SSL_CTX> ctx_;
  TcpListener l_;
  std::thread accept_;
  std::mutex mu_;
  std::vector<std::thread> conns_;
  std::vector<std::string> heads_;
};

class SecretReflectE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::signal(SIGPIPE, SIG_IGN);
    ca_ = egress::CertAuthority::Create("trybox test upstream CA").value().release();
    origin_ = new ReflectingOrigin(*ca_, kHost);
    auto h = Harness::Start();
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    h_ = h->release();
    Status served = ServeOriginsByName(*h_, *ca_, {{kHost, origin_->port()}});
    ASSERT_TRUE(served.ok()) << served.ToString();
    ASSERT_TRUE(WriteFileAtomic(h_->home() + "/echo.token", std::string(kValue) + "\n").ok());
    // +target: the value goes into paths and queries too, so that a reflected path has it.
    // TRYBOX_TEST_OLD_CLI=1 runs the suite against binaries from before +target (with
    // TRYBOX_BIN_DIR), which put every secret into targets: how it was seen failing there.
    const char* old_cli = std::getenv("TRYBOX_TEST_OLD_CLI");
    const std::string suffix = old_cli != nullptr && std::string(old_cli) == "1" ? "" : "+target";
    CliResult r = h_->Cli({"create", "--memory", "256", "--allow",
                           std::string(kHost) + ":" + std::to_string(origin_->port()), "--secret",
                           "ECHO_TOKEN=file:" + h_->home() + "/echo.token@" + kHost + suffix});
    ASSERT_EQ(r.code, 0) << r.err;
    id_ = r.out.substr(0, r.out.find('\n'));
  }
  static void TearDownTestSuite() {
    delete h_;
    delete origin_;
    delete ca_;
    h_ = nullptr;
  }
  void SetUp() override { ASSERT_FALSE(id_.empty()); }

  static std::string Url(const std::string& path) {
    return "https://" + std::string(kHost) + ":" + std::to_string(origin_->port()) + path;
  }
  static std::string Placeholder() { return GuestPlaceholder(*h_, id_, "ECHO_TOKEN"); }
  // What the guest received, as curl shows it (status line, headers, body).
  static CliResult Curl(const std::string& flags, const std::string& path,
                        const std::string& auth = "Bearer $ECHO_TOKEN") {
    return ShIn(*h_, id_,
                "curl -sS -i " + flags + " -H \"Authorization: " + auth + "\" '" + Url(path) +
                    "'\"$ECHO_TOKEN\"");
  }
  // The origin got the real value (the test is about its way back), and the guest did not.
  static void ExpectReflectedWithoutTheValue(const CliResult& r, size_t heads_before) {
    ASSERT_EQ(r.code, 0) << r.err;
    auto heads = origin_->heads();
    ASSERT_GT(heads.size(), heads_before);
    const std::vector<std::string> forms = Forms();
    bool got = false;
    for (const std::string& form : forms) got = got || heads.back().find(form) != std::string::npos;
    EXPECT_TRUE(got) << "the origin did not get the value, so it could not reflect it";
    for (size_t i = 0; i < forms.size(); ++i) {
      EXPECT_EQ(r.out.find(forms[i]), std::string::npos)
          << "the guest received the value (form " << i << "):\n"
          << r.out;
    }
    EXPECT_EQ(r.out.find("R3FL3CT"), std::string::npos) << r.out;
  }

  static Harness* h_;
  static egress::CertAuthority* ca_;
  static ReflectingOrigin* origin_;
  static std::string id_;
};
Harness* SecretReflectE2E::h_ = nullptr;
egress::CertAuthority* SecretReflectE2E::ca_ = nullptr;
ReflectingOrigin* SecretReflectE2E::origin_ = nullptr;
std::string SecretReflectE2E::id_;

TEST_F(SecretReflectE2E, ARedirectLocationHoldsThePlaceholderNotTheValue) {
  const std::string ph = Placeholder();
  for (const std::string version : {"--http2", "--http1.1"}) {
    SCOPED_TRACE(version);
    size_t before = origin_->heads().size();
    CliResult r = Curl(version, "/redirect?t=");
    ExpectReflectedWithoutTheValue(r, before);
    EXPECT_NE(r.out.find(" 301"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("/landing?auth=" + ph + "&from="), std::string::npos) << r.out;
  }
  CliResult audit = h_->Cli({"audit", "--vm", id_});
  EXPECT_NE(audit.out.find("taken out of responses"), std::string::npos) << audit.out;
}

TEST_F(SecretReflectE2E, A404PageRepeatingThePathAndTheHeaderHoldsOnlyThePlaceholder) {
  const std::string ph = Placeholder();
  for (const std::string version : {"--http2", "--http1.1"}) {
    SCOPED_TRACE(version);
    size_t before = origin_->heads().size();
    CliResult r = Curl(version, "/missing/");
    ExpectReflectedWithoutTheValue(r, before);
    EXPECT_NE(r.out.find("<p>" + ph + "</p>"), std::string::npos) << r.out;
  }
}

TEST_F(SecretReflectE2E, AJsonErrorQuotingTheTokenEscapedHoldsNoValue) {
  size_t before = origin_->heads().size();
  CliResult r = Curl("", "/json?t=");
  ExpectReflectedWithoutTheValue(r, before);
  EXPECT_NE(r.out.find("invalid token"), std::string::npos) << r.out;
}

TEST_F(SecretReflectE2E, AGzipBodyIsDecodedAndScrubbed) {
  const std::string ph = Placeholder();
  for (const std::string version : {"--http2", "--http1.1"}) {
    SCOPED_TRACE(version);
    size_t before = origin_->heads().size();
    CliResult r = Curl(version + " --compressed", "/gzip?t=");
    ExpectReflectedWithoutTheValue(r, before);
    EXPECT_NE(r.out.find("{\"you sent\":\"" + ph + "\"}"), std::string::npos) << r.out;
    // Asked with br and zstd too by curl: only what the relay can read went up.
    std::string ae = AsciiLower(TlsOrigin::Header(origin_->heads().back(), "accept-encoding"));
    EXPECT_EQ(ae.find("br"), std::string::npos) << ae;
    EXPECT_EQ(ae.find("zstd"), std::string::npos) << ae;
  }
}

TEST_F(SecretReflectE2E, AChunkedStreamSplitInsideTheValueHoldsOnlyThePlaceholder) {
  const std::string ph = Placeholder();
  for (const std::string version : {"--http2", "--http1.1"}) {
    SCOPED_TRACE(version);
    size_t before = origin_->heads().size();
    CliResult r = Curl(version + " -N", "/chunked?t=");
    ExpectReflectedWithoutTheValue(r, before);
    EXPECT_NE(r.out.find("data: " + ph + "\n"), std::string::npos) << r.out;
  }
}

TEST_F(SecretReflectE2E, BasicCredentialsEchoedInBase64HoldThePlaceholder) {
  const std::string ph = Placeholder();
  size_t before = origin_->heads().size();
  // curl -u: Basic x-access-token:<placeholder>, which the relay decodes and fills.
  CliResult r =
      ShIn(*h_, id_, "curl -sS -i -u \"x-access-token:$ECHO_TOKEN\" '" + Url("/basic") + "'");
  ExpectReflectedWithoutTheValue(r, before);
  EXPECT_NE(r.out.find("Basic " + Base64Encode("x-access-token:" + ph)), std::string::npos)
      << r.out;
}

TEST_F(SecretReflectE2E, PythonReadingTheRedirectGetsNoValue) {
  size_t before = origin_->heads().size();
  // urllib follows the redirect to /landing (a 404 that repeats its query): both answers
  // reflect, neither may carry the value.
  CliResult r =
      ShIn(*h_, id_,
           "python3 -c 'import os, urllib.request as u, urllib.error as e\n"
           "q = u.Request(\"" +
               Url("/redirect") +
               "\", headers={\"Authorization\": \"Bearer \" + os.environ[\"ECHO_TOKEN\"]})\n"
               "try:\n  print(u.urlopen(q).read().decode())\n"
               "except e.HTTPError as x:\n  print(x.code, x.headers, x.read().decode())'");
  ExpectReflectedWithoutTheValue(r, before);
  EXPECT_NE(r.out.find("404"), std::string::npos) << r.out;
}

TEST_F(SecretReflectE2E, TraceIsRefusedBeforeTheOriginHearsOfIt) {
  size_t before = origin_->heads().size();
  CliResult r = Curl("--http1.1 -X TRACE", "/trace?t=");
  EXPECT_NE(r.out.find(" 405"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("TRACE is refused"), std::string::npos) << r.out;
  EXPECT_EQ(origin_->heads().size(), before) << "a TRACE reached the origin";
  CliResult audit = h_->Cli({"audit", "--vm", id_});
  EXPECT_NE(audit.out.find("TRACE is refused"), std::string::npos) << audit.out;
}

// Last: after every reflection above, the value is nowhere in the guest's memory or disk
// layer, nor in the daemon's log or store, while the placeholder is.
TEST_F(SecretReflectE2E, ZZTheValueIsNowhereInTheGuestAfterItAll) {
  const std::string ph = Placeholder();
  CliResult r =
      ShIn(*h_, id_,
           "curl -sS -i -H \"Authorization: Bearer $ECHO_TOKEN\" '" + Url("/page") +
               "' > /root/reflected.txt && echo " + ph + " >> /root/reflected.txt && sync");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string value = kValue;
  ExpectValueNowhereButPlaceholderFound(
      *h_, id_,
      {value, Base64Encode(value), Percent(value), JsonEscaped(value),
       Base64Encode("x-access-token:" + value)},
      ph, 200 << 20);
}

}  // namespace
}  // namespace trybox::e2e
