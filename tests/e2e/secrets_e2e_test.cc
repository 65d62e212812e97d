// End to end (issue 13): a real guest is given a secret as a placeholder, and the daemon's
// egress proxy puts the real value in only on HTTPS requests to the secret's hosts. The
// upstreams are TLS servers on the host's loopback with certificates from a test CA that the
// daemon trusts through egress.json's upstream_ca_file; names resolve through the resolver
// map and are reached through internal_allow, so nothing leaves loopback. The proof at the
// end searches the guest's whole memory and its disk layer for the value.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "egress/tls.h"
#include "tests/e2e/harness.h"
#include "util/ascii.h"
#include "util/fd.h"
#include "util/process.h"
#include "util/tcp.h"
#include "vmm/qmp.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The real values. Never printed by a passing test; the guest must never hold them.
constexpr char kGhValue[] = "ghs-REAL-0f3c9a7e51d24b6b8a1e2d3c4b5a6978";
constexpr char kOtherValue[] = "other-REAL-7d6c5b4a39281706f5e4d3c2b1a0";

std::string Base64(const std::string& s) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    uint32_t n = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
    out += {t[n >> 18], t[(n >> 12) & 63], t[(n >> 6) & 63], t[n & 63]};
  }
  if (i + 1 == s.size()) {
    uint32_t n = uint8_t(s[i]) << 16;
    out += {t[n >> 18], t[(n >> 12) & 63], '=', '='};
  } else if (i + 2 == s.size()) {
    uint32_t n = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
    out += {t[n >> 18], t[(n >> 12) & 63], t[(n >> 6) & 63], '='};
  }
  return out;
}

// An HTTPS origin for one name: records each request head it receives and answers "ok" with
// a Set-Cookie, one request per connection.
// With a git root, requests under /git/ are served by `git http-backend` (smart HTTP, a CGI
// run per request with the request's body) and need `git_auth` as their Authorization.
class TlsOrigin {
 public:
  TlsOrigin(egress::CertAuthority& ca, const std::string& name, std::string git_root = "",
            std::string git_auth = "")
      : git_root_(std::move(git_root)), git_auth_(std::move(git_auth)) {
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
  ~TlsOrigin() {
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
    const std::string first = head.substr(0, head.find("\r\n\r\n"));
    {
      std::lock_guard<std::mutex> lock(mu_);
      heads_.push_back(first);
    }
    if (!git_root_.empty() && first.find(" /git/") != std::string::npos) {
      (void)(*tls)->Write(Git(**tls, head));
      (void)(*tls)->CloseWrite();
      return;
    }
    (void)(*tls)->Write(
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nSet-Cookie: session=from-origin\r\n"
        "Connection: close\r\n\r\nok\n");
    (void)(*tls)->CloseWrite();
  }

  // The value of a request header (the first of the name, compared without case); "".
  static std::string Header(const std::string& head, const std::string& name) {
    std::string lower = AsciiLower(head);
    size_t at = lower.find("\r\n" + AsciiLower(name) + ":");
    if (at == std::string::npos) return "";
    size_t from = at + 3 + name.size();
    std::string v = head.substr(from, head.find("\r\n", from) - from);
    while (!v.empty() && v.front() == ' ') v.erase(0, 1);
    return v;
  }

  // One smart-HTTP request through git http-backend; the whole response, Connection: close.
  std::string Git(egress::TlsStream& tls, std::string buffered) {
    if (Header(buffered, "authorization") != git_auth_) {
      return "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"forge\"\r\n"
             "Content-Length: 0\r\nConnection: close\r\n\r\n";
    }
    size_t end = buffered.find("\r\n\r\n") + 4;
    std::string line = buffered.substr(0, buffered.find("\r\n"));
    std::string method = line.substr(0, line.find(' '));
    std::string target = line.substr(line.find(' ') + 1);
    target = target.substr(0, target.find(' '));
    std::string path = target.substr(4, target.find('?') - 4);  // after "/git"
    std::string query =
        target.find('?') == std::string::npos ? "" : target.substr(target.find('?') + 1);
    size_t length = static_cast<size_t>(std::atoll(Header(buffered, "content-length").c_str()));
    std::string body = buffered.substr(end);
    while (body.size() < length) {
      auto more = tls.Read(65536, Clock::now() + std::chrono::seconds(30));
      if (!more.ok() || more->empty()) return "";
      body += *more;
    }
    auto dir = TempDir::Make(::testing::TempDir(), "git_cgi");
    if (!dir.ok()) return "";
    const std::string in = dir->path() + "/in", out = dir->path() + "/out";
    if (!WriteFileAtomic(in, body).ok()) return "";
    auto in_fd = OpenFile(in, O_RDONLY);
    auto out_fd = OpenFile(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (!in_fd.ok() || !out_fd.ok()) return "";
    SpawnOptions o;
    o.argv = {"git", "http-backend"};
    o.env =
        std::vector<std::string>{"PATH=/usr/bin:/bin",
                                 "GIT_PROJECT_ROOT=" + git_root_,
                                 "GIT_HTTP_EXPORT_ALL=1",
                                 "REQUEST_METHOD=" + method,
                                 "PATH_INFO=" + path,
                                 "QUERY_STRING=" + query,
                                 "CONTENT_TYPE=" + Header(buffered, "content-type"),
                                 "CONTENT_LENGTH=" + std::to_string(body.size()),
                                 "HTTP_CONTENT_ENCODING=" + Header(buffered, "content-encoding"),
                                 "GIT_PROTOCOL=" + Header(buffered, "git-protocol"),
                                 "REMOTE_USER=x-access-token",
                                 "REMOTE_ADDR=127.0.0.1"};
    o.stdin_fd = in_fd->get();
    o.stdout_fd = out_fd->get();
    auto child = ChildProcess::Spawn(o);
    if (!child.ok() || !child->WaitFor(std::chrono::seconds(60)).ok()) return "";
    auto cgi = ReadFileToString(out);
    if (!cgi.ok()) return "";
    size_t split = cgi->find("\r\n\r\n");
    size_t skip = 4;
    if (split == std::string::npos) {
      split = cgi->find("\n\n");
      skip = 2;
    }
    if (split == std::string::npos) return "";
    std::string status = "200 OK", headers;
    std::string cgi_head = cgi->substr(0, split) + "\n";
    for (size_t at = 0; at < cgi_head.size();) {
      size_t nl = cgi_head.find('\n', at);
      std::string h = cgi_head.substr(at, nl - at);
      if (!h.empty() && h.back() == '\r') h.pop_back();
      at = nl + 1;
      if (h.empty()) continue;
      if (h.rfind("Status:", 0) == 0) {
        status = h.substr(h.find_first_not_of(' ', 7));
      } else {
        headers += h + "\r\n";
      }
    }
    std::string payload = cgi->substr(split + skip);
    return "HTTP/1.1 " + status + "\r\n" + headers +
           "Content-Length: " + std::to_string(payload.size()) + "\r\nConnection: close\r\n\r\n" +
           payload;
  }

  const std::string git_root_;
  const std::string git_auth_;
  std::shared_ptr<SSL_CTX> ctx_;
  TcpListener l_;
  std::thread accept_;
  std::mutex mu_;
  std::vector<std::thread> conns_;
  std::vector<std::string> heads_;
};

// Occurrences of `needle` in the file at `path`, read in overlapping blocks.
int64_t CountInFile(const std::string& path, const std::string& needle) {
  auto fd = OpenFile(path, O_RDONLY);
  if (!fd.ok()) return -1;
  int64_t hits = 0;
  std::string carry;
  std::string block(8 << 20, '\0');
  for (;;) {
    auto n = ReadSome(fd->get(), block.data(), block.size());
    if (!n.ok()) return -1;
    if (*n == 0) break;
    std::string hay = carry + block.substr(0, *n);
    for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) {
      ++hits;
    }
    size_t keep = std::min(hay.size(), needle.size() - 1);
    carry = hay.substr(hay.size() - keep);
  }
  return hits;
}

class SecretsE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The origins write on sockets the proxy may already have closed (a TLS 1.3 server sends
    // its session tickets after the handshake; the proxy closes an upstream at once when an
    // HTTP rule refuses the request): EPIPE, not a signal that ends the test process, as in
    // tryboxd. A CI run died of it.
    ::signal(SIGPIPE, SIG_IGN);
    ca_ = egress::CertAuthority::Create("trybox test upstream CA").value().release();
    rogue_ca_ = egress::CertAuthority::Create("a CA nobody trusts").value().release();
    api_ = new TlsOrigin(*ca_, "api.secret.test");
    other_ = new TlsOrigin(*ca_, "other.secret.test");
    rogue_ = new TlsOrigin(*rogue_ca_, "rogue.secret.test");
    git_root_ = new TempDir(TempDir::Make(::testing::TempDir(), "forge_git").value());
    ASSERT_TRUE(MakeBareRepo("me/proj", "the open repository\n"));
    ASSERT_TRUE(MakeBareRepo("me/other", "a repository the rules keep closed\n"));
    forge_ = new TlsOrigin(*ca_, "forge.secret.test", git_root_->path(),
                           "Basic " + Base64(std::string("x-access-token:") + kGhValue));
    auto h = Harness::Start();
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    h_ = h->release();
    ASSERT_TRUE(h_->StopDaemon().ok());
    ASSERT_TRUE(MakeDirs(h_->home() + "/config", 0700).ok());
    ASSERT_TRUE(WriteFileAtomic(h_->home() + "/config/upstream-ca.pem", ca_->cert_pem()).ok());
    std::string api = std::to_string(api_->port()), other = std::to_string(other_->port()),
                rogue = std::to_string(rogue_->port()), forge = std::to_string(forge_->port());
    Json config = {
        {"resolve",
         {{"api.secret.test", {"127.0.0.1"}},
          {"other.secret.test", {"127.0.0.1"}},
          {"rogue.secret.test", {"127.0.0.1"}},
          {"forge.secret.test", {"127.0.0.1"}}}},
        {"internal_allow",
         {"127.0.0.1:" + api, "127.0.0.1:" + other, "127.0.0.1:" + rogue, "127.0.0.1:" + forge}},
        {"upstream_ca_file", h_->home() + "/config/upstream-ca.pem"}};
    ASSERT_TRUE(WriteFileAtomic(h_->home() + "/config/egress.json", config.dump()).ok());
    ASSERT_TRUE(h_->RestartDaemon().ok());
    ASSERT_TRUE(WriteFileAtomic(h_->home() + "/gh.token", std::string(kGhValue) + "\n").ok());
    ASSERT_TRUE(WriteFileAtomic(h_->home() + "/other.token", kOtherValue).ok());
    CliResult r = h_->Cli(
        {"create", "--memory", "256", "--allow", "api.secret.test:" + api, "--allow",
         "other.secret.test:" + other, "--allow", "rogue.secret.test:" + rogue, "--secret",
         "GH_TOKEN=file:" + h_->home() + "/gh.token@api.secret.test", "--secret",
         "OTHER_TOKEN=file:" + h_->home() + "/other.token@other.secret.test,rogue.secret.test"});
    ASSERT_EQ(r.code, 0) << r.err;
    id_ = r.out.substr(0, r.out.find('\n'));
  }
  static void TearDownTestSuite() {
    delete h_;
    delete api_;
    delete other_;
    delete rogue_;
    delete forge_;
    delete git_root_;
    delete ca_;
    delete rogue_ca_;
    h_ = nullptr;
  }
  void SetUp() override { ASSERT_FALSE(id_.empty()); }

  static CliResult Sh(const std::string& script) {
    return h_->Cli({"exec", id_, "--", "bash", "-c", script});
  }
  static std::string Url(TlsOrigin* o, const std::string& host, const std::string& path) {
    return "https://" + host + ":" + std::to_string(o->port()) + path;
  }
  static std::string Placeholder(const std::string& name) {
    CliResult r = Sh("printf %s \"$" + name + "\"");
    EXPECT_EQ(r.code, 0) << r.err;
    return r.out;
  }

  static Harness* h_;
  static egress::CertAuthority* ca_;
  static egress::CertAuthority* rogue_ca_;
  static TlsOrigin* api_;
  static TlsOrigin* other_;
  static TlsOrigin* rogue_;
  static TlsOrigin* forge_;
  static TempDir* git_root_;
  static std::string id_;

  // A bare repository git_root_/NAME.git with one commit holding README.
  static bool MakeBareRepo(const std::string& name, const std::string& readme) {
    std::string slug = name;
    for (char& ch : slug) ch = ch == '/' ? '-' : ch;
    const std::string work = git_root_->path() + "/src-" + slug;
    const std::string bare = git_root_->path() + "/" + name + ".git";
    if (!MakeDirs(work, 0755).ok() || !WriteFileAtomic(work + "/README", readme).ok()) return false;
    const std::string cmd = "git init -q -b main " + work + " && git -C " + work +
                            " add README && git -C " + work +
                            " -c user.name=t -c user.email=t@t commit -q -m one && "
                            "git clone -q --bare " +
                            work + " " + bare;
    return std::system(cmd.c_str()) == 0;
  }
};
Harness* SecretsE2E::h_ = nullptr;
egress::CertAuthority* SecretsE2E::ca_ = nullptr;
egress::CertAuthority* SecretsE2E::rogue_ca_ = nullptr;
TlsOrigin* SecretsE2E::api_ = nullptr;
TlsOrigin* SecretsE2E::other_ = nullptr;
TlsOrigin* SecretsE2E::rogue_ = nullptr;
TlsOrigin* SecretsE2E::forge_ = nullptr;
TempDir* SecretsE2E::git_root_ = nullptr;
std::string SecretsE2E::id_;

TEST_F(SecretsE2E, CurlAuthenticatesWithThePlaceholderAndTheBoundHostGetsTheRealValue) {
  std::string ph = Placeholder("GH_TOKEN");
  ASSERT_EQ(ph.size(), std::string(kGhValue).size());
  EXPECT_NE(ph, kGhValue);
  size_t before = api_->heads().size();
  // No --cacert: the VM's CA is in the guest's trust store.
  CliResult r = Sh("curl -sS -i -p -H \"Authorization: Bearer $GH_TOKEN\" '" +
                   Url(api_, "api.secret.test", "/repos?token=") + "'\"$GH_TOKEN\"");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("ok"), std::string::npos) << r.out;
  // The session an origin sets lands nowhere: Set-Cookie from a secret's host is dropped.
  EXPECT_EQ(r.out.find("Set-Cookie"), std::string::npos) << r.out;
  auto heads = api_->heads();
  ASSERT_EQ(heads.size(), before + 1);
  const std::string& head = heads.back();
  EXPECT_NE(head.find("Authorization: Bearer " + std::string(kGhValue)), std::string::npos)
      << "the origin did not get the real value in the header";
  EXPECT_NE(head.find("/repos?token=" + std::string(kGhValue)), std::string::npos)
      << "the origin did not get the real value in the query string";
  EXPECT_EQ(head.find(ph), std::string::npos) << "a placeholder reached the origin";
}

TEST_F(SecretsE2E, PythonsUrllibAuthenticatesWithThePlaceholder) {
  size_t before = api_->heads().size();
  // urllib reads https_proxy and the system bundle that holds the VM's CA.
  CliResult r =
      Sh("python3 -c 'import os, urllib.request as u; "
         "q = u.Request(\"" +
         Url(api_, "api.secret.test", "/py") +
         "\", headers={\"Authorization\": \"token \" + os.environ[\"GH_TOKEN\"]}); "
         "print(u.urlopen(q).read().decode())'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("ok"), std::string::npos) << r.out;
  auto heads = api_->heads();
  ASSERT_EQ(heads.size(), before + 1);
  EXPECT_NE(heads.back().find("Authorization: token " + std::string(kGhValue)), std::string::npos)
      << "the origin did not get the real value from Python";
}

// A program that ignores the proxy variables (Node's fetch does) reaches the host through
// the guest's resolver and the transparent path, and is intercepted there the same way.
TEST_F(SecretsE2E, AProgramIgnoringTheProxyIsInterceptedOnTheTransparentPathToo) {
  size_t before = api_->heads().size();
  CliResult r = Sh("curl -sS --noproxy '*' -H \"Authorization: Bearer $GH_TOKEN\" " +
                   Url(api_, "api.secret.test", "/transparent"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("ok"), std::string::npos) << r.out;
  auto heads = api_->heads();
  ASSERT_EQ(heads.size(), before + 1);
  EXPECT_EQ(heads.back().rfind("GET /transparent HTTP/1.1\r\n", 0), 0u) << heads.back();
  EXPECT_NE(heads.back().find("Authorization: Bearer " + std::string(kGhValue)), std::string::npos);
  CliResult audit = h_->Cli({"audit", "--vm", id_, "--json"});
  ASSERT_EQ(audit.code, 0) << audit.err;
  bool found = false;
  for (const auto& row : Json::parse(audit.out)) {
    found = found ||
            (row.value("method", "") == "TCP" && row.value("host", "") == "api.secret.test" &&
             row.value("reason", "").find("TLS intercepted for its secrets") != std::string::npos);
  }
  EXPECT_TRUE(found) << audit.out;
}

TEST_F(SecretsE2E, BasicAuthCarriesTheRealValueInsideItsBase64) {
  size_t before = api_->heads().size();
  CliResult r = Sh("curl -sS -p -u \"bot:$GH_TOKEN\" " + Url(api_, "api.secret.test", "/basic"));
  ASSERT_EQ(r.code, 0) << r.err;
  auto heads = api_->heads();
  ASSERT_EQ(heads.size(), before + 1);
  EXPECT_NE(heads.back().find("Authorization: Basic " + Base64("bot:" + std::string(kGhValue))),
            std::string::npos);
}

TEST_F(SecretsE2E, APlaceholderSentToAHostOfAnotherSecretIsRefusedAndAudited) {
  size_t before = other_->heads().size();
  CliResult r = Sh("curl -sS -i -p -H \"Authorization: Bearer $GH_TOKEN\" " +
                   Url(other_, "other.secret.test", "/steal"));
  EXPECT_NE(r.out.find("403"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("secret GH_TOKEN may go only to its hosts"), std::string::npos) << r.out;
  EXPECT_EQ(other_->heads().size(), before) << "the refused request reached the origin";
  CliResult audit = h_->Cli({"audit", "--vm", id_, "--json"});
  ASSERT_EQ(audit.code, 0) << audit.err;
  EXPECT_NE(audit.out.find("secret GH_TOKEN may go only to its hosts"), std::string::npos)
      << audit.out;
  // The other secret's own host still works.
  r = Sh("curl -sS -p -H \"X-Key: $OTHER_TOKEN\" " + Url(other_, "other.secret.test", "/ok"));
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(other_->heads().size(), before + 1);
  EXPECT_NE(other_->heads().back().find(std::string("X-Key: ") + kOtherValue), std::string::npos);
}

TEST_F(SecretsE2E, AnOriginWhoseCertificateTheHostDoesNotTrustIsRefusedWithTheReason) {
  CliResult r = Sh("curl -sS -p -H \"X-Key: $OTHER_TOKEN\" " +
                   Url(rogue_, "rogue.secret.test", "/") + " 2>&1; echo rc=$?");
  EXPECT_NE(r.out.find("rc=56"), std::string::npos) << r.out;  // CONNECT answered 502
  EXPECT_TRUE(rogue_->heads().empty());
  CliResult audit = h_->Cli({"audit", "--vm", id_, "--json"});
  ASSERT_EQ(audit.code, 0) << audit.err;
  EXPECT_NE(audit.out.find("not trusted"), std::string::npos) << audit.out;
}

// HTTP rules without any secret: the forge's host is intercepted with the VM's CA (trusted
// in the guest without a secret), one repository is open, the rest of the forge is refused
// with the rule named, in the guest's answer and the audit, and plain HTTP to it is refused.
TEST_F(SecretsE2E, HttpRulesOpenAForgeForOneRepositoryAndRefuseTheRestNamingTheRule) {
  const std::string forge = "forge.secret.test:" + std::to_string(forge_->port());
  CliResult c =
      h_->Cli({"create", "--memory", "256", "--allow", forge, "--allow", "forge.secret.test:80",
               "--http-rule", "deny * forge.secret.test/repos/me/proj/settings", "--http-rule",
               "allow GET,POST forge.secret.test/repos/me/proj"});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = c.out.substr(0, c.out.find('\n'));
  auto sh = [&](const std::string& script) {
    return h_->Cli({"exec", vm, "--", "bash", "-c", script});
  };
  size_t before = forge_->heads().size();
  CliResult ok =
      sh("curl -sS -p -X POST " + Url(forge_, "forge.secret.test", "/repos/me/proj/issues"));
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("ok"), std::string::npos) << ok.out;
  ASSERT_EQ(forge_->heads().size(), before + 1);
  EXPECT_EQ(forge_->heads().back().rfind("POST /repos/me/proj/issues HTTP/1.1\r\n", 0), 0u)
      << forge_->heads().back();

  CliResult other = sh("curl -sS -i -p " + Url(forge_, "forge.secret.test", "/repos/me/other"));
  EXPECT_NE(other.out.find("HTTP/1.1 403"), std::string::npos) << other.out << other.err;
  EXPECT_NE(other.out.find("no HTTP rule for forge.secret.test allows GET /repos/me/other"),
            std::string::npos)
      << other.out;
  CliResult settings =
      sh("curl -sS -i -p " + Url(forge_, "forge.secret.test", "/repos/ME/proj/settings/keys"));
  EXPECT_NE(settings.out.find("HTTP rule 'deny * forge.secret.test/repos/me/proj/settings' "
                              "refuses GET /repos/ME/proj/settings/keys"),
            std::string::npos)
      << settings.out;
  CliResult plain = sh("curl -sS -i http://forge.secret.test/repos/me/proj");
  EXPECT_NE(plain.out.find("403"), std::string::npos) << plain.out << plain.err;
  EXPECT_NE(plain.out.find("plain HTTP to it is refused"), std::string::npos) << plain.out;
  EXPECT_EQ(forge_->heads().size(), before + 1) << "a refused request reached the origin";

  CliResult audit = h_->Cli({"audit", "--vm", vm, "--json"});
  ASSERT_EQ(audit.code, 0) << audit.err;
  EXPECT_NE(audit.out.find("TLS intercepted for its HTTP rules"), std::string::npos) << audit.out;
  EXPECT_NE(audit.out.find("no HTTP rule for forge.secret.test allows GET /repos/me/other"),
            std::string::npos)
      << audit.out;
  // A rule that does not parse is refused at create, naming it, and no VM is left.
  CliResult bad = h_->Cli({"create", "--memory", "256", "--http-rule", "allow get forge.test"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("HTTP rule 0"), std::string::npos) << bad.err;
  EXPECT_EQ(h_->Cli({"rm", vm}).code, 0);
}

// git over HTTPS with a token, as a forge is used: the guest's git sends the placeholder in
// Basic credentials, the origin's git http-backend sees the real value and serves the clone;
// the HTTP rules open one repository, and a clone of another is refused before the origin
// hears of it.
TEST_F(SecretsE2E, GitClonesOverHttpsWithTheTokenOnlyTheRepositoryTheRulesOpen) {
  const std::string port = std::to_string(forge_->port());
  CliResult c = h_->Cli({"create", "--memory", "256", "--allow", "forge.secret.test:" + port,
                         "--secret", "GH_TOKEN=file:" + h_->home() + "/gh.token@forge.secret.test",
                         "--http-rule", "allow GET,POST forge.secret.test/git/me/proj.git"});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = c.out.substr(0, c.out.find('\n'));
  auto clone = [&](const std::string& repo) {
    const std::string into = "/root/clone-" + repo.substr(repo.find('/') + 1);
    return h_->Cli({"exec", vm, "--", "bash", "-c",
                    "auth=$(printf 'x-access-token:%s' \"$GH_TOKEN\" | base64 -w0); "
                    "git -c http.extraHeader=\"Authorization: Basic $auth\" clone -q "
                    "https://forge.secret.test:" +
                        port + "/git/" + repo + ".git " + into + " 2>&1 && cat " + into +
                        "/README"});
  };
  size_t before = forge_->heads().size();
  CliResult ok = clone("me/proj");
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("the open repository"), std::string::npos) << ok.out;
  auto heads = forge_->heads();
  ASSERT_GT(heads.size(), before);
  // Every request of the clone carried the real value (the backend answers 401 otherwise).
  const std::string real =
      "Authorization: Basic " + Base64(std::string("x-access-token:") + kGhValue);
  for (size_t i = before; i < heads.size(); ++i) {
    EXPECT_TRUE(heads[i].rfind("GET /git/me/proj.git/", 0) == 0 ||
                heads[i].rfind("POST /git/me/proj.git/", 0) == 0)
        << heads[i];
    EXPECT_NE(heads[i].find(real), std::string::npos) << "request " << i << " lacked the value";
  }
  before = heads.size();
  CliResult closed = clone("me/other");
  EXPECT_NE(closed.code, 0) << closed.out;
  EXPECT_NE(closed.out.find("403"), std::string::npos) << closed.out;
  EXPECT_EQ(forge_->heads().size(), before) << "a refused request reached the origin";
  EXPECT_EQ(h_->Cli({"rm", vm}).code, 0);
}

// Last in the file: after every use above, the value is nowhere in the guest's memory or
// disk layer, nor in the daemon's log or store, while the placeholder is (the control that
// shows the search would have found it).
TEST_F(SecretsE2E, ZZTheValueIsNowhereInTheGuestsMemoryDiskOrTheDaemonsRecords) {
  std::string ph = Placeholder("GH_TOKEN");
  for (int i = 0; i < 5; ++i) {
    CliResult r = Sh("curl -sS -p -H \"Authorization: Bearer $GH_TOKEN\" " +
                     Url(api_, "api.secret.test", "/again") + " >/dev/null && echo " + ph +
                     " > /root/placeholder-on-disk && sync");
    ASSERT_EQ(r.code, 0) << r.err << h_->Cli({"audit", "--vm", id_}).out
                         << ReadFileToString(h_->home() + "/tryboxd.log").value_or("");
  }
  std::string vm_dir = h_->vms_dir() + "/" + id_;
  auto dump_dir = TempDir::Make("/tmp", "tbx-memdump-").value();
  std::string dump = dump_dir.path() + "/guest.mem";
  {
    auto out = OpenFile(dump, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(out.ok());
    auto qmp = vmm::Qmp::Connect(vm_dir + "/qmp.sock", Clock::now() + std::chrono::seconds(30));
    ASSERT_TRUE(qmp.ok()) << qmp.status().ToString();
    ASSERT_TRUE(qmp->Execute("getfd", {{"fdname", "memdump"}}, out->get()).ok());
    auto done = qmp->Execute("dump-guest-memory", {{"paging", false}, {"protocol", "fd:memdump"}});
    ASSERT_TRUE(done.ok()) << done.status().ToString();
  }
  struct stat st {};
  ASSERT_EQ(::stat(dump.c_str(), &st), 0);
  EXPECT_GT(st.st_size, 200 << 20) << "the dump does not hold the guest's memory";
  const std::string value = kGhValue;
  for (const std::string& form : {value, Base64(value), Base64("bot:" + value)}) {
    EXPECT_EQ(CountInFile(dump, form), 0) << "a form of the value is in the guest's memory";
  }
  EXPECT_GT(CountInFile(dump, ph), 0) << "the search cannot find even the placeholder";
  // The VM's disk layer: every file of its directory (overlay, transfer disk...).
  std::vector<std::string> files = ListDir(vm_dir).value_or(std::vector<std::string>{});
  int64_t ph_on_disk = 0;
  for (const auto& f : files) {
    std::string path = vm_dir + "/" + f;
    struct stat fs {};
    if (::stat(path.c_str(), &fs) != 0 || !S_ISREG(fs.st_mode)) continue;
    EXPECT_EQ(CountInFile(path, value), 0) << path;
    ph_on_disk += std::max<int64_t>(0, CountInFile(path, ph));
  }
  EXPECT_GT(ph_on_disk, 0) << "the disk search cannot find even the placeholder";
  // The trusted side's records.
  for (const std::string& path : {h_->home() + "/tryboxd.log", h_->home() + "/state/trybox.db",
                                  h_->home() + "/state/trybox.db-wal"}) {
    struct stat ps {};
    if (::stat(path.c_str(), &ps) != 0) continue;
    EXPECT_EQ(CountInFile(path, value), 0) << path;
  }
}

}  // namespace
}  // namespace trybox::e2e
