// End to end: tryboxd's HTTP API (docs/protocol/http.md) and its E2B-compatible control
// plane (docs/protocol/e2b.md), driven by the official, unmodified E2B JavaScript SDK
// (tests/e2b/control.mjs, installed by `npm ci --prefix tests/e2b`) and by raw requests
// for what the SDK never sends, against a private tryboxd booting real guests.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/process.h"
#include "util/tcp.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

struct HttpReply {
  int status = 0;
  std::string head;
  Json body;
};

// One request on its own connection, read to the server's close.
HttpReply Request(uint16_t port, const std::string& method, const std::string& path,
                  const std::string& key, const std::string& body = "",
                  const std::string& extra_headers = "") {
  HttpReply r;
  auto fd = ConnectTcpLoopback(port);
  if (!fd.ok()) return r;
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!key.empty()) req += "X-API-KEY: " + key + "\r\n";
  if ((!body.empty() || method == "POST") &&
      extra_headers.find("Content-Length") == std::string::npos) {
    req +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += extra_headers + "\r\n" + body;
  (void)WriteFull(fd->get(), req);
  std::string all;
  char buf[8192];
  while (true) {
    ssize_t n = ::recv(fd->get(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    all.append(buf, static_cast<size_t>(n));
  }
  const size_t end = all.find("\r\n\r\n");
  if (all.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return r;
  r.status = std::atoi(all.c_str() + 9);
  r.head = all.substr(0, end);
  r.body = Json::parse(all.substr(end + 4), nullptr, false);
  return r;
}

class E2bE2E : public SharedHarness<E2bE2E> {
 protected:
  void SetUp() override {
    ASSERT_NE(h_, nullptr);
    const std::string sdk = std::string(TRYBOX_SOURCE_DIR) + "/tests/e2b/node_modules/e2b";
    ASSERT_EQ(::access(sdk.c_str(), F_OK), 0)
        << "the E2B SDK is not installed: run npm ci --prefix tests/e2b (scripts/test.sh does)";
    if (port_ == 0) {
      CliResult s = h_->Cli({"serve", "--listen", "127.0.0.1:0"});
      ASSERT_EQ(s.code, 0) << s.err;
      std::smatch m;
      ASSERT_TRUE(std::regex_search(s.out, m, std::regex("http://127\\.0\\.0\\.1:([0-9]+)")))
          << s.out;
      url_ = m[0];
      port_ = static_cast<uint16_t>(std::stoi(m[1]));
      key_ = NewKey("e2e");
    }
  }

  static std::string NewKey(const std::string& name) {
    CliResult k = h_->Cli({"api-key", "create", name});
    EXPECT_EQ(k.code, 0) << k.err;
    std::string key = k.out.substr(0, k.out.find('\n'));
    EXPECT_TRUE(std::regex_match(key, std::regex("e2b_[0-9a-f]{40}"))) << key;
    return key;
  }

  static size_t LiveVms() {
    auto r = h_->Call({{"verb", "list"}});
    return r.ok() && (*r)["vms"].is_array() ? (*r)["vms"].size() : 9999;
  }

  static inline uint16_t port_ = 0;
  static inline std::string url_;
  static inline std::string key_;
};

TEST_F(E2bE2E, OfficialSdkCreatesListsKillsAndTimesOutSandboxes) {
  std::vector<std::string> env = h_->Env();
  env.push_back("E2B_API_URL=" + url_);
  env.push_back("E2B_SANDBOX_URL=" + url_);
  env.push_back("E2B_API_KEY=" + key_);
  env.push_back("TRYBOX_TEST_RUN=run-" + std::to_string(::getpid()));
  CliResult r = RunProgram({FindInPath("node").value_or("node"),
                            std::string(TRYBOX_SOURCE_DIR) + "/tests/e2b/control.mjs"},
                           env);
  ASSERT_EQ(r.code, 0) << "control.mjs failed; stderr:\n" << r.err << "\nstdout:\n" << r.out;
  Json out = Json::parse(r.out, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.out;
  const std::string first = out["first"], second = out["second"];

  EXPECT_EQ(out["info"]["sandboxId"], first);
  EXPECT_EQ(out["info"]["templateId"], "debian-12");
  EXPECT_EQ(out["info"]["state"], "running");
  EXPECT_EQ(out["info"]["metadata"]["with space"], "a b&c=d%");
  EXPECT_EQ(out["info"]["memoryMB"], 512);
  EXPECT_LT(out["info"]["startedAt"].get<std::string>(), out["info"]["endAt"].get<std::string>());

  // Newest first, one per page, only this run's.
  EXPECT_EQ(out["listed"], Json::array({second, first})) << out.dump();
  EXPECT_EQ(out["pages"], 2);
  EXPECT_EQ(out["filtered_none"], 0);
  EXPECT_EQ(out["filtered_odd"], Json::array({first}));

  EXPECT_EQ(out["killed"], true);
  EXPECT_EQ(out["killed_again"], false);
  EXPECT_EQ(out["connected"], first);
  EXPECT_EQ(out["expired"], true) << out.dump();
  EXPECT_NE(out.value("expired_error", "").find("not found"), std::string::npos) << out.dump();
  EXPECT_NE(out["wrong_key"].get<std::string>().find("AuthenticationError"), std::string::npos)
      << out.dump();
  EXPECT_NE(out["unknown_template"].get<std::string>().find("no-such-image"), std::string::npos)
      << out.dump();

  // Commands through envd's process service.
  const Json& c = out["commands"];
  EXPECT_EQ(c["stdout"], "line1\nline2\nline3\n") << c.dump();
  EXPECT_EQ(c["stderr"], "oops\n");
  EXPECT_EQ(c["exit"], 0);
  // The first line reached its callback while the command still ran (it waited for that).
  EXPECT_EQ(c["live"], "ready\ngo-seen\n") << c.dump();
  EXPECT_EQ(c["failing"]["exitCode"], 3) << c.dump();
  EXPECT_EQ(c["failing"]["stdout"], "partial\n");
  EXPECT_EQ(c["env"], "hi\n");
  EXPECT_EQ(c["whoami"], "user\n/home/user\n");
  EXPECT_EQ(c["root"], "root\n");
  bool listed = false;
  for (const Json& p : c["listed"]) {
    listed |= p["pid"] == c["bg_pid"] && p["cmd"] == "/bin/bash" &&
              p["args"] == Json::array({"-l", "-c", "sleep 600"});
  }
  EXPECT_TRUE(listed) << c.dump();
  EXPECT_EQ(c["bg_killed"], true);
  EXPECT_EQ(c["bg_wait"]["exitCode"], -1) << c.dump();
  EXPECT_EQ(c["bg_killed_again"], false);
  EXPECT_NE(c["timeout"].get<std::string>(), "no error") << c.dump();
  EXPECT_EQ(c["stdin"], "FIRST LINE\nSECOND\n[eof]\n") << c.dump();
  EXPECT_NE(c["stdin_after_end"].value("error", "").find("not running"), std::string::npos)
      << c.dump();
  EXPECT_NE(c["stdin_refused"].value("error", "").find("started without stdin"), std::string::npos)
      << c.dump();
  EXPECT_NE(c["close_refused"].value("error", "").find("started without stdin"), std::string::npos)
      << c.dump();
  EXPECT_NE(c["resize_refused"].value("error", "").find("has no terminal"), std::string::npos)
      << c.dump();

  const Json& p = out["pty"];
  EXPECT_EQ(p["typed"], true) << p.dump();
  EXPECT_EQ(p["size"], true) << "stty size did not say 24 80";
  EXPECT_EQ(p["tty"], true) << "tty did not name a /dev/pts terminal";
  EXPECT_EQ(p["user"], true);
  EXPECT_EQ(p["resized"], true) << "the resize did not reach the terminal";
  EXPECT_EQ(p["interrupted"], true) << "Ctrl-C did not end the foreground sleep";
  EXPECT_NE(p["close_refused"].value("error", "").find("Ctrl-D"), std::string::npos) << p.dump();
  EXPECT_NE(p["stdin_refused"].value("error", "").find("runs on a PTY"), std::string::npos)
      << p.dump();
  EXPECT_EQ(p["exit"], 5) << p.dump();

  // Files through envd's filesystem service and GET /files, as `user`.
  const Json& f = out["files"];
  EXPECT_EQ(f["made"], true) << f.dump();
  EXPECT_EQ(f["made_again"], false);
  std::map<std::string, Json> by_name;
  for (const Json& e : f["list"]) by_name[e["name"]] = e;
  EXPECT_EQ(by_name.size(), 5u) << f.dump();  // a.txt, link, new, sub, "we ird.txt"
  EXPECT_EQ(by_name["a.txt"]["type"], "file");
  EXPECT_EQ(by_name["a.txt"]["size"], 5);
  EXPECT_EQ(by_name["a.txt"]["path"], "/home/user/proj/a.txt");
  EXPECT_EQ(by_name["sub"]["type"], "dir");
  EXPECT_EQ(by_name["we ird.txt"]["size"], 8);
  EXPECT_EQ(f["deep"], 5) << "sub is empty, so depth 2 adds nothing";
  EXPECT_EQ(f["info"]["size"], 5);
  EXPECT_EQ(f["info"]["owner"], "user");
  EXPECT_EQ(f["info"]["permissions"], "-rw-r--r--");
  EXPECT_EQ(f["read"], "hello");
  EXPECT_NE(f["read_missing"].value("error", "").find("NotFound"), std::string::npos) << f.dump();
  EXPECT_NE(f["read_root_only"].value("error", "").find("ermission denied"), std::string::npos)
      << f.dump();
  EXPECT_NE(f["list_file"].value("error", "").find("not a directory"), std::string::npos)
      << f.dump();
  EXPECT_EQ(f["renamed"], "/home/user/proj/b.txt");
  EXPECT_EQ(f["read_renamed"], "hello");
  EXPECT_EQ(f["exists_removed"], false);
  EXPECT_EQ(f["exists_kept"], true);
  EXPECT_EQ(f["write"]["path"], "/home/user/proj/deep/w.txt") << f.dump();
  EXPECT_EQ(f["write"]["name"], "w.txt");
  EXPECT_EQ(f["read_written"], "written\n");
  EXPECT_EQ(f["written_owner"], "user\nuser\n") << "the file and the directory made for it";
  EXPECT_EQ(f["write_many"], Json::array({"/home/user/m1.txt", "/home/user/m2.bin"}));
  EXPECT_EQ(f["read_m2"], Json::array({0, 1, 2, 255}));
  EXPECT_NE(f["write_root_only"].value("error", "").find("ermission denied"), std::string::npos)
      << f.dump();
  EXPECT_EQ(f["write_as_root"], "/root/yes.txt");
  EXPECT_EQ(f["big_ok"], true) << "a 3 MiB file did not come back byte for byte";
  EXPECT_EQ(f["tmp_left"], "0\n") << "an upload's temporary file was left in /tmp";
  // The watch saw each change, by the name relative to the watched directory.
  for (const char* e : {"create:a.txt", "write:a.txt", "create:sub/b.txt", "rename:a.txt",
                        "create:c.txt", "remove:sub/b.txt", "chmod:c.txt"}) {
    const Json& w = f["watch"];
    EXPECT_NE(std::find(w.begin(), w.end(), e), w.end()) << e << " not in " << w.dump();
  }
  EXPECT_NE(f["watch_missing"].value("error", "").find("not found"), std::string::npos) << f.dump();
  EXPECT_NE(f["watch_root_only"].value("error", "").find("ermission denied"), std::string::npos)
      << f.dump();

  // Both VMs are gone: one killed, one past its timeout.
  EXPECT_EQ(LiveVms(), 0u);
  // The SDK's commands were trybox execs, recorded like any other.
  CliResult ps = h_->Cli({"ps", first});
  EXPECT_EQ(ps.code, 0) << ps.err;
  EXPECT_NE(ps.out.find("sleep 600"), std::string::npos) << ps.out;
  EXPECT_NE(ps.out.find("whoami"), std::string::npos) << ps.out;
  const std::string log = ReadFileToString(h_->home() + "/tryboxd.log").value_or("");
  EXPECT_NE(log.find("sandbox " + first + " destroyed: its timeout passed"), std::string::npos);
  EXPECT_NE(log.find("POST /sandboxes 201"), std::string::npos);
  EXPECT_EQ(log.find(key_), std::string::npos) << "the API key is in the daemon's log";
  std::cerr << "[ figures ] SDK create " << out["create_ms"] << " ms; a 2 s timeout ended the VM "
            << out["expire_ms"] << " ms after it was set\n";
}

TEST_F(E2bE2E, BadRequestsGetClearErrorsAndChangeNothing) {
  const size_t before = LiveVms();
  const std::string good = R"({"templateID":"debian-12","timeout":60})";

  HttpReply r = Request(port_, "GET", "/v2/sandboxes", "");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.body["code"], 401);
  EXPECT_NE(r.body["message"].get<std::string>().find("X-API-KEY"), std::string::npos);
  EXPECT_EQ(Request(port_, "POST", "/sandboxes", "e2b_" + std::string(40, '1'), good).status, 401);
  EXPECT_EQ(Request(port_, "POST", "/sandboxes", "not-a-key", good).status, 401);

  r = Request(port_, "GET", "/no/such/route", key_);
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body["message"].get<std::string>().find("no route"), std::string::npos);
  r = Request(port_, "PUT", "/sandboxes", key_, "{}");
  EXPECT_EQ(r.status, 405);
  EXPECT_NE(r.head.find("Allow: "), std::string::npos) << r.head;

  struct Bad {
    std::string body;
    std::string says;
  };
  for (const Bad& b : std::vector<Bad>{
           {"{not json", "not valid JSON"},
           {"[1]", "JSON object"},
           {"{}", "templateID is required"},
           {R"({"templateID":"../etc"})", "templateID"},
           {R"({"templateID":"debian-12","timeout":-1})", "negative"},
           {R"({"templateID":"debian-12","timeout":99999999})", "at most"},
           {R"({"templateID":"debian-12","timeout":"60"})", "whole number"},
           {R"({"templateID":"debian-12","autoPause":true})", "autoPause"},
           {R"({"templateID":"debian-12","metadata":{"a":1}})", "metadata.a"},
           {R"({"templateID":"debian-12","envVars":{"1BAD":"x"}})", "envVars"},
           {R"({"templateID":"debian-12","network":{"allowOut":["10.0.0.0/8"]}})", "10.0.0.0/8"},
           {R"({"templateID":"debian-12","network":{"rules":{"a.example":[{}]}}})", "secrets"},
           {R"({"templateID":"debian-12","network":{"denyOut":["*.com"]}})", "deny entry"},
           {R"({"templateID":"debian-12","trybox":{"privileged":true}})", "trybox.privileged"},
           {R"({"templateID":"debian-12","trybox":{"cpus":0}})", "trybox.cpus"},
           {R"({"templateID":"debian-12","trybox":{"secrets":[{"name":"T","value":"sekrit-9",
               "hosts":"api.test"}]}})",
            "trybox.secrets[0].hosts"},
       }) {
    r = Request(port_, "POST", "/sandboxes", key_, b.body);
    EXPECT_EQ(r.status, 400) << b.body << " -> " << r.body.dump();
    EXPECT_EQ(r.body["code"], 400) << b.body;
    EXPECT_NE(r.body.value("message", "").find(b.says), std::string::npos)
        << b.body << " -> " << r.body.dump();
    EXPECT_EQ(r.body.dump().find("sekrit-9"), std::string::npos) << "a secret's value is echoed";
  }
  r = Request(port_, "POST", "/sandboxes", key_, R"({"templateID":"no-such-image"})");
  EXPECT_EQ(r.status, 404) << r.body.dump();

  // Over the body limit: refused from its Content-Length, before any of it is read.
  r = Request(port_, "POST", "/sandboxes", key_, "", "Content-Length: 5000000\r\n");
  EXPECT_EQ(r.status, 413) << r.head;

  r = Request(port_, "GET", "/v2/sandboxes?limit=0", key_);
  EXPECT_EQ(r.status, 400);
  r = Request(port_, "GET", "/v2/sandboxes?state=frozen", key_);
  EXPECT_EQ(r.status, 400);
  r = Request(port_, "POST", "/sandboxes/nosuch/timeout", key_, R"({"timeout":5})");
  EXPECT_EQ(r.status, 404);
  r = Request(port_, "POST", "/sandboxes/nosuch/timeout", key_, R"({})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(LiveVms(), before);

  // denyOut: names become the VM's deny entries; an address or a CIDR (the SDK's ALL_TRAFFIC
  // is 0.0.0.0/0) adds nothing, every address being refused as such already.
  r = Request(port_, "POST", "/sandboxes", key_,
              R"({"templateID":"debian-12","network":{"allowOut":["a.test"],)"
              R"("denyOut":["0.0.0.0/0","evil.test","::/0"]}})");
  ASSERT_EQ(r.status, 201) << r.body.dump();
  const std::string denied = r.body["sandboxID"];
  bool listed = false;
  for (const auto& v : Json::parse(h_->Cli({"ls", "--json"}).out)) {
    if (v["id"] != denied) continue;
    listed = true;
    EXPECT_EQ(v["egress"]["allow"], Json({"a.test:443"})) << v.dump();
    EXPECT_EQ(v["egress"]["deny"], Json({"evil.test"})) << v.dump();
  }
  EXPECT_TRUE(listed);
  EXPECT_EQ(Request(port_, "DELETE", "/sandboxes/" + denied, key_).status, 204);

  // Another key's sandbox is not there for this one: not seen, not killed, not extended.
  const std::string other = NewKey("other");
  r = Request(port_, "POST", "/sandboxes", other, R"({"templateID":"debian-12","timeout":300})");
  ASSERT_EQ(r.status, 201) << r.body.dump();
  const std::string id = r.body["sandboxID"];
  EXPECT_EQ(r.body["envdVersion"], "0.5.2");
  EXPECT_EQ(Request(port_, "GET", "/sandboxes/" + id, key_).status, 404);
  EXPECT_EQ(Request(port_, "DELETE", "/sandboxes/" + id, key_).status, 404);
  EXPECT_EQ(
      Request(port_, "POST", "/sandboxes/" + id + "/timeout", key_, R"({"timeout":1})").status,
      404);
  r = Request(port_, "GET", "/v2/sandboxes", key_);
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.body.empty()) << r.body.dump();
  r = Request(port_, "GET", "/sandboxes/" + id, other);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body["sandboxID"], id);

  // A removed key stops working at once; its sandbox is still the daemon's to end.
  CliResult rm = h_->Cli({"api-key", "rm", "other"});
  EXPECT_EQ(rm.code, 0) << rm.err;
  EXPECT_EQ(Request(port_, "GET", "/sandboxes/" + id, other).status, 401);
  CliResult ls = h_->Cli({"api-key", "ls"});
  EXPECT_NE(ls.out.find("e2e"), std::string::npos) << ls.out;
  EXPECT_EQ(ls.out.find("other"), std::string::npos) << ls.out;
  EXPECT_EQ(ls.out.find("e2b_"), std::string::npos) << "a listing shows a key: " << ls.out;
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);

  // `serve` again on the same address is a no-op; another address is refused while serving;
  // a non-loopback address is refused outright.
  EXPECT_EQ(h_->Cli({"serve", "--listen", url_.substr(7)}).code, 0);
  CliResult elsewhere = h_->Cli({"serve", "--listen", "127.0.0.1:1"});
  EXPECT_NE(elsewhere.code, 0);
  EXPECT_NE(elsewhere.err.find("already serving"), std::string::npos) << elsewhere.err;
  CliResult wide = h_->Cli({"serve", "--listen", "0.0.0.0:0"});
  EXPECT_NE(wide.code, 0);
  EXPECT_NE(wide.err.find("loopback"), std::string::npos) << wide.err;
}

// A sandbox's secrets (trybox.secrets, the socket's create fields): the guest's commands
// see a placeholder in the variable, never the value; the value is in no reply or log.
TEST_F(E2bE2E, SecretsGivenAtCreateReachTheGuestOnlyAsPlaceholders) {
  const std::string value = "tbx-secret-value-41c7";
  HttpReply r = Request(port_, "POST", "/sandboxes", key_,
                        R"({"templateID":"debian-12","timeout":300,"trybox":{"memory_mib":384,
                        "secrets":[{"name":"API_TOKEN","value":")" +
                            value + R"(","hosts":["api.test"]}]}})");
  ASSERT_EQ(r.status, 201) << r.body.dump();
  const std::string id = r.body["sandboxID"];
  EXPECT_EQ(r.body.dump().find(value), std::string::npos);
  r = Request(port_, "GET", "/sandboxes/" + id, key_);
  EXPECT_EQ(r.body["memoryMB"], 384) << r.body.dump();
  CliResult env = h_->Cli({"exec", id, "--", "sh", "-c", "printf %s \"$API_TOKEN\""});
  EXPECT_EQ(env.code, 0) << env.err;
  EXPECT_FALSE(env.out.empty()) << "the variable is not set in the guest";
  EXPECT_EQ(env.out.find(value), std::string::npos) << "the guest sees the secret's value";
  EXPECT_EQ(env.out.size(), value.size()) << "a placeholder has the value's length: " << env.out;
  EXPECT_EQ(Request(port_, "DELETE", "/sandboxes/" + id, key_).status, 204);
  EXPECT_EQ(ReadFileToString(h_->home() + "/tryboxd.log").value_or("").find(value),
            std::string::npos)
      << "the secret's value is in the daemon's log";
}

// 41.11: a removed key's sandboxes went on answering their access tokens, for up to 24 h.
// Now the token goes with the key, at once; the sandbox runs on for an operator to see.
TEST_F(E2bE2E, RemovingAKeyRevokesItsSandboxesTokensAndTheSandboxesRunOn) {
  const std::string key = NewKey("revoked");
  HttpReply made =
      Request(port_, "POST", "/sandboxes", key, R"({"templateID":"debian-12","timeout":300})");
  ASSERT_EQ(made.status, 201) << made.body.dump();
  const std::string id = made.body["sandboxID"], token = made.body["envdAccessToken"];
  const std::string envd = "E2b-Sandbox-Id: " + id + "\r\nX-Access-Token: " + token + "\r\n";
  HttpReply listed = Request(port_, "POST", "/process.Process/List", "", "{}", envd);
  EXPECT_EQ(listed.status, 200) << listed.body.dump();

  ASSERT_EQ(h_->Cli({"api-key", "rm", "revoked"}).code, 0);
  HttpReply refused = Request(port_, "POST", "/process.Process/List", "", "{}", envd);
  EXPECT_EQ(refused.status, 401) << refused.body.dump();
  EXPECT_EQ(refused.body.value("code", ""), "unauthenticated") << refused.body.dump();
  EXPECT_NE(refused.body.value("message", "").find("was removed"), std::string::npos)
      << refused.body.dump();
  // A key made again under the same name is another key: the token stays revoked.
  (void)NewKey("revoked");
  EXPECT_EQ(Request(port_, "POST", "/process.Process/List", "", "{}", envd).status, 401);

  bool listed_by_the_daemon = false;
  auto vms = h_->Call({{"verb", "list"}});
  ASSERT_TRUE(vms.ok()) << vms.status().message();
  for (const Json& v : (*vms)["vms"]) listed_by_the_daemon |= v.value("id", "") == id;
  EXPECT_TRUE(listed_by_the_daemon) << vms->dump();
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
  EXPECT_EQ(h_->Cli({"api-key", "rm", "revoked"}).code, 0);
}

// A command's stream is open (a raw Connect call, as the SDK makes it) when the server is
// told to stop: the stop returns without waiting for the quiet command (it used to wait
// for the next keepalive, here an hour away), the stream ends with no exit code, the
// command runs on.
TEST_F(E2bE2E, StoppingTheServerEndsOpenStreamsAndLeavesTheCommandRunning) {
  HttpReply made =
      Request(port_, "POST", "/sandboxes", key_, R"({"templateID":"debian-12","timeout":300})");
  ASSERT_EQ(made.status, 201) << made.body.dump();
  const std::string id = made.body["sandboxID"], token = made.body["envdAccessToken"];

  const std::string msg =
      R"({"process":{"cmd":"/bin/bash","args":["-l","-c","echo started; sleep 600"]}})";
  std::string envelope(5, '\0');
  envelope[4] = static_cast<char>(msg.size());
  envelope += msg;
  auto fd = ConnectTcpLoopback(port_);
  ASSERT_TRUE(fd.ok());
  const std::string req =
      "POST /process.Process/Start HTTP/1.1\r\nHost: x\r\n"
      "Content-Type: application/connect+json\r\nE2b-Sandbox-Id: " +
      id + "\r\nX-Access-Token: " + token +
      "\r\nKeepalive-Ping-Interval: 3600\r\nContent-Length: " + std::to_string(envelope.size()) +
      "\r\n\r\n" + envelope;
  ASSERT_TRUE(WriteFull(fd->get(), req).ok());
  std::string got;
  char buf[4096];
  while (got.find("c3RhcnRlZAo=") == std::string::npos) {  // base64 of "started\n"
    ssize_t n = ::recv(fd->get(), buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << got;
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_NE(got.find("\"start\""), std::string::npos) << got;

  const auto t0 = std::chrono::steady_clock::now();
  CliResult stop = h_->Cli({"serve", "--stop"});
  const double stop_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(stop.code, 0) << stop.err;
  while (true) {
    ssize_t n = ::recv(fd->get(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  // The connection ended (the server shut it on its way out) with no `end` event: the SDK
  // sees a broken stream, never an exit code.
  EXPECT_EQ(got.find("\"end\""), std::string::npos) << got;
  std::cerr << "[ figures ] serve --stop with a quiet stream open took " << stop_s << " s\n";

  // The command is still running: it is an exec like any other.
  auto ps = h_->Call({{"verb", "ps"}, {"vm", id}});
  ASSERT_TRUE(ps.ok()) << ps.status().message();
  bool running = false;
  for (const Json& e : (*ps)["execs"]) running |= e.value("state", "") == "running";
  EXPECT_TRUE(running) << ps->dump();
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
  // Serving again on the same address, for any test after this one.
  EXPECT_EQ(h_->Cli({"serve", "--listen", url_.substr(7)}).code, 0);
}

}  // namespace
}  // namespace trybox::e2e
