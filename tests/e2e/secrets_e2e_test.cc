// End to end (issue 13): a real guest is given a secret as a placeholder, and the daemon's
// egress proxy puts the real value in only on HTTPS requests to the secret's hosts. The
// upstreams are TLS servers on the host's loopback with certificates from a test CA that the
// daemon trusts through egress.json's upstream_ca_file; names resolve through the resolver
// map and are reached through internal_allow, so nothing leaves loopback. The proof at the
// end searches the guest's whole memory and its disk layer for the value.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "egress/tls.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/secrets_support.h"
#include "util/ascii.h"
#include "util/fd.h"
#include "util/utf8.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

// The real values. Never printed by a passing test; the guest must never hold them.
constexpr char kGhValue[] = "ghs-REAL-0f3c9a7e51d24b6b8a1e2d3c4b5a6978";
constexpr char kOtherValue[] = "other-REAL-7d6c5b4a39281706f5e4d3c2b1a0";

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
                           "Basic " + Base64Encode(std::string("x-access-token:") + kGhValue));
    auto h = Harness::Start();
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    h_ = h->release();
    Status served = ServeOriginsByName(*h_, *ca_,
                                       {{"api.secret.test", api_->port()},
                                        {"other.secret.test", other_->port()},
                                        {"rogue.secret.test", rogue_->port()},
                                        {"forge.secret.test", forge_->port()}});
    ASSERT_TRUE(served.ok()) << served.ToString();
    std::string api = std::to_string(api_->port()), other = std::to_string(other_->port()),
                rogue = std::to_string(rogue_->port());
    ASSERT_TRUE(WriteFileAtomic(h_->home() + "/gh.token", std::string(kGhValue) + "\n").ok());
    ASSERT_TRUE(WriteFileAtomic(h_->home() + "/other.token", kOtherValue).ok());
    CliResult r = h_->Cli(
        {"create", "--memory", "256", "--allow", "api.secret.test:" + api, "--allow",
         "other.secret.test:" + other, "--allow", "rogue.secret.test:" + rogue, "--secret",
         "GH_TOKEN=file:" + h_->home() + "/gh.token@api.secret.test+target", "--secret",
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

  static CliResult Sh(const std::string& script) { return ShIn(*h_, id_, script); }
  static std::string Url(TlsOrigin* o, const std::string& host, const std::string& path) {
    return OriginUrl(*o, host, path);
  }
  static std::string Placeholder(const std::string& name) {
    return GuestPlaceholder(*h_, id_, name);
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

// curl offers h2 and http/1.1 in ALPN and gets HTTP/2 (the relay serves it, intercept_h2.h);
// asked for HTTP/1.1 only, it gets that. Either way the value goes in the same places.
TEST_F(SecretsE2E, CurlAuthenticatesWithThePlaceholderAndTheBoundHostGetsTheRealValue) {
  std::string ph = Placeholder("GH_TOKEN");
  ASSERT_EQ(ph.size(), std::string(kGhValue).size());
  EXPECT_NE(ph, kGhValue);
  for (const std::string version : {"2", "1.1"}) {
    SCOPED_TRACE("HTTP/" + version);
    size_t before = api_->heads().size();
    // No --cacert: the VM's CA is in the guest's trust store.
    CliResult r = Sh("curl -sS -i -p --http" + version +
                     " -w 'version=%{http_version}\\n' -H \"Authorization: Bearer $GH_TOKEN\" '" +
                     Url(api_, "api.secret.test", "/repos?token=") + "'\"$GH_TOKEN\"");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("ok"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("version=" + version + "\n"), std::string::npos) << r.out;
    // The session an origin sets lands nowhere: Set-Cookie from a secret's host is dropped.
    EXPECT_EQ(AsciiLower(r.out).find("set-cookie"), std::string::npos) << r.out;
    auto heads = api_->heads();
    ASSERT_EQ(heads.size(), before + 1);
    const std::string& head = heads.back();
    EXPECT_TRUE(HasField(head, "Authorization", "Bearer " + std::string(kGhValue)))
        << "the origin did not get the real value in the header";
    EXPECT_NE(head.find("/repos?token=" + std::string(kGhValue)), std::string::npos)
        << "the origin did not get the real value in the query string";
    EXPECT_EQ(head.find(ph), std::string::npos) << "a placeholder reached the origin";
  }
  CliResult audit = h_->Cli({"audit", "--vm", id_, "--json"});
  EXPECT_NE(audit.out.find("HTTP/2 with the guest"), std::string::npos) << audit.out;
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
  EXPECT_TRUE(HasField(heads.back(), "Authorization", "token " + std::string(kGhValue)))
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
  EXPECT_TRUE(HasField(heads.back(), "Authorization", "Bearer " + std::string(kGhValue)));
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
  EXPECT_TRUE(HasField(heads.back(), "Authorization",
                       "Basic " + Base64Encode("bot:" + std::string(kGhValue))));
}

// Bodies: a secret declared with "body": true (secrets.json, the only place to say so) is put
// into a request body; one without is not, in the same request. Over HTTP/2 and HTTP/1.1.
TEST_F(SecretsE2E, OnlyASecretDeclaredWithBodyIsPutIntoABody) {
  const std::string body_value = "body-REAL-5e4d3c2b1a0f9e8d7c6b5a49";
  ASSERT_TRUE(WriteFileAtomic(h_->home() + "/body.token", body_value).ok());
  ASSERT_TRUE(MakeDirs(h_->home() + "/config", 0700).ok());
  ASSERT_TRUE(WriteFileAtomic(h_->home() + "/config/secrets.json",
                              Json{{"BODY_TOKEN",
                                    {{"source", "file:" + h_->home() + "/body.token"},
                                     {"hosts", {"api.secret.test"}},
                                     {"body", true}}}}
                                  .dump())
                  .ok());
  CliResult c =
      h_->Cli({"create", "--memory", "256", "--allow",
               "api.secret.test:" + std::to_string(api_->port()), "--secret", "BODY_TOKEN",
               "--secret", "GH_TOKEN=file:" + h_->home() + "/gh.token@api.secret.test"});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = c.out.substr(0, c.out.find('\n'));
  const std::string gh_ph = GuestPlaceholder(*h_, vm, "GH_TOKEN");
  for (const std::string version : {"2", "1.1"}) {
    SCOPED_TRACE("HTTP/" + version);
    size_t before = api_->bodies().size();
    CliResult r =
        ShIn(*h_, vm,
             "curl -sS -p --http" + version + " --data-binary \"a=$BODY_TOKEN&b=$GH_TOKEN\" " +
                 OriginUrl(*api_, "api.secret.test", "/form"));
    ASSERT_EQ(r.code, 0) << r.err;
    auto bodies = api_->bodies();
    ASSERT_EQ(bodies.size(), before + 1);
    // Compared without printing: a failure must not put a value into the test's output.
    EXPECT_TRUE(bodies.back() == "a=" + body_value + "&b=" + gh_ph)
        << "only the body secret's placeholder is replaced in a body";
  }
  EXPECT_EQ(h_->Cli({"rm", vm}).code, 0);
  ::unlink((h_->home() + "/config/secrets.json").c_str());
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
  EXPECT_TRUE(HasField(other_->heads().back(), "X-Key", kOtherValue));
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
  EXPECT_NE(other.out.find(" 403"), std::string::npos) << other.out << other.err;
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
  const std::string real = "Basic " + Base64Encode(std::string("x-access-token:") + kGhValue);
  for (size_t i = before; i < heads.size(); ++i) {
    EXPECT_TRUE(heads[i].rfind("GET /git/me/proj.git/", 0) == 0 ||
                heads[i].rfind("POST /git/me/proj.git/", 0) == 0)
        << heads[i];
    EXPECT_TRUE(HasField(heads[i], "Authorization", real))
        << "request " << i << " lacked the value";
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
  const std::string value = kGhValue;
  ExpectValueNowhereButPlaceholderFound(
      *h_, id_, {value, Base64Encode(value), Base64Encode("bot:" + value)}, ph, 200 << 20);
}

}  // namespace
}  // namespace trybox::e2e
