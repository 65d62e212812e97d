// End to end: egress from a real guest through trybox-init's relay and tryboxd's proxy to an
// HTTP upstream this test serves on the host's loopback. Names resolve through the daemon's
// resolver map and the upstream is reached through the operator's internal_allow override,
// so nothing ever leaves loopback. Each isolation layer is then shown to hold on its own.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tests/e2e/harness.h"
#include "tests/e2e/upstream.h"
#include "util/sha256.h"
#include "util/tcp.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A harness whose daemon reads `config` as its egress.json.
std::unique_ptr<Harness> StartWithEgressConfig(const Json& config) {
  auto h = Harness::Start();
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  if (!h.ok()) return nullptr;
  EXPECT_TRUE((*h)->StopDaemon().ok());
  EXPECT_TRUE(MakeDirs((*h)->home() + "/config", 0700).ok());
  EXPECT_TRUE(WriteFileAtomic((*h)->home() + "/config/egress.json", config.dump()).ok());
  Status st = (*h)->RestartDaemon();
  EXPECT_TRUE(st.ok()) << st.ToString();
  return std::move(*h);
}

// A QEMU of this daemon. Every one (VMs, spare clones, template builds) is confined
// alike, so any will do.
pid_t QemuPidOf(const Harness& h) {
  auto pids = h.QemuPids();
  return pids.empty() ? -1 : pids[0];
}

std::string NetNs(pid_t pid) {
  char buf[64] = {};
  std::string link = "/proc/" + std::to_string(pid) + "/ns/net";
  ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

std::string StatusField(pid_t pid, const std::string& field) {
  auto s = ReadFileToString("/proc/" + std::to_string(pid) + "/status").value_or("");
  size_t at = s.find("\n" + field + ":");
  if (at == std::string::npos) return "";
  size_t start = at + field.size() + 2;
  std::string v = s.substr(start, s.find('\n', start) - start);
  while (!v.empty() && (v.front() == '\t' || v.front() == ' ')) v.erase(0, 1);
  return v;
}

// `openssl s_server -www` on loopback with a self-signed certificate for upstream.test: the
// guest's curl must verify it end to end, through the tunnel.
struct TlsUpstream {
  TlsUpstream() {
    tmp.emplace(TempDir::Make("/tmp", "tbx-tls-").value());
    dir = tmp->path();
    Status st = RunChecked({"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                            dir + "/key.pem", "-out", dir + "/cert.pem", "-days", "1", "-subj",
                            "/CN=upstream.test", "-addext", "subjectAltName=DNS:upstream.test"},
                           std::chrono::seconds(60));
    EXPECT_TRUE(st.ok()) << st.ToString();
    // A free port: bound, read, released, then taken by s_server.
    port = std::to_string(ListenTcpLoopback(0).value().port);
    SpawnOptions o;
    o.argv = {"openssl",           "s_server", "-quiet",          "-www", "-accept",
              "127.0.0.1:" + port, "-cert",    dir + "/cert.pem", "-key", dir + "/key.pem"};
    server = ChildProcess::Spawn(o).value();
    for (int i = 0; i < 500 && !ConnectTcpLoopback(std::stoi(port)).ok(); ++i) ::usleep(10000);
  }
  std::optional<TempDir> tmp;
  std::string dir;
  std::string port;
  ChildProcess server;
};

// `git daemon` on loopback serving one repository with one commit: a protocol (git://,
// port 9418 by default) that no proxy variable covers.
struct GitUpstream {
  GitUpstream() {
    tmp.emplace(TempDir::Make("/tmp", "tbx-git-").value());
    const std::string work = tmp->path() + "/work";
    Status st = RunChecked({"bash", "-c",
                            "set -e; git init -q -b main " + work + "; cd " + work +
                                "; echo 'served over git://' > README; git add README; "
                                "git -c user.name=t -c user.email=t@t commit -qm first; "
                                "git clone -q --bare . ../repo.git"},
                           std::chrono::seconds(60));
    EXPECT_TRUE(st.ok()) << st.ToString();
    port = std::to_string(ListenTcpLoopback(0).value().port);
    SpawnOptions o;
    o.argv = {"git",
              "daemon",
              "--reuseaddr",
              "--export-all",
              "--listen=127.0.0.1",
              "--port=" + port,
              "--base-path=" + tmp->path(),
              tmp->path()};
    server = ChildProcess::Spawn(o).value();
    for (int i = 0; i < 500 && !ConnectTcpLoopback(std::stoi(port)).ok(); ++i) ::usleep(10000);
  }
  std::optional<TempDir> tmp;
  std::string port;
  ChildProcess server;
};

// The whole suite runs once per egress mode and, in each mode, once more with layer 1 (QEMU
// in a network namespace of its own, under a uid of its own) removed, so that every
// refusal below is shown to hold by the proxy alone. Each run is a ctest entry of its own
// (one daemon, one VM), so they run side by side.
struct EgressRun {
  const char* name;
  bool internet;       // the VM is created with --internet (--deny evil.test) instead of a list
  bool qemu_isolated;  // layer 1 on (the default)
};
void PrintTo(const EgressRun& r, std::ostream* os) { *os << r.name; }

class EgressE2E : public ::testing::TestWithParam<EgressRun> {
 protected:
  // One daemon and VM per process: each instantiation runs in a process of its own (ctest
  // filters by its name), and the first test of it starts them.
  static void StartSuite(const EgressRun& run) {
    run_ = run;
    up_ = new HttpUpstream();
    port_ = std::to_string(up_->port());
    tls_ = new TlsUpstream();
    model_ = new HttpUpstream();  // the operator's model server: in no internal_allow
    git_ = new GitUpstream();
    Json config = {{"model_route", "127.0.0.1:" + std::to_string(model_->port())},
                   {"resolve",
                    {{"upstream.test", {"127.0.0.1"}},
                     {"evil.test", {"127.0.0.1"}},
                     {"other.test", {"127.0.0.1"}},
                     {"metadata.test", {"169.254.169.254"}},
                     {"loopback.test", {"127.0.0.2"}}}},
                   {"internal_allow",
                    {"127.0.0.1:" + port_, "127.0.0.1:" + tls_->port, "127.0.0.1:" + git_->port}},
                   {"max_tunnels_per_vm", 3},
                   {"head_timeout_ms", 2000},
                   {"profiles", {{"meta", {"metadata.test:" + port_}}}}};
    if (!run.qemu_isolated) {
      config["qemu_netns"] = false;
      config["qemu_drop_uid"] = false;
    }
    h_ = StartWithEgressConfig(config).release();
    ASSERT_NE(h_, nullptr);
    CliResult r = h_->Cli(CreateArgs());
    ASSERT_EQ(r.code, 0) << r.err;
    id_ = r.out.substr(0, r.out.find('\n'));
  }
  // The suite's VM: the same names reachable in both modes, evil.test refused in both.
  static std::vector<std::string> CreateArgs() {
    if (run_.internet) return {"create", "--internet", "--deny", "evil.test"};
    return {"create",
            "--allow",
            "upstream.test:" + port_,
            "--allow",
            "loopback.test:" + port_,
            "--allow",
            "upstream.test:" + tls_->port,
            "--allow",
            "upstream.test:" + git_->port,
            "--profile",
            "meta"};
  }
  static void TearDownTestSuite() {
    delete h_;
    h_ = nullptr;
    delete up_;
    up_ = nullptr;
    delete tls_;
    tls_ = nullptr;
    delete model_;
    model_ = nullptr;
    delete git_;
    git_ = nullptr;
  }
  void SetUp() override {
    if (h_ == nullptr) StartSuite(GetParam());
    ASSERT_FALSE(id_.empty());
  }

  static CliResult Sh(const std::string& script) { return ShIn(id_, script); }
  static CliResult ShIn(const std::string& vm, const std::string& script) {
    return h_->Cli({"exec", vm, "--", "bash", "-c", script});
  }

  static EgressRun run_;
  static Harness* h_;
  static HttpUpstream* up_;
  static TlsUpstream* tls_;
  static HttpUpstream* model_;
  static GitUpstream* git_;
  static std::string port_;
  static std::string id_;
};
EgressRun EgressE2E::run_;
Harness* EgressE2E::h_ = nullptr;
HttpUpstream* EgressE2E::up_ = nullptr;
TlsUpstream* EgressE2E::tls_ = nullptr;
HttpUpstream* EgressE2E::model_ = nullptr;
GitUpstream* EgressE2E::git_ = nullptr;
std::string EgressE2E::port_;
std::string EgressE2E::id_;

INSTANTIATE_TEST_SUITE_P(EgressAllowList, EgressE2E,
                         ::testing::Values(EgressRun{"allowlist", false, true}),
                         [](const auto& i) { return std::string(i.param.name); });
INSTANTIATE_TEST_SUITE_P(EgressInternet, EgressE2E,
                         ::testing::Values(EgressRun{"internet", true, true}),
                         [](const auto& i) { return std::string(i.param.name); });
INSTANTIATE_TEST_SUITE_P(EgressAllowListWithoutLayer1, EgressE2E,
                         ::testing::Values(EgressRun{"allowlist_no_layer1", false, false}),
                         [](const auto& i) { return std::string(i.param.name); });
INSTANTIATE_TEST_SUITE_P(EgressInternetWithoutLayer1, EgressE2E,
                         ::testing::Values(EgressRun{"internet_no_layer1", true, false}),
                         [](const auto& i) { return std::string(i.param.name); });

TEST_P(EgressE2E, CurlThroughTheProxyIsByteExactBothWays) {
  std::string payload(2 << 20, '\0');
  std::mt19937 rng(11);
  for (char& c : payload) c = static_cast<char>(rng());
  std::string local = h_->home() + "/payload.bin";
  ASSERT_TRUE(WriteFileAtomic(local, payload).ok());
  ASSERT_EQ(h_->Cli({"cp", local, id_ + ":/root/up.bin"}).code, 0);
  std::string want = Sha256Hex(payload);
  // -p (--proxytunnel) makes curl use CONNECT; without it plain HTTP goes as absolute-form.
  for (std::string mode : {"-p", ""}) {
    CliResult r = Sh("curl -sS " + mode + " --data-binary @/root/up.bin -o /root/down.bin " +
                     "http://upstream.test:" + port_ + "/echo && sha256sum /root/down.bin");
    EXPECT_EQ(r.code, 0) << mode << ": " << r.err;
    EXPECT_EQ(r.out.substr(0, 64), want) << mode;   // upstream -> guest
    EXPECT_EQ(up_->last_body_sha(), want) << mode;  // guest -> upstream
  }
}

TEST_P(EgressE2E, HttpsUpstreamIsVerifiedThroughTheTunnel) {
  ASSERT_EQ(h_->Cli({"cp", tls_->dir + "/cert.pem", id_ + ":/root/ca.pem"}).code, 0);
  CliResult r = Sh("curl -sS --cacert /root/ca.pem https://upstream.test:" + tls_->port + "/");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("s_server"), std::string::npos) << r.out;
  // Without the certificate the guest's TLS check fails: the tunnel is opaque bytes.
  r = Sh("curl -sS https://upstream.test:" + tls_->port + "/");
  EXPECT_EQ(r.code, 60) << r.err;  // peer certificate cannot be authenticated
}

TEST_P(EgressE2E, HostOffTheListGets403WithTheReasonAndIsNeverDialled) {
  int before = up_->accepts();
  CliResult r = Sh("curl -sv -p http://evil.test:" + port_ + "/ 2>&1; echo rc=$?");
  EXPECT_NE(r.out.find("< HTTP/1.1 403 Forbidden"), std::string::npos) << r.out;
  const std::string why = run_.internet
                              ? "evil.test:" + port_ + " is denied for this VM (deny evil.test)"
                              : "evil.test is not on the VM's allow-list";
  EXPECT_NE(r.out.find("X-Trybox-Reason: " + why), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rc=0"), std::string::npos) << r.out;
  r = Sh("curl -s -o /dev/null -w '%{http_code}' http://upstream.test:" + port_ +
         "@evil.test:" + port_ + "/");
  EXPECT_EQ(r.out, "403") << r.err;
  // A port off the list; in internet mode, a port the operator's override does not cover.
  r = Sh("curl -sv -p http://upstream.test:443/ 2>&1");
  EXPECT_NE(r.out.find(run_.internet ? "127.0.0.1:443 (loopback)"
                                     : "port 443 is not allowed for upstream.test"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(up_->accepts(), before);
}

// What tells the modes apart: a name on no list is refused by the list, and reached in
// internet mode (here only because the operator's override lets its loopback address in).
TEST_P(EgressE2E, ANameOnNoListIsReachedOnlyInInternetMode) {
  int before = up_->accepts();
  CliResult r = Sh("curl -sS -p http://other.test:" + port_ + "/ 2>&1; echo \" rc=$?\"");
  if (run_.internet) {
    EXPECT_EQ(r.out, "hello rc=0\n");
    EXPECT_EQ(up_->accepts(), before + 1);
  } else {
    EXPECT_NE(r.out.find("403"), std::string::npos) << r.out;
    EXPECT_EQ(up_->accepts(), before);
  }
  r = h_->Cli({"audit", "--vm", id_, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  bool seen = false;
  for (const auto& e : Json::parse(r.out)) {
    if (e["host"] != "other.test") continue;
    seen = true;
    EXPECT_EQ(e["verdict"], run_.internet ? "allowed" : "refused") << e.dump();
    if (run_.internet) {
      EXPECT_EQ(e["reason"], "internal address allowed by the operator's override") << e.dump();
    }
  }
  EXPECT_TRUE(seen) << r.out;
}

// The operator's model server is reached under one fixed name, in either mode, without an
// allow entry or internal_allow, on port 80 only; its address itself stays refused.
TEST_P(EgressE2E, TheModelRouteReachesOnlyTheOperatorsModelServer) {
  const int before = model_->accepts();
  CliResult r = Sh("printf '%s ' \"$TRYBOX_MODEL_URL\"; curl -sS \"$TRYBOX_MODEL_URL/v1/models\"");
  EXPECT_EQ(r.out, "http://model.trybox.internal hello") << r.err;
  r = Sh("curl -sv -p http://model.trybox.internal:8080/ 2>&1");
  EXPECT_NE(r.out.find("model.trybox.internal serves port 80 only"), std::string::npos) << r.out;
  r = Sh("curl -sv --noproxy '' http://127.0.0.1:" + std::to_string(model_->port()) + "/ 2>&1");
  EXPECT_NE(r.out.find("< HTTP/1.1 403"), std::string::npos) << r.out;
  EXPECT_EQ(model_->accepts(), before + 1);
  r = h_->Cli({"audit", "--vm", id_, "--json"});
  bool seen = false;
  for (const auto& e : Json::parse(r.out)) {
    if (e["host"] == "model.trybox.internal" && e["verdict"] == "allowed") {
      seen = true;
      EXPECT_EQ(e["reason"], "the operator's model route (egress.json model_route)");
      EXPECT_EQ(e["address"], "127.0.0.1:" + std::to_string(model_->port()));
    }
  }
  EXPECT_TRUE(seen) << r.out;
}

// `trybox allow` and `trybox deny` change a running VM's list from its next connection on,
// leave a connection already decided alone, and are audited with who asked.
TEST_P(EgressE2E, AllowAndDenyChangeARunningVmFromItsNextConnection) {
  CliResult c = h_->Cli(
      run_.internet ? std::vector<std::string>{"create", "--internet"}
                    : std::vector<std::string>{"create", "--allow", "upstream.test:" + port_});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = c.out.substr(0, c.out.find('\n'));
  // Plain HTTP through the proxy: a refusal is the proxy's own 403 answer.
  const std::string get = "curl -s -o /dev/null -w '%{http_code}' http://other.test:" + port_ + "/";
  EXPECT_EQ(ShIn(vm, get).out, run_.internet ? "200" : "403");
  if (!run_.internet) {
    CliResult a = h_->Cli({"allow", vm, "other.test:" + port_});
    ASSERT_EQ(a.code, 0) << a.err;
    EXPECT_EQ(a.out, "mode:  allowlist\nallow: upstream.test:" + port_ + " other.test:" + port_ +
                         "\ndeny:  (none)\n");
    EXPECT_EQ(ShIn(vm, get).out, "200");
  }
  // A tunnel decided before the deny goes on to its end.
  up_->Rearm();
  CliResult hold = ShIn(
      vm, "(curl -sS -p http://other.test:" + port_ + "/hold -o /tmp/held >/tmp/held.err 2>&1 &)");
  ASSERT_EQ(hold.code, 0) << hold.err;
  auto give_up = Clock::now() + std::chrono::seconds(60);
  while (up_->held() < 1 && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(up_->held(), 1);
  CliResult d = h_->Cli({"deny", vm, "other.test", "--json"});
  ASSERT_EQ(d.code, 0) << d.err;
  Json policy = Json::parse(d.out);
  EXPECT_EQ(policy["deny"], Json({"other.test"})) << d.out;
  EXPECT_EQ(policy["mode"], run_.internet ? "internet" : "allowlist");
  CliResult refused = ShIn(vm, "curl -sv -p http://other.test:" + port_ + "/ 2>&1");
  EXPECT_NE(refused.out.find("other.test:" + port_ + " is denied for this VM (deny other.test)"),
            std::string::npos)
      << refused.out;
  up_->Release();
  CliResult held = ShIn(vm, "while [ ! -s /tmp/held ]; do sleep 0.1; done; cat /tmp/held");
  EXPECT_EQ(held.out, "hello") << held.err;
  // Allowing it again lifts the deny.
  ASSERT_EQ(h_->Cli({"allow", vm, "other.test:" + port_}).code, 0);
  EXPECT_EQ(ShIn(vm, get).out, "200");
  // The list of a running VM shows in `ls`; each change is an audit row naming who asked.
  CliResult ls = h_->Cli({"ls", "--json"});
  bool listed = false;
  for (const auto& v : Json::parse(ls.out)) {
    if (v["id"] != vm) continue;
    listed = true;
    EXPECT_EQ(v["egress"]["deny"], Json::array()) << v.dump();
    EXPECT_NE(v["egress"]["allow"].dump().find("other.test:" + port_), std::string::npos);
  }
  EXPECT_TRUE(listed) << ls.out;
  CliResult audit = h_->Cli({"audit", "--vm", vm, "--json"});
  std::vector<std::string> changes;
  for (const auto& e : Json::parse(audit.out)) {
    if (e["verdict"] != "policy") continue;
    changes.push_back(e["method"].get<std::string>() + " " + e["host"].get<std::string>());
    EXPECT_NE(e["reason"].get<std::string>().find("asked by uid " + std::to_string(::geteuid())),
              std::string::npos)
        << e.dump();
  }
  std::vector<std::string> want = {"DENY other.test", "ALLOW other.test"};
  if (!run_.internet) want.insert(want.begin(), "ALLOW other.test");
  EXPECT_EQ(changes, want) << audit.out;
  // Mistakes are named and change nothing.
  CliResult bad = h_->Cli({"allow", vm, "*.com"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("a wildcard needs at least two labels"), std::string::npos) << bad.err;
  bad = h_->Cli({"deny", "no-such-vm", "other.test"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("no VM with id 'no-such-vm'"), std::string::npos) << bad.err;
  ASSERT_EQ(h_->Cli({"rm", vm}).code, 0);
}

TEST_P(EgressE2E, IpLiteralsAreRefused) {
  int before = up_->accepts();
  for (std::string host : {"127.0.0.1", "2130706433", "0x7f.1", "[::1]"}) {
    // --noproxy '': the guest's default no_proxy would keep loopback literals off the proxy.
    CliResult r = Sh("curl -sv --noproxy '' -p http://" + host + ":" + port_ + "/ 2>&1");
    EXPECT_NE(r.out.find("< HTTP/1.1 403"), std::string::npos) << host << ": " << r.out;
  }
  EXPECT_EQ(up_->accepts(), before);
}

TEST_P(EgressE2E, AllowedNamesResolvingToMetadataOrUnlistedLoopbackAreRefused) {
  CliResult r = Sh("curl -sv -p http://metadata.test:" + port_ + "/ 2>&1");
  EXPECT_NE(r.out.find("(cloud metadata)"), std::string::npos) << r.out;
  r = Sh("curl -sv -p http://loopback.test:" + port_ + "/ 2>&1");
  EXPECT_NE(r.out.find("127.0.0.2:" + port_ + " (loopback)"), std::string::npos) << r.out;
}

TEST_P(EgressE2E, SlowClientIsTimedOutWith408) {
  // A raw client inside the guest sends half a request head and waits.
  CliResult r = Sh("exec 3<>/dev/tcp/127.0.0.1/3128; printf 'CONNECT upstream.test:" + port_ +
                   " HTTP/1.1\\r\\n' >&3; cat <&3");
  EXPECT_NE(r.out.find("HTTP/1.1 408"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("not complete within 2000 ms"), std::string::npos) << r.out;
}

TEST_P(EgressE2E, TunnelsOverTheCapAreRefusedNotHeld) {
  up_->Rearm();
  CliResult r = Sh("for i in 1 2 3; do (curl -sS -p http://upstream.test:" + port_ +
                   "/hold -o /tmp/hold$i >/tmp/hold$i.err 2>&1 &); done");
  ASSERT_EQ(r.code, 0) << r.err;
  auto give_up = Clock::now() + std::chrono::seconds(60);
  while (up_->held() < 3 && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(up_->held(), 3);
  r = Sh("curl -sv -p http://upstream.test:" + port_ + "/ 2>&1");
  EXPECT_NE(r.out.find("< HTTP/1.1 503"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("too many concurrent tunnels for this VM (cap 3)"), std::string::npos)
      << r.out;
  up_->Release();
  // The held tunnels finish normally once the upstream answers.
  r =
      Sh("for i in 1 2 3; do while [ ! -s /tmp/hold$i ]; do sleep 0.1; done; cat /tmp/hold$i; "
         "done");
  EXPECT_EQ(r.out, "hellohellohello") << r.err;
}

// Audit rows of this suite's VM, newest first.
Json AuditRows(Harness& h, const std::string& vm) {
  CliResult r = h.Cli({"audit", "--vm", vm, "--json", "--limit", "1000"});
  EXPECT_EQ(r.code, 0) << r.err;
  return r.code == 0 ? Json::parse(r.out) : Json::array();
}

const Json* FindRow(const Json& rows, const std::string& method, const std::string& host) {
  for (const auto& e : rows) {
    if (e["method"] == method && e["host"] == host) return &e;
  }
  return nullptr;
}

// Programs that ignore the proxy variables: the guest's resolver answers an allowed name with
// a pool address, a refused one with NXDOMAIN, and their connections reach the host by name,
// decided and audited there exactly as proxied ones.
TEST_P(EgressE2E, ProgramsThatIgnoreTheProxyReachAllowedNamesOnly) {
  const int before = up_->accepts();
  const std::string noproxy = "unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY; ";
  CliResult r = Sh("getent hosts upstream.test");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("198.18.", 0), 0u) << r.out;  // the pool, never the real address
  r = Sh("getent hosts evil.test");
  EXPECT_EQ(r.code, 2) << r.out;  // not found
  r = Sh("cat /etc/resolv.conf");
  EXPECT_NE(r.out.find("nameserver 127.0.0.53"), std::string::npos) << r.out;
  // curl resolving and connecting itself; Python's socket module; bash's /dev/tcp.
  r = Sh(noproxy + "curl -sS http://upstream.test:" + port_ + "/");
  EXPECT_EQ(r.out, "hello") << r.err;
  r = Sh(noproxy +
         "python3 -c 'import socket\n"
         "s = socket.create_connection((\"upstream.test\", " +
         port_ +
         "), timeout=30)\n"
         "s.sendall(b\"GET / HTTP/1.0\\r\\nHost: upstream.test\\r\\n\\r\\n\")\n"
         "data = b\"\"\n"
         "while not data.endswith(b\"hello\"):\n"
         "    b = s.recv(65536)\n"
         "    if not b: break\n"
         "    data += b\n"
         "print(data.split(b\"\\r\\n\\r\\n\", 1)[-1].decode())'");
  EXPECT_EQ(r.out, "hello\n") << r.err;
  r = Sh("exec 3<>/dev/tcp/upstream.test/" + port_ +
         "; printf 'GET / HTTP/1.0\\r\\nHost: upstream.test\\r\\n\\r\\n' >&3; "
         "timeout 30 head -c 1000 <&3 | tail -c 5");
  EXPECT_EQ(r.out, "hello") << r.err;
  EXPECT_EQ(up_->accepts(), before + 3);
  // Refused: the name does not resolve; an address literal is reset, never dialled.
  r =
      Sh("python3 -c 'import socket\n"
         "try:\n"
         "    socket.create_connection((\"evil.test\", " +
         port_ +
         "), timeout=30)\n"
         "except socket.gaierror as e: print(\"gaierror\", e.errno)'");
  EXPECT_EQ(r.out, "gaierror -2\n") << r.err;  // EAI_NONAME
  r = Sh(noproxy + "curl -sS --max-time 30 http://10.0.2.2:" + port_ + "/");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.out, "");
  r = Sh(noproxy + "curl -sS --max-time 30 http://other.test:" + port_ + "/");
  if (run_.internet) {
    EXPECT_EQ(r.out, "hello") << r.err;
  } else {
    EXPECT_EQ(r.code, 6) << r.err;  // could not resolve host
  }
  EXPECT_EQ(up_->accepts(), before + 3 + (run_.internet ? 1 : 0));
  // Every decision is in the record, by name: the allowed connections, the refused lookup,
  // the refused literal.
  Json rows = AuditRows(*h_, id_);
  const Json* ok = FindRow(rows, "TCP", "upstream.test");
  ASSERT_NE(ok, nullptr) << rows.dump();
  EXPECT_EQ((*ok)["verdict"], "allowed");
  EXPECT_EQ((*ok)["address"], "127.0.0.1:" + port_);
  const Json* dns = FindRow(rows, "DNS", "evil.test");
  ASSERT_NE(dns, nullptr) << rows.dump();
  EXPECT_EQ((*dns)["verdict"], "refused");
  EXPECT_NE((*dns)["reason"].get<std::string>().find("NXDOMAIN"), std::string::npos);
  const Json* literal = FindRow(rows, "TCP", "10.0.2.2");
  ASSERT_NE(literal, nullptr) << rows.dump();
  EXPECT_EQ((*literal)["verdict"], "refused");
  EXPECT_NE((*literal)["reason"].get<std::string>().find("IP literal"), std::string::npos);
}

// Issue 41.12: after `trybox allow ID HOST`, the guest's next lookup of HOST once still
// answered NXDOMAIN from trybox-init's resolver, which kept refusals a second; an agent that
// retried right after its approval failed. The guest here looks the name up, waits for the
// allow on its stdin, and looks it up again at once.
TEST_P(EgressE2E, ALookupRightAfterAnAllowFindsTheName) {
  CliResult c = h_->Cli(
      run_.internet ? std::vector<std::string>{"create", "--internet", "--deny", "other.test"}
                    : std::vector<std::string>{"create", "--allow", "upstream.test:" + port_});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = c.out.substr(0, c.out.find('\n'));
  const std::string script =
      "import socket, sys\n"
      "def look():\n"
      "    try:\n"
      "        socket.getaddrinfo('other.test', " +
      port_ +
      ", type=socket.SOCK_STREAM)\n"
      "        return 'found'\n"
      "    except socket.gaierror as e:\n"
      "        return 'gaierror %d' % e.errno\n"
      "print(look(), flush=True)\n"
      "sys.stdin.readline()\n"
      "print(look(), flush=True)\n";
  int in[2], out[2];
  ASSERT_EQ(::pipe2(in, O_CLOEXEC), 0);
  UniqueFd in_r(in[0]), in_w(in[1]);
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  UniqueFd out_r(out[0]), out_w(out[1]);
  SpawnOptions o;
  o.argv = {BinDir() + "/trybox", "exec", "-i", vm, "--", "python3", "-c", script};
  o.env = h_->Env();
  o.stdin_fd = in_r.get();
  o.stdout_fd = out_w.get();
  auto exec = ChildProcess::Spawn(o);
  ASSERT_TRUE(exec.ok()) << exec.status().ToString();
  in_r.Reset();
  out_w.Reset();
  // The guest's lines as they come (a minute at most for each).
  std::string got;
  auto read_line = [&]() -> std::string {
    auto give_up = Clock::now() + std::chrono::seconds(60);
    for (;;) {
      size_t nl = got.find('\n');
      if (nl != std::string::npos) {
        std::string line = got.substr(0, nl);
        got.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now());
      pollfd p = {out_r.get(), POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return "?";
      char buf[256];
      ssize_t n = ::read(out_r.get(), buf, sizeof buf);
      if (n <= 0) return "?";
      got.append(buf, static_cast<size_t>(n));
    }
  };
  EXPECT_EQ(read_line(), "gaierror -2");  // EAI_NONAME: refused
  // The verb `trybox allow` sends, straight through the socket.
  auto a = h_->Call({{"verb", "egress"},
                     {"vm", vm},
                     {"allow", {"other.test:" + port_}},
                     {"deny", Json::array()}});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(WriteFull(in_w.get(), "go\n").ok());
  EXPECT_EQ(read_line(), "found");
  in_w.Reset();
  auto done = exec->WaitFor(std::chrono::seconds(60));
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->code, 0);
  // The first lookup's refusal is in the record.
  Json rows = AuditRows(*h_, vm);
  const Json* dns = FindRow(rows, "DNS", "other.test");
  ASSERT_NE(dns, nullptr) << rows.dump();
  EXPECT_EQ((*dns)["verdict"], "refused");
  EXPECT_EQ(h_->Cli({"rm", vm}).code, 0);
}

// UDP other than DNS goes nowhere: the datagram is taken in the guest, dropped, and counted
// in the host's record by destination.
TEST_P(EgressE2E, UdpIsDroppedAndCountedNotCarried) {
  CliResult r = Sh("for i in 1 2 3; do echo x > /dev/udp/10.0.2.3/53; done; echo sent");
  EXPECT_EQ(r.out, "sent\n") << r.err;
  const Json* row = nullptr;
  Json rows;
  for (auto give_up = Clock::now() + std::chrono::seconds(20); Clock::now() < give_up;) {
    rows = AuditRows(*h_, id_);
    if ((row = FindRow(rows, "UDP", "10.0.2.3")) != nullptr) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_NE(row, nullptr) << rows.dump();
  EXPECT_EQ((*row)["verdict"], "refused");
  EXPECT_EQ((*row)["port"], 53);
  EXPECT_EQ((*row)["reason"].get<std::string>().rfind("3 UDP datagram(s) dropped", 0), 0u)
      << row->dump();
  // The guest has still no network card of its own.
  r = Sh("ls /sys/class/net");
  EXPECT_EQ(r.out, "lo\n");
}

// git:// is a protocol no proxy variable covers: the clone goes through the resolver and the
// steered connection, by name.
TEST_P(EgressE2E, GitCloneOverGitProtocolGoesByName) {
  CliResult r = Sh("cd /tmp && rm -rf clone && git clone -q git://upstream.test:" + git_->port +
                   "/repo.git clone && cat clone/README");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "served over git://\n") << r.err;
  Json rows = AuditRows(*h_, id_);
  const Json* row = nullptr;
  for (const auto& e : rows) {
    if (e["method"] == "TCP" && e["port"] == std::stoi(git_->port)) row = &e;
  }
  ASSERT_NE(row, nullptr) << rows.dump();
  EXPECT_EQ((*row)["host"], "upstream.test");
  EXPECT_EQ((*row)["verdict"], "allowed");
}

// Layer 1 alone: even with the proxy out of the picture and the upstream explicitly allowed
// by the operator override, QEMU's own process cannot reach the host's loopback service.
TEST_P(EgressE2E, QemuNetnsHoldsOnItsOwn) {
  pid_t qemu = QemuPidOf(*h_);
  ASSERT_GT(qemu, 0);
  if (!run_.qemu_isolated) {
    EXPECT_EQ(NetNs(qemu), NetNs(::getpid()));  // layer 1 really is off in this run
    GTEST_SKIP() << "layer 1 is off in this run: every other test shows the proxy alone";
  }
  EXPECT_NE(NetNs(qemu), NetNs(::getpid()));
  EXPECT_EQ(StatusField(qemu, "Seccomp"), "2");
  EXPECT_EQ(StatusField(qemu, "NoNewPrivs"), "1");
  std::string uid = StatusField(qemu, "Uid");
  uid = uid.substr(0, uid.find('\t'));
  if (::geteuid() == 0) {
    // Its own uid from the configured range (default base 2000000000), no groups.
    int64_t n = std::atoll(uid.c_str());
    EXPECT_GE(n, 2000000000) << uid;
    EXPECT_LT(n, 2000000000 + 65536) << uid;
    EXPECT_EQ(StatusField(qemu, "Groups"), "");
  }
  int before = up_->accepts();
  std::string ns = "/proc/" + std::to_string(qemu) + "/ns/net";
  // As QEMU's own uid inside QEMU's namespace: only a down lo, and no way to the upstream.
  auto r = RunCommand({"nsenter", "--net=" + ns, "-S", uid, "-G", uid, "bash", "-c",
                       "ip -o link; exec 3<>/dev/tcp/127.0.0.1/" + port_ + " && echo CONNECTED"},
                      std::chrono::seconds(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->output.find("CONNECTED"), std::string::npos) << r->output;
  EXPECT_NE(r->output.find("Network is unreachable"), std::string::npos) << r->output;
  EXPECT_EQ(r->output.rfind("1: lo: <LOOPBACK>", 0), 0u) << r->output;  // down, and alone
  EXPECT_EQ(r->output.find("\n2: "), std::string::npos) << r->output;
  EXPECT_EQ(up_->accepts(), before);
}

TEST_P(EgressE2E, AuditShowsEveryDecisionWithBytes) {
  CliResult r =
      Sh("head -c 300000 /dev/urandom > /root/a && curl -sS -p --data-binary @/root/a "
         "-o /dev/null http://upstream.test:" +
         port_ +
         "/echo && curl -s -p "
         "http://evil.test:" +
         port_ + "/; true");
  ASSERT_EQ(r.code, 0) << r.err;
  r = h_->Cli({"audit", "--vm", id_, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  Json rows = Json::parse(r.out, nullptr, false);
  ASSERT_TRUE(rows.is_array()) << r.out;
  bool tunnel = false, refused = false, overridden = false;
  for (const auto& e : rows) {
    EXPECT_EQ(e["vm"], id_);
    if (e["verdict"] == "allowed" && e["method"] == "CONNECT" &&
        e["bytes_up"].get<int64_t>() >= 300000 && e["bytes_down"].get<int64_t>() >= 300000) {
      tunnel = true;
      EXPECT_EQ(e["address"], "127.0.0.1:" + port_);
    }
    if (e["verdict"] == "refused" && e["host"] == "evil.test" && e["status"] == 403) refused = true;
    if (e["override"].get<bool>()) overridden = true;
  }
  EXPECT_TRUE(tunnel) << rows.dump(1);
  EXPECT_TRUE(refused) << rows.dump(1);
  EXPECT_TRUE(overridden) << rows.dump(1);
  CliResult text = h_->Cli({"audit", "--vm", id_});
  EXPECT_NE(text.out.find("evil.test:" + port_), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("[override]"), std::string::npos) << text.out;
}

}  // namespace
}  // namespace trybox::e2e
