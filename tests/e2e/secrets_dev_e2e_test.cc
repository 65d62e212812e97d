// End to end (issue 13) on the developer image, debian-12-dev, whose Node is the one a guest
// would use: Node's global fetch ignores HTTPS_PROXY, so it reaches a secret's host through
// the guest's resolver and the steered (transparent) path, and must be intercepted there as
// curl is through the proxy; Node's https module is driven through the proxy with CONNECT.
// The origins are TLS servers on the host's loopback (secrets_support.h), so nothing leaves
// loopback. The memory proof of secrets_e2e_test.cc is repeated on this image, after Node has
// held the placeholder. The image is built through the CLI when it is missing or its recipe
// changed (a no-op otherwise).
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <iostream>
#include <nlohmann/json.hpp>

#include "egress/tls.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/secrets_support.h"
#include "util/fd.h"
#include "util/utf8.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

// The real values. Never printed by a passing test; the guest must never hold them.
constexpr char kGhValue[] = "ghs-REAL-5e8b1c0d94a7436f2b1e0d9c8b7a6f54";
constexpr char kOtherValue[] = "other-REAL-1a2b3c4d5e6f708192a3b4c5d6e7";

// Prints STATUS BODY, then the X-Trybox-Reason and Set-Cookie it got ("null" when absent);
// exits 1 with the error and its cause when fetch rejects.
constexpr char kNodeFetch[] =
    "node -e 'fetch(process.argv[1], {headers: {Authorization: process.argv[2] + \" \" + "
    "process.env.GH_TOKEN}}).then(async (r) => { console.log(r.status, (await r.text()).trim()); "
    "console.log(\"reason=\" + r.headers.get(\"x-trybox-reason\")); "
    "console.log(\"cookie=\" + r.headers.get(\"set-cookie\")); }, "
    "(e) => { console.error(e, e.cause); process.exit(1); })' ";

// Node's https module through the proxy: CONNECT to HTTPS_PROXY with the http module, then
// TLS over that socket (Node's trust store plus NODE_EXTRA_CA_CERTS); prints STATUS BODY.
constexpr char kNodeHttpsViaProxy[] =
    "node -e 'const http = require(\"http\"), https = require(\"https\"), tls = require(\"tls\");"
    "const p = new URL(process.env.HTTPS_PROXY), u = new URL(process.argv[1]);"
    "const fail = (e) => { console.error(e); process.exit(1); };"
    "http.request({host: p.hostname, port: p.port, method: \"CONNECT\", path: u.host})"
    ".on(\"connect\", (res, sock) => {"
    "  if (res.statusCode !== 200) fail(\"CONNECT answered \" + res.statusCode);"
    "  https.get(u, {headers: {authorization: \"token \" + process.env.GH_TOKEN},"
    "    createConnection: () => tls.connect({socket: sock, servername: u.hostname})}, (r) => {"
    "    let b = \"\"; r.on(\"data\", (d) => b += d);"
    "    r.on(\"end\", () => console.log(r.statusCode, b.trim())); }).on(\"error\", fail);"
    "}).on(\"error\", fail).end();' ";

class DevImageSecretsE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // As in SecretsE2E: an origin's write on a socket the proxy closed is EPIPE, not a signal.
    ::signal(SIGPIPE, SIG_IGN);
    ca_ = egress::CertAuthority::Create("trybox test upstream CA").value().release();
    api_ = new TlsOrigin(*ca_, "api.secret.test");
    other_ = new TlsOrigin(*ca_, "other.secret.test");
    auto h = Harness::Start();
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    h_ = h->release();
    // The image as the user gets it: its built-in recipe, through the CLI. A no-op when the
    // image is current; a cold build (its apt cache is in this harness's fresh home) took
    // minutes (docs/testing.md).
    auto start = std::chrono::steady_clock::now();
    CliResult b = h_->Cli({"image", "build", "debian-12-dev", "--quiet"});
    ASSERT_EQ(b.code, 0) << b.err;
    std::cout << "debian-12-dev: `trybox image build` took "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
              << " s\n";
    Status served = ServeOriginsByName(
        *h_, *ca_, {{"api.secret.test", api_->port()}, {"other.secret.test", other_->port()}});
    ASSERT_TRUE(served.ok()) << served.ToString();
    ASSERT_TRUE(WriteFileAtomic(h_->home() + "/gh.token", std::string(kGhValue) + "\n").ok());
    ASSERT_TRUE(WriteFileAtomic(h_->home() + "/other.token", kOtherValue).ok());
    CliResult r = h_->Cli({"create", "--image", "debian-12-dev", "--memory", "512", "--allow",
                           "api.secret.test:" + std::to_string(api_->port()), "--allow",
                           "other.secret.test:" + std::to_string(other_->port()), "--secret",
                           "GH_TOKEN=file:" + h_->home() + "/gh.token@api.secret.test", "--secret",
                           "OTHER_TOKEN=file:" + h_->home() + "/other.token@other.secret.test"});
    ASSERT_EQ(r.code, 0) << r.err;
    id_ = r.out.substr(0, r.out.find('\n'));
  }
  static void TearDownTestSuite() {
    delete h_;
    delete api_;
    delete other_;
    delete ca_;
    h_ = nullptr;
  }
  void SetUp() override { ASSERT_FALSE(id_.empty()); }

  static CliResult Sh(const std::string& script) { return ShIn(*h_, id_, script); }
  static std::string Url(TlsOrigin* o, const std::string& host, const std::string& path) {
    return OriginUrl(*o, host, path);
  }
  static std::string Placeholder(const std::string& name) {
    return GuestPlaceholder(*h_, id_, name);
  }
  // The VM's audit rows with this method and host.
  static std::vector<Json> AuditRows(const std::string& method, const std::string& host) {
    CliResult audit = h_->Cli({"audit", "--vm", id_, "--json"});
    EXPECT_EQ(audit.code, 0) << audit.err;
    std::vector<Json> rows;
    for (const auto& row : Json::parse(audit.out, nullptr, false)) {
      if (row.value("method", "") == method && row.value("host", "") == host) rows.push_back(row);
    }
    return rows;
  }

  static inline Harness* h_ = nullptr;
  static inline egress::CertAuthority* ca_ = nullptr;
  static inline TlsOrigin* api_ = nullptr;
  static inline TlsOrigin* other_ = nullptr;
  static inline std::string id_;
};

// Node's fetch does not read HTTPS_PROXY (set in every exec), so its connection is steered:
// the audit row is `TCP`, not `CONNECT`, and says it was intercepted for the secret.
TEST_F(DevImageSecretsE2E, NodeFetchIgnoringTheProxyAuthenticatesWithThePlaceholder) {
  CliResult env =
      Sh("node --version; printf %s \"$HTTPS_PROXY\"; echo; printf %s "
         "\"$NODE_EXTRA_CA_CERTS\"");
  ASSERT_EQ(env.code, 0) << env.err;
  std::cout << "guest: node " << env.out.substr(0, env.out.find('\n')) << "\n";
  EXPECT_NE(env.out.find("http://127.0.0.1:3128"), std::string::npos) << env.out;
  EXPECT_NE(env.out.find("/etc/trybox/egress-ca.pem"), std::string::npos) << env.out;
  const std::string ph = Placeholder("GH_TOKEN");
  ASSERT_EQ(ph.size(), std::string(kGhValue).size());
  size_t before = api_->heads().size();
  size_t tcp_before = AuditRows("TCP", "api.secret.test").size();
  size_t connect_before = AuditRows("CONNECT", "api.secret.test").size();
  CliResult r =
      Sh(std::string(kNodeFetch) + Url(api_, "api.secret.test", "/node-fetch") + " Bearer");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("200 ok\n"), std::string::npos) << r.out;
  // Set-Cookie from a secret's host is dropped on this path too.
  EXPECT_NE(r.out.find("cookie=null"), std::string::npos) << r.out;
  auto heads = api_->heads();
  ASSERT_EQ(heads.size(), before + 1);
  EXPECT_EQ(heads.back().rfind("GET /node-fetch HTTP/1.1\r\n", 0), 0u) << heads.back();
  EXPECT_EQ(TlsOrigin::Header(heads.back(), "authorization"), "Bearer " + std::string(kGhValue))
      << "the origin did not get the real value from Node's fetch";
  EXPECT_EQ(heads.back().find(ph), std::string::npos) << "a placeholder reached the origin";
  auto tcp = AuditRows("TCP", "api.secret.test");
  ASSERT_EQ(tcp.size(), tcp_before + 1) << "fetch did not take the transparent path";
  EXPECT_NE(tcp.back().value("reason", "").find("TLS intercepted for its secrets"),
            std::string::npos)
      << tcp.back().dump();
  EXPECT_NE(tcp.back().value("reason", "").find("GH_TOKEN put into 1"), std::string::npos)
      << tcp.back().dump();
  EXPECT_EQ(AuditRows("CONNECT", "api.secret.test").size(), connect_before)
      << "fetch used the proxy";
}

TEST_F(DevImageSecretsE2E, NodeFetchOfThePlaceholderToAnotherAllowedHostIsRefusedAndAudited) {
  size_t before = other_->heads().size();
  size_t tcp_before = AuditRows("TCP", "other.secret.test").size();
  CliResult r =
      Sh(std::string(kNodeFetch) + Url(other_, "other.secret.test", "/steal") + " Bearer");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.rfind("403 ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("reason=the placeholder of secret GH_TOKEN may go only to its hosts"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(other_->heads().size(), before) << "the refused request reached the origin";
  auto tcp = AuditRows("TCP", "other.secret.test");
  ASSERT_EQ(tcp.size(), tcp_before + 1);
  EXPECT_EQ(tcp.back().value("verdict", ""), "refused") << tcp.back().dump();
  EXPECT_NE(tcp.back().value("reason", "").find("secret GH_TOKEN may go only to its hosts"),
            std::string::npos)
      << tcp.back().dump();
}

TEST_F(DevImageSecretsE2E, NodeHttpsModuleThroughTheProxyAuthenticatesWithThePlaceholder) {
  size_t before = api_->heads().size();
  size_t connect_before = AuditRows("CONNECT", "api.secret.test").size();
  CliResult r = Sh(std::string(kNodeHttpsViaProxy) + Url(api_, "api.secret.test", "/node-https"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("200 ok"), std::string::npos) << r.out;
  auto heads = api_->heads();
  ASSERT_EQ(heads.size(), before + 1);
  EXPECT_EQ(heads.back().rfind("GET /node-https HTTP/1.1\r\n", 0), 0u) << heads.back();
  EXPECT_EQ(TlsOrigin::Header(heads.back(), "authorization"), "token " + std::string(kGhValue))
      << "the origin did not get the real value from Node's https module";
  auto connect = AuditRows("CONNECT", "api.secret.test");
  ASSERT_EQ(connect.size(), connect_before + 1) << "the https module did not use the proxy";
  EXPECT_NE(connect.back().value("reason", "").find("TLS intercepted for its secrets"),
            std::string::npos)
      << connect.back().dump();
}

// Last: after Node has held the placeholder (fetch and the https module, five times each),
// the value is nowhere in the guest's memory or disk layer, nor in the daemon's log or store,
// while the placeholder is.
TEST_F(DevImageSecretsE2E, ZZTheValueIsNowhereInTheGuestsMemoryDiskOrTheDaemonsRecords) {
  const std::string ph = Placeholder("GH_TOKEN");
  for (int i = 0; i < 5; ++i) {
    CliResult r =
        Sh(std::string(kNodeFetch) + Url(api_, "api.secret.test", "/again") + " Bearer && " +
           kNodeHttpsViaProxy + Url(api_, "api.secret.test", "/again-https") + " && echo " + ph +
           " > /root/placeholder-on-disk && sync");
    ASSERT_EQ(r.code, 0) << r.out << r.err << h_->Cli({"audit", "--vm", id_}).out;
  }
  const std::string value = kGhValue;
  ExpectValueNowhereButPlaceholderFound(*h_, id_, {value, Base64Encode(value)}, ph, 400 << 20);
}

}  // namespace
}  // namespace trybox::e2e
