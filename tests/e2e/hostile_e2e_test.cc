// End to end: what a hostile guest, a hostile client and a hostile workspace can do to the
// daemon and the record, and what they can no longer do (issue 18). Real VMs, the real CLI
// and a private tryboxd; guests are driven with the tools the image has (python3, sh).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "channel/mux.h"
#include "store/store.h"
#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/socket.h"
#include "workspace/testing.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;
using Kind = channel::Stream::Message::Kind;
namespace wt = trybox::workspace::testing;

class HostileE2E : public SharedHarness<HostileE2E> {
 protected:
  void SetUp() override {
    ASSERT_NE(h_, nullptr);
    auto t = TempDir::Make("/tmp", "tbx-hostile-e2e-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
    repo_ = tmp_->path() + "/repo";
    auto r =
        wt::Sh(tmp_->path(), "git init -q -b main '" + repo_ + "' && cd '" + repo_ +
                                 "' && echo base > README && git add -A && git -c user.name=t -c "
                                 "user.email=t@t commit -qm init");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  std::string Create(std::vector<std::string> args) {
    args.insert(args.begin(), "create");
    CliResult r = h_->Cli(args);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.out.substr(0, r.out.find('\n'));
  }
  // Runs a python program in the VM (as root unless the VM is privileged).
  CliResult Python(const std::string& vm, const std::string& program) {
    EXPECT_TRUE(WriteFileAtomic(tmp_->path() + "/p.py", program).ok());
    EXPECT_EQ(h_->Cli({"cp", tmp_->path() + "/p.py", vm + ":/root/p.py"}).code, 0);
    return h_->Cli({"exec", vm, "--", "python3", "/root/p.py"});
  }
  void ExpectDaemonServes(const std::string& neighbour) {
    CliResult ls = h_->Cli({"ls", "--json"});
    EXPECT_EQ(ls.code, 0) << ls.err;
    CliResult e = h_->Cli({"exec", neighbour, "--", "echo", "still-here"});
    EXPECT_EQ(e.code, 0) << e.err;
    EXPECT_EQ(e.out, "still-here\n");
  }

  std::optional<TempDir> tmp_;
  std::string repo_;
};

TEST_F(HostileE2E, MalformedFramesFromInsideAGuestCostOnlyThatGuestsChannel) {
  // Only a privileged VM's commands can reach the channel now; from there, every malformed
  // frame the campaign sent (each once killed tryboxd) is tried in turn.
  std::string evil = Create({"--privileged"});
  std::string neighbour = Create({});
  std::string inject =
      "import ctypes, os, struct, sys\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "pidfd = libc.syscall(434, 1, 0)\n"
      "fds = [d for d in (libc.syscall(438, pidfd, fd, 0) for fd in range(64)) if d >= 0]\n"
      "def frame(stream, type, payload):\n"
      "    return struct.pack('<IIBBH', len(payload), stream, type, 0, 0) + payload\n"
      "kinds = {\n"
      "  'event-type-int': frame(0, 4, b'{\"type\":1}'),\n"
      "  'end-outcome-int': b''.join(frame(s, 6, b'{\"outcome\":1}') for s in range(1, 99, 2)),\n"
      "  'open-op-int': frame(2, 1, b'{\"op\":1}'),\n"
      "  'reset-reason-int': b''.join(frame(s, 7, b'{\"reason\":1}') for s in range(1, 99, 2)),\n"
      "  'event-array': frame(0, 4, b'[1,2]'),\n"
      "}\n"
      "which = sys.argv[1] if len(sys.argv) > 1 else ''\n"
      "for fd in fds:\n"
      "    try: os.write(fd, kinds[which])\n"
      "    except OSError: pass\n"
      "print('descriptors', len(fds))\n";
  ASSERT_TRUE(WriteFileAtomic(tmp_->path() + "/inject.py", inject).ok());
  ASSERT_EQ(h_->Cli({"cp", tmp_->path() + "/inject.py", evil + ":/root/inject.py"}).code, 0);
  for (const char* kind :
       {"event-type-int", "open-op-int", "reset-reason-int", "end-outcome-int", "event-array"}) {
    SCOPED_TRACE(kind);
    CliResult r = h_->Cli({"exec", evil, "--", "python3", "/root/inject.py", kind});
    if (std::string(kind) == "event-type-int") {
      // The injection reaches the channel (a privileged VM): the test tests something.
      EXPECT_NE(r.out.find("descriptors "), std::string::npos) << r.out << r.err;
      EXPECT_EQ(r.out.find("descriptors 0"), std::string::npos) << r.out;
    }
    // Whatever it did to its own VM's requests, the daemon serves, and so does the neighbour.
    ExpectDaemonServes(neighbour);
  }
  // The last kind closed the evil VM's channel with a named error; it is dead, not forged.
  Json ls = Json::parse(h_->Cli({"ls", "--json"}).out, nullptr, false);
  for (const auto& v : ls) {
    if (v["id"] == evil) {
      EXPECT_EQ(v["state"], "dead") << v.dump();
      EXPECT_NE(v["note"].get<std::string>().find("malformed control event"), std::string::npos)
          << v.dump();
    }
  }
  EXPECT_EQ(h_->Cli({"rm", evil, neighbour}).code, 0);
}

TEST_F(HostileE2E, WrongTypedRequestsOnTheSocketAreAnsweredAndNothingStarts) {
  auto fd = ConnectUnix(h_->socket());
  ASSERT_TRUE(fd.ok());
  channel::Mux mux(std::move(*fd), channel::Role::kHost);
  mux.Start();
  auto call = [&](const Json& req) {
    auto s = mux.Open(req);
    EXPECT_TRUE(s.ok());
    auto m = (*s)->Next();
    EXPECT_TRUE(m.ok());
    return m.ok() ? m->body : Json();
  };
  for (const Json& req :
       {Json{{"verb", 1}}, Json{{"verb", "create"}, {"ephemeral", "yes"}},
        Json{{"verb", "create"}, {"memory_mib", 4294967808u}},
        Json{{"verb", "exec"}, {"vm", "x"}, {"argv", {"true"}}, {"timeout_ms", 4294967.297}},
        Json{{"verb", "audit"}, {"limit", 1e20}}}) {
    Json r = call(req);
    EXPECT_EQ(r.value("ok", true), false) << req.dump();
    EXPECT_EQ(r["error"].value("code", ""), "INVALID_ARGUMENT") << r.dump();
  }
  Json ls = Json::parse(h_->Cli({"ls", "--json"}).out, nullptr, false);
  EXPECT_TRUE(ls.is_array() && ls.empty()) << ls.dump();
}

TEST_F(HostileE2E, NamesThatAreNotUtf8OrThatGitRefusesComeBackNamedAndExact) {
  std::string vm = Create({"--workspace", repo_});
  CliResult made = Python(vm,
                          "import os\n"
                          "os.chdir('/workspace')\n"
                          "open(b'bad\\xff', 'w').write('x')\n"
                          "open('caf\\u00e9', 'w').write('y')\n"
                          "open('a\\nb', 'w').write('z')\n"
                          "os.makedirs('git~1', exist_ok=True); open('git~1/config', 'w')\n"
                          "os.makedirs('.GIT', exist_ok=True); open('.GIT/config', 'w')\n");
  ASSERT_EQ(made.code, 0) << made.err;
  CliResult c = h_->Cli({"collect", vm, "--json"});
  ASSERT_EQ(c.code, 0) << c.err;
  Json j = Json::parse(c.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << c.out;
  bool exact = false, cafe = false;
  for (const auto& ch : j["changes"]) {
    if (ch.contains("path_b64") && ch["path_b64"] == "YmFk/w==") exact = true;  // b"bad\xff"
    if (ch.value("path", "") == "caf\u00e9") cafe = true;
  }
  EXPECT_TRUE(exact) << c.out;
  EXPECT_TRUE(cafe) << c.out;
  std::string skipped = j["skipped"].dump();
  EXPECT_NE(skipped.find("git~1"), std::string::npos) << skipped;
  EXPECT_NE(skipped.find(".GIT"), std::string::npos) << skipped;
  EXPECT_NE(skipped.find("a\\nb"), std::string::npos) << skipped;
  // The record and the commit agree, and the commit names no path of the daemon's.
  auto tree = wt::Sh(tmp_->path(), "git -C '" + repo_ + "' ls-tree -r --name-only trybox/" + vm);
  ASSERT_TRUE(tree.ok());
  EXPECT_EQ(tree->find("config"), std::string::npos) << *tree;
  auto msg = wt::Sh(tmp_->path(), "git -C '" + repo_ + "' log -1 --format=%B trybox/" + vm);
  ASSERT_TRUE(msg.ok());
  EXPECT_EQ(msg->find(h_->home()), std::string::npos) << *msg;
  CliResult d = h_->Cli({"diff", vm, "--json"});
  EXPECT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(h_->Cli({"rm", vm}).code, 0);
}

TEST_F(HostileE2E, ThirtyThousandFilesCollectAndDiffPageThrough) {
  std::string vm = Create({"--workspace", repo_});
  CliResult made = Python(vm,
                          "import os\n"
                          "for i in range(30000):\n"
                          "    d = '/workspace/d%03d' % (i % 100)\n"
                          "    os.makedirs(d, exist_ok=True)\n"
                          "    open('%s/f%05d' % (d, i), 'w').close()\n");
  ASSERT_EQ(made.code, 0) << made.err;
  CliResult c = h_->Cli({"collect", vm, "--no-commit", "--json"});
  ASSERT_EQ(c.code, 0) << c.err;
  Json j = Json::parse(c.out, nullptr, false);
  EXPECT_EQ(j.value("changes_total", 0), 30000) << c.out.substr(0, 400);
  CliResult d = h_->Cli({"diff", vm, "--json"});
  ASSERT_EQ(d.code, 0) << d.err;
  Json all = Json::parse(d.out, nullptr, false);
  EXPECT_EQ(all["changes"].size(), 30000u);
  EXPECT_EQ(h_->Cli({"rm", vm}).code, 0);
}

TEST_F(HostileE2E, TheEntryQuotaStopsACollectAndTheVmKeepsRunning) {
  std::string vm = Create({"--workspace", repo_, "--workspace-quota-entries", "100"});
  ASSERT_EQ(Python(vm,
                   "for i in range(300):\n"
                   "    open('/workspace/f%d' % i, 'w').close()\n")
                .code,
            0);
  CliResult c = h_->Cli({"collect", vm});
  EXPECT_EQ(c.code, 125);
  EXPECT_NE(c.err.find("100 entries"), std::string::npos) << c.err;
  EXPECT_EQ(h_->Cli({"exec", vm, "--", "true"}).code, 0);
  EXPECT_EQ(h_->Cli({"rm", vm}).code, 0);
}

TEST_F(HostileE2E, AFloodOfRefusedConnectionsIsSummarisedNotRecordedOneByOne) {
  std::string vm = Create({});
  CliResult flood = Python(vm,
                           "import socket\n"
                           "refused = 0\n"
                           "for i in range(300):\n"
                           "    s = socket.create_connection(('127.0.0.1', 3128))\n"
                           "    s.sendall(b'CONNECT evil.test:443 HTTP/1.1\\r\\n\\r\\n')\n"
                           "    if b' 403 ' in s.recv(4096): refused += 1\n"
                           "    s.close()\n"
                           "print(refused)\n");
  ASSERT_EQ(flood.code, 0) << flood.err;
  EXPECT_EQ(flood.out, "300\n");           // every one was refused
  EXPECT_EQ(h_->Cli({"rm", vm}).code, 0);  // its counts are written when it goes
  Json rows = Json::parse(h_->Cli({"audit", "--vm", vm, "--json"}).out, nullptr, false);
  ASSERT_TRUE(rows.is_array());
  EXPECT_LE(rows.size(), 25u);
  bool summary = false;
  for (const auto& r : rows) {
    if (r.value("reason", "").find("were not recorded one by one") != std::string::npos) {
      summary = true;
    }
  }
  EXPECT_TRUE(summary) << rows.dump(2);
}

TEST_F(HostileE2E, AnAuditOfThousandsOfRowsComesBackWholeThroughPages) {
  // Rows written beside the daemon, as a long-lived host accumulates them.
  auto store = store::Store::Open(h_->home() + "/state/trybox.db");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  for (int i = 0; i < 3500; ++i) {
    store::EgressRecord e;
    e.vm_id = "auditpaging";
    e.started_at = store::NowSeconds();
    e.host = "h" + std::to_string(i) + ".test";
    e.port = 443;
    e.verdict = "refused";
    e.reason = "test row";
    ASSERT_TRUE((*store)->InsertEgress(e).ok());
  }
  CliResult a = h_->Cli({"audit", "--vm", "auditpaging", "--limit", "3500", "--json"});
  ASSERT_EQ(a.code, 0) << a.err;
  Json rows = Json::parse(a.out, nullptr, false);
  ASSERT_EQ(rows.size(), 3500u);
  EXPECT_EQ(rows.front()["host"], "h0.test");
  EXPECT_EQ(rows.back()["host"], "h3499.test");
}

}  // namespace
}  // namespace trybox::e2e
