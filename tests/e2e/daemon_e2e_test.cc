// The daemon's own life (issue 51, items 5, 10-15, 17-19): a restart that checks the
// configuration first, SIGHUP as a reload, execs cut off by a stop that say so, the HTTP API
// back on its port after a restart, one description of a daemon gone mid-request, execs of a
// killed daemon marked `interrupted`, a store damaged while the daemon runs, exec logs of
// unrecorded VMs kept, and what `daemon status` shows.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string Log(const Harness& h) {
  return ReadFileToString(h.home() + "/tryboxd.log").value_or("") +
         ReadFileToString(h.home() + "/state/tryboxd.log").value_or("");
}

// Waits until VM `vm` has an exec in state running (its command started in the guest).
bool WaitForRunningExec(const Harness& h, const std::string& vm) {
  for (int i = 0; i < 600; ++i) {
    auto ps = h.Call({{"verb", "ps"}, {"vm", vm}});
    if (ps.ok()) {
      for (const auto& e : (*ps)["execs"]) {
        if (e.value("state", "") == "running") return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// A daemon the CLI started (`daemon restart`) is not the harness's child: stopped by name of
// its socket when the test ends, however it ends.
struct StopsTheDaemon {
  const Harness& h;
  ~StopsTheDaemon() { (void)h.Cli({"daemon", "stop"}); }
};

Json Status(const Harness& h) {
  CliResult r = h.Cli({"daemon", "status", "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  return r.code == 0 ? Json::parse(r.out) : Json::object();
}

// Item 5: with an egress.json a new daemon would refuse, `daemon restart` refuses before it
// stops anything, names the error, and the daemon and its VMs carry on.
TEST(DaemonE2E, ARestartWithABadConfigurationIsRefusedAndStopsNothing) {
  auto h = Harness::Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult c = (*h)->Cli({"create"});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = FirstLine(c.out);
  ASSERT_TRUE(MakeDirs((*h)->home() + "/config", 0700).ok());
  ASSERT_TRUE(WriteFileAtomic((*h)->home() + "/config/egress.json", "{\"profiles\": 3}").ok());
  CliResult restart = (*h)->Cli({"daemon", "restart"});
  EXPECT_EQ(restart.code, 125) << restart.out << restart.err;
  EXPECT_NE(restart.err.find("egress.json"), std::string::npos) << restart.err;
  EXPECT_NE(restart.err.find("'profiles' must be an object"), std::string::npos) << restart.err;
  EXPECT_NE(restart.err.find("not restarted"), std::string::npos) << restart.err;
  // The same daemon, the same VM, still working.
  EXPECT_EQ(Status(**h).value("pid", 0), (*h)->daemon_pid());
  CliResult ex = (*h)->Cli({"exec", vm, "--", "echo", "still here"});
  EXPECT_EQ(ex.code, 0) << ex.err;
  EXPECT_EQ(ex.out, "still here\n");
  EXPECT_NE(Log(**h).find("restart refused"), std::string::npos);
}

// Item 11: SIGHUP reloads the configuration; the daemon and its VMs stay.
TEST(DaemonE2E, SighupReloadsTheConfigurationInsteadOfStopping) {
  auto h = Harness::Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult c = (*h)->Cli({"create"});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = FirstLine(c.out);
  ASSERT_TRUE(MakeDirs((*h)->home() + "/config", 0700).ok());
  ASSERT_TRUE(WriteFileAtomic((*h)->home() + "/config/egress.json",
                              Json({{"profiles", {{"hup", {"one.test:80"}}}}}).dump())
                  .ok());
  ASSERT_EQ(::kill((*h)->daemon_pid(), SIGHUP), 0);
  // The reload is logged; until then a create with the new profile would be refused.
  bool reloaded = false;
  for (int i = 0; i < 300 && !reloaded; ++i) {
    reloaded = Log(**h).find("reloaded egress.json") != std::string::npos;
    if (!reloaded) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(reloaded) << Log(**h);
  EXPECT_EQ(Status(**h).value("pid", 0), (*h)->daemon_pid());
  CliResult ls = (*h)->Cli({"ls", "--json"});
  ASSERT_EQ(ls.code, 0) << ls.err;
  EXPECT_NE(ls.out.find(vm), std::string::npos) << ls.out;
  CliResult p = (*h)->Cli({"create", "--profile", "hup"});
  EXPECT_EQ(p.code, 0) << p.err;
  // A broken file: SIGHUP refuses it, says so in the log, and the daemon stays.
  ASSERT_TRUE(WriteFileAtomic((*h)->home() + "/config/egress.json", "{\"profiles\": {").ok());
  ASSERT_EQ(::kill((*h)->daemon_pid(), SIGHUP), 0);
  bool refused = false;
  for (int i = 0; i < 300 && !refused; ++i) {
    refused = Log(**h).find("reload refused") != std::string::npos;
    if (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(refused) << Log(**h);
  EXPECT_NE(Log(**h).find("not valid JSON at line 1, column"), std::string::npos) << Log(**h);
  EXPECT_EQ(Status(**h).value("pid", 0), (*h)->daemon_pid());
}

// Item 12: an exec cut off by `daemon stop` says the daemon was stopped, not "QEMU exited
// (signal 9)".
TEST(DaemonE2E, AnExecCutOffByAStopSaysTheDaemonWasStopped) {
  auto h = Harness::Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult c = (*h)->Cli({"create"});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = FirstLine(c.out);
  CliResult ex;
  std::thread exec([&] { ex = (*h)->Cli({"exec", vm, "--", "sleep", "600"}); });
  const bool running = WaitForRunningExec(**h, vm);
  CliResult stop = (*h)->Cli({"daemon", "stop"});
  exec.join();
  ASSERT_TRUE(running);
  EXPECT_EQ(stop.code, 0) << stop.err;
  EXPECT_EQ(ex.code, 125) << ex.err;
  EXPECT_NE(ex.err.find("tryboxd was stopped (trybox daemon stop)"), std::string::npos) << ex.err;
  EXPECT_EQ(ex.err.find("QEMU exited"), std::string::npos) << ex.err;
}

// Item 13: the HTTP API `trybox serve` started comes back on the same port after a restart.
TEST(DaemonE2E, TheHttpApiComesBackOnItsPortAfterARestart) {
  auto h = Harness::Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult serve = (*h)->Cli({"serve", "--json"});
  ASSERT_EQ(serve.code, 0) << serve.err;
  const std::string url = Json::parse(serve.out).value("url", "");
  ASSERT_FALSE(url.empty()) << serve.out;
  StopsTheDaemon stops{**h};
  CliResult restart = (*h)->Cli({"daemon", "restart"});
  ASSERT_EQ(restart.code, 0) << restart.err;
  // The new daemon (the CLI's child, not the harness's) serves where the old one did.
  auto keys = (*h)->Call({{"verb", "api_key_ls"}});
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ((*keys)["serving"], url) << keys->dump();
  // And `serve` with no address keeps that port.
  CliResult again = (*h)->Cli({"serve", "--json"});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(Json::parse(again.out).value("url", ""), url);
  // `serve --stop` forgets it: the next daemon does not serve.
  ASSERT_EQ((*h)->Cli({"serve", "--stop"}).code, 0);
  ASSERT_EQ((*h)->Cli({"daemon", "restart"}).code, 0);
  keys = (*h)->Call({{"verb", "api_key_ls"}});
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_TRUE((*keys)["serving"].is_null()) << keys->dump();
}

// Item 14: a daemon that dies mid-request is described the same way by every verb, and
// `commit` exits 125 like the others.
TEST(DaemonE2E, ADeadDaemonIsDescribedOneWayAndEveryVerbExits125) {
  auto h = Harness::Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult commit = (*h)->Cli({"commit", "deadbeef0000", "never-made"});
  EXPECT_EQ(commit.code, 125) << commit.err;
  CliResult c = (*h)->Cli({"create"});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = FirstLine(c.out);
  CliResult d = (*h)->Cli({"exec", "-d", vm, "--", "sleep", "600"});
  ASSERT_EQ(d.code, 0) << d.err;
  const std::string exec_id = FirstLine(d.out);
  CliResult ex, logs;
  std::thread exec([&] { ex = (*h)->Cli({"exec", vm, "--", "sleep", "600"}); });
  std::thread follow([&] { logs = (*h)->Cli({"logs", "-f", exec_id}); });
  const bool running = WaitForRunningExec(**h, vm);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // `logs -f` is following
  (*h)->CrashDaemon();
  exec.join();
  follow.join();
  ASSERT_TRUE(running);
  const std::string said =
      "cannot reach tryboxd at " + (*h)->socket() + ": it went away during the request";
  for (const CliResult* r : {&ex, &logs}) {
    EXPECT_EQ(r->code, 125) << r->err;
    EXPECT_NE(r->err.find(said), std::string::npos) << r->err;
  }
}

// Item 15: an exec running when its daemon was killed is `interrupted` in the record from the
// next start, not `running` forever.
TEST(DaemonE2E, AnExecOfAKilledDaemonIsMarkedInterruptedAtTheNextStart) {
  auto h = Harness::Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult c = (*h)->Cli({"create"});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = FirstLine(c.out);
  CliResult d = (*h)->Cli({"exec", "-d", vm, "--", "sleep", "600"});
  ASSERT_EQ(d.code, 0) << d.err;
  ASSERT_TRUE(WaitForRunningExec(**h, vm));
  (*h)->CrashDaemon();
  ASSERT_TRUE((*h)->RestartDaemon().ok());
  auto ps = (*h)->Call({{"verb", "ps"}, {"vm", vm}});
  ASSERT_TRUE(ps.ok()) << ps.status().ToString();
  ASSERT_EQ((*ps)["execs"].size(), 1u) << ps->dump();
  const Json& e = (*ps)["execs"][0];
  EXPECT_EQ(e["outcome"], "interrupted") << e.dump();
  EXPECT_EQ(e["state"], "ended") << e.dump();
  EXPECT_NE(e.value("error", "").find("daemon that ran it ended"), std::string::npos) << e.dump();
  // `logs` of it ends (it would follow a running exec).
  CliResult logs = (*h)->Cli({"logs", "-f", FirstLine(d.out)});
  EXPECT_EQ(logs.code, 0) << logs.err;
}

// Item 18: a store damaged while the daemon runs is noticed by its periodic check, logged
// and shown by `daemon status`.
TEST(DaemonE2E, AStoreDamagedWhileTheDaemonRunsIsNoticedAndShown) {
  auto h = Harness::Start({"TRYBOX_SPARES=0", "TRYBOX_STORE_CHECK_S=1"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  Json s = Status(**h);
  EXPECT_EQ(s["store"]["check"]["ok"], true) << s.dump(2);
  // Every page after the first overwritten: the schema (page 1) still names tables whose
  // pages are now garbage.
  const std::string db = (*h)->home() + "/state/trybox.db";
  {
    UniqueFd fd(::open(db.c_str(), O_WRONLY | O_CLOEXEC));
    ASSERT_TRUE(fd.valid());
    const off_t size = ::lseek(fd.get(), 0, SEEK_END);
    ASSERT_GT(size, 4096);
    std::string junk(static_cast<size_t>(size - 4096), '\xA5');
    ASSERT_EQ(::pwrite(fd.get(), junk.data(), junk.size(), 4096),
              static_cast<ssize_t>(junk.size()));
  }
  bool noticed = false;
  for (int i = 0; i < 300 && !noticed; ++i) {
    s = Status(**h);
    noticed = s["store"]["check"].value("ok", true) == false;
    if (!noticed) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(noticed) << s.dump(2);
  EXPECT_NE(s["store"]["check"].value("detail", "").find("damaged"), std::string::npos)
      << s.dump(2);
  CliResult text = (*h)->Cli({"daemon", "status"});
  EXPECT_NE(text.out.find("store check: DAMAGED"), std::string::npos) << text.out;
  EXPECT_NE(Log(**h).find("is damaged"), std::string::npos);
  (*h)->CrashDaemon();  // its store is garbage: no clean stop to wait for
}

// Item 18: the start-up prune keeps the exec logs of a VM the store does not know (after a
// lost WAL they are the only trace), moved aside, never deleted.
TEST(DaemonE2E, ExecLogsOfAVmTheStoreDoesNotKnowAreKeptAside) {
  auto h = Harness::Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE((*h)->StopDaemon().ok());
  const std::string logs = (*h)->home() + "/state/execs/0123456789ab";
  ASSERT_TRUE(MakeDirs(logs, 0700).ok());
  ASSERT_TRUE(WriteFileAtomic(logs + "/1.stdout", "the only trace\n").ok());
  ASSERT_TRUE((*h)->RestartDaemon().ok());
  const std::string kept = (*h)->home() + "/state/execs-unrecorded/0123456789ab/1.stdout";
  auto text = ReadFileToString(kept);
  ASSERT_TRUE(text.ok()) << "deleted: " << text.status().ToString() << "\n" << Log(**h);
  EXPECT_EQ(*text, "the only trace\n");
  EXPECT_NE(Log(**h).find("execs-unrecorded"), std::string::npos);
}

// Item 19: `daemon status` names the log, the disk budget and reserve, and retention; a
// prune interval under 60 s is refused by name.
TEST(DaemonE2E, StatusNamesTheLogDiskAndRetentionAndAShortPruneIntervalIsRefused) {
  auto h = Harness::Start({"TRYBOX_SPARES=0", "TRYBOX_DISK_BUDGET_MIB=3000",
                           "TRYBOX_DISK_RESERVE_MIB=77", "TRYBOX_RETENTION_VMS=33"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  Json s = Status(**h);
  EXPECT_TRUE(s.contains("log_file")) << s.dump(2);
  EXPECT_EQ(s["retention"]["max_vms"], 33) << s.dump(2);
  EXPECT_EQ(s["limits"]["disk_budget_mib"], 3000) << s.dump(2);
  CliResult text = (*h)->Cli({"daemon", "status"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("log: "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("disk: 3000 MiB budget"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("77 MiB kept free"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("retention: "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("the newest 33"), std::string::npos) << text.out;
  // A daemon already runs for this home: one that took the flag would exit 3 (the lock).
  std::vector<std::string> env = (*h)->Env();
  CliResult d = RunProgram({BinDir() + "/tryboxd", "--prune-interval", "30"}, env);
  EXPECT_EQ(d.code, 2) << d.err;
  EXPECT_NE(d.err.find("at least 60"), std::string::npos) << d.err;
}

}  // namespace
}  // namespace trybox::e2e
