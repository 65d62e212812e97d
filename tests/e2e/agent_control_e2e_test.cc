// End to end: controlling a vm_agent run while it works, and the agent process's isolation
// (issues 14, 15 and 18). Real VMs, the real CLI, the real trybox-agent; the scripted fake
// model is the only fake.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string_view>

#include "tests/e2e/agent_fixture.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

class AgentControlE2E : public AgentFixture {
 protected:
  // A CLI left running: its stderr is read line by line as it comes.
  struct Running {
    ChildProcess child;
    UniqueFd out_file_fd;
    std::string out_path;
    UniqueFd err;
    std::string err_seen;

    // Reads stderr until `text` appears (or it ends, or 120 s pass); true if it did.
    bool WaitFor(const std::string& text) {
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (err_seen.find(text) == std::string::npos) {
        int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        until - std::chrono::steady_clock::now())
                                        .count());
        if (left <= 0) return false;
        struct pollfd p = {err.get(), POLLIN, 0};
        if (::poll(&p, 1, left) <= 0) return false;
        char buf[4096];
        ssize_t n = ::read(err.get(), buf, sizeof buf);
        if (n <= 0) return false;
        err_seen.append(buf, static_cast<size_t>(n));
      }
      return true;
    }
    // Reads stderr to its end (the CLI's exit), or for at most 120 s.
    void ReadRest() {
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      for (;;) {
        int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        until - std::chrono::steady_clock::now())
                                        .count());
        struct pollfd p = {err.get(), POLLIN, 0};
        if (left <= 0 || ::poll(&p, 1, left) <= 0) return;
        char buf[4096];
        ssize_t n = ::read(err.get(), buf, sizeof buf);
        if (n <= 0) return;
        err_seen.append(buf, static_cast<size_t>(n));
      }
    }
    // Waits for the exit; the code and stdout.
    int Finish(std::string* out) {
      auto exit = child.Wait();
      std::ifstream f(out_path);
      std::stringstream ss;
      ss << f.rdbuf();
      *out = ss.str();
      if (!exit.ok()) return -1;
      return exit->exited ? exit->code : 128 + exit->signal;
    }
  };

  // `env`: NAME=VALUE entries that replace the harness's.
  Running Start(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    Running r;
    r.out_path = tmp_->path() + "/cli-" + std::to_string(++started_) + ".out";
    auto out = OpenFile(r.out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    EXPECT_TRUE(out.ok());
    int p[2];
    EXPECT_EQ(::pipe2(p, O_CLOEXEC), 0);
    UniqueFd rd(p[0]), wr(p[1]);
    SpawnOptions so;
    so.argv = {BinDir() + "/trybox"};
    so.argv.insert(so.argv.end(), args.begin(), args.end());
    so.env = h_->Env();
    for (const auto& kv : env) {
      const std::string name = kv.substr(0, kv.find('=') + 1);
      std::erase_if(*so.env, [&](const std::string& e) { return e.rfind(name, 0) == 0; });
      so.env->push_back(kv);
    }
    so.stdout_fd = out->get();
    so.stderr_fd = wr.get();
    auto c = ChildProcess::Spawn(so);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    r.child = std::move(*c);
    r.err = std::move(rd);
    r.out_file_fd = std::move(*out);
    return r;
  }

  static std::string RunIdFrom(const std::string& err) {
    size_t at = err.find("trybox: run ");
    if (at == std::string::npos) return "";
    return err.substr(at + 12, 12);
  }

  // Pids of trybox-agent processes this harness's daemon started.
  std::vector<pid_t> AgentPids() const {
    std::vector<pid_t> out;
    for (pid_t pid : FindProcesses("trybox-agent")) {
      auto stat = ReadFileToString("/proc/" + std::to_string(pid) + "/stat");
      if (!stat.ok()) continue;
      size_t close = stat->rfind(')');
      std::istringstream rest(stat->substr(close + 2));
      std::string state;
      pid_t ppid = 0;
      rest >> state >> ppid;
      if (ppid == h_->daemon_pid()) out.push_back(pid);
    }
    return out;
  }

  // Whether `needle` is anywhere in the readable memory of `pid` (as root), read a MiB at a
  // time (overlapping by the needle's length). A mapping over 64 GiB is skipped: here only
  // AddressSanitizer's shadow reservation (terabytes of zero pages, no data) is that large.
  static bool InMemory(pid_t pid, const std::string& needle) {
    constexpr unsigned long kChunk = 1 << 20;
    constexpr unsigned long kShadowSize = 64ul << 30;
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    UniqueFd mem(::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY | O_CLOEXEC));
    if (!mem.valid()) return false;
    std::string line;
    std::string buf(kChunk + needle.size(), '\0');
    while (std::getline(maps, line)) {
      unsigned long lo = 0, hi = 0;
      char perms[5] = {0};
      if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) != 3 || perms[0] != 'r') {
        continue;
      }
      if (line.find("[vvar]") != std::string::npos || hi - lo > kShadowSize) continue;
      for (unsigned long at = lo; at < hi; at += kChunk) {
        const size_t want = static_cast<size_t>(std::min(hi - at, kChunk + needle.size()));
        ssize_t n = ::pread(mem.get(), buf.data(), want, static_cast<off_t>(at));
        if (n <= 0) break;
        if (std::string_view(buf.data(), static_cast<size_t>(n)).find(needle) !=
            std::string_view::npos) {
          return true;
        }
      }
    }
    return false;
  }

  int started_ = 0;
};

TEST_F(AgentControlE2E, CtrlCDuringALongCommandKillsItAndRecordsTheRunCancelled) {
  PushProbeReply();
  model_->Push(Turn({Call("write_file", {{"path", "work.txt"}, {"content", "partial"}})}));
  model_->Push(Turn({Call("run", {{"command", "sleep 300; echo never"}, {"timeout_s", 600}})}));
  Running cli =
      Start({"agent", "--image", "debian-12", "--model", ModelName(), "--json", "long work"});
  ASSERT_TRUE(cli.WaitFor("sleep 300")) << cli.err_seen;
  std::string run = RunIdFrom(cli.err_seen);
  ASSERT_FALSE(run.empty()) << cli.err_seen;
  // The progress line comes before the command starts; a follower sees "$ argv" once the
  // exec is recorded and running in the guest. Ctrl-C before that would cancel a run whose
  // command never started (seen once in CI: the report rightly had no commands).
  Running follow = Start({"agent", "show", run, "--follow"});
  ASSERT_TRUE(follow.WaitFor("$ /bin/sh -c sleep 300")) << follow.err_seen;
  ASSERT_EQ(cli.child.Signal(SIGINT).code(), Code::kOk);
  std::string out;
  int code = cli.Finish(&out);
  EXPECT_EQ(code, 130) << cli.err_seen;
  follow.ReadRest();
  std::string follow_out;
  EXPECT_EQ(follow.Finish(&follow_out), 130) << follow.err_seen;  // it saw the run cancelled
  Json report = Json::parse(out, nullptr, false);
  ASSERT_TRUE(report.is_object()) << out;
  EXPECT_EQ(report["outcome"], "CANCELLED");
  const Json* sleep = FindCommand(report, "sleep 300; echo never");
  ASSERT_NE(sleep, nullptr) << report.dump(2);
  EXPECT_EQ((*sleep)["outcome"], "cancelled");
  // The work so far was collected and committed; the VM is gone; it cannot be resumed.
  EXPECT_EQ(report["files"]["counts"]["added"], 1) << report.dump(2);
  EXPECT_EQ(report["vm"]["state"], "destroyed");
  CliResult resume = h_->Cli({"agent", "resume", run});
  EXPECT_EQ(resume.code, 125);
  EXPECT_NE(resume.err.find("CANCELLED"), std::string::npos) << resume.err;
  EXPECT_TRUE(AgentPids().empty());
}

TEST_F(AgentControlE2E, CancelFromAnotherTerminalStopsTheRun) {
  PushProbeReply();
  model_->Push(Turn({Call("run", {{"command", "sleep 300"}, {"timeout_s", 600}})}));
  Running cli =
      Start({"agent", "--image", "debian-12", "--model", ModelName(), "--json", "long work"});
  ASSERT_TRUE(cli.WaitFor("sleep 300")) << cli.err_seen;
  std::string run = RunIdFrom(cli.err_seen);
  CliResult cancel = h_->Cli({"agent", "cancel", run, "--json"});
  EXPECT_EQ(cancel.code, 130) << cancel.err;
  std::string out;
  EXPECT_EQ(cli.Finish(&out), 130);
  EXPECT_EQ(Json::parse(out, nullptr, false).value("outcome", ""), "CANCELLED") << out;
  Json listed = Json::parse(h_->Cli({"agent", "ls", "--json"}).out, nullptr, false);
  bool found = false;
  for (const auto& r : listed) found |= r.value("run", "") == run && r["outcome"] == "CANCELLED";
  EXPECT_TRUE(found) << listed.dump(2);
}

TEST_F(AgentControlE2E, ShowFollowPrintsEachCommandAndItsOutputAsTheRunWorks) {
  PushProbeReply();
  model_->Push(Turn(
      {Call("run", {{"command", "echo first-line; echo to-err >&2; sleep 6; echo second-line"}})}));
  model_->Push(Turn({Call("finish", {{"summary", "printed"}})}));
  Running cli = Start({"agent", "--image", "debian-12", "--model", ModelName(), "--json", "print"});
  ASSERT_TRUE(cli.WaitFor("trybox: run ")) << cli.err_seen;
  ASSERT_TRUE(cli.WaitFor("\n")) << cli.err_seen;
  std::string run = RunIdFrom(cli.err_seen);
  Running follow = Start({"agent", "show", run, "--follow"});
  // The command's first line arrives while it still runs (it sleeps 6 s before the second):
  // live from the kept output, not the tail at its end.
  // (The command's own text holds the words too, after "echo ": the output is a line.)
  ASSERT_TRUE(follow.WaitFor("\nfirst-line\n")) << follow.err_seen;
  EXPECT_EQ(follow.err_seen.find("\nsecond-line\n"), std::string::npos) << follow.err_seen;
  EXPECT_EQ(follow.err_seen.find("[exit 0]"), std::string::npos) << follow.err_seen;
  follow.ReadRest();
  std::string follow_out;
  EXPECT_EQ(follow.Finish(&follow_out), 2) << follow.err_seen;  // DONE, UNVERIFIED
  EXPECT_NE(follow.err_seen.find("$ /bin/sh -c echo first-line"), std::string::npos)
      << follow.err_seen;
  EXPECT_NE(follow.err_seen.find("\nto-err\n"), std::string::npos) << follow.err_seen;
  EXPECT_NE(follow.err_seen.find("\nsecond-line\n"), std::string::npos) << follow.err_seen;
  EXPECT_NE(follow.err_seen.find("[exit 0]"), std::string::npos) << follow.err_seen;
  // Sent live, the output is not printed again with the end.
  EXPECT_EQ(follow.err_seen.find("\nfirst-line\n"), follow.err_seen.rfind("\nfirst-line\n"))
      << follow.err_seen;
  EXPECT_NE(follow_out.find("DONE"), std::string::npos) << follow_out;
  std::string out;
  EXPECT_EQ(cli.Finish(&out), 2);
  CliResult transcript = h_->Cli({"agent", "transcript", run, "--json"});
  ASSERT_EQ(transcript.code, 0) << transcript.err;
  Json entries = Json::parse(transcript.out, nullptr, false);
  ASSERT_TRUE(entries.is_array());
  EXPECT_GE(entries.size(), 4u);
}

TEST_F(AgentControlE2E, APersonsExecInTheAgentsVmIsNotTheAgentsCommand) {
  PushProbeReply();
  model_->Push(Turn({Call("ask", {{"question", "go on?"}})}));
  int code = 0;
  Json asked = Agent({"--model", ModelName(), "wait"}, &code);
  ASSERT_EQ(code, 3);
  std::string run = asked["run"], vm = asked["vm"]["id"];
  ASSERT_EQ(h_->Cli({"exec", vm, "--", "touch", "/workspace/by-hand"}).code, 0);
  model_->Push(Turn({Call("run", {{"command", "ls /workspace"}})}));
  model_->Push(Turn({Call("finish", {{"summary", "done"}})}));
  Json done = Agent({"answer", run, "yes", "--model", ModelName()}, &code);
  EXPECT_EQ(code, 2);
  ASSERT_EQ(done["commands"].size(), 1u) << done.dump(2);
  EXPECT_EQ(done["commands"][0]["tool"], "run");
  ASSERT_EQ(done["other_commands"].size(), 1u) << done.dump(2);
  EXPECT_EQ(done["other_commands"][0]["argv"], Json::array({"touch", "/workspace/by-hand"}));
}

TEST_F(AgentControlE2E, TheAgentProcessHoldsNoKeyAndDyingEndsOnlyItsRun) {
  PushProbeReply();
  model_->Push(Turn({Call("run", {{"command", "sleep 300"}, {"timeout_s", 600}})}));
  Running cli =
      Start({"agent", "--image", "debian-12", "--model", ModelName(), "--json", "long work"});
  ASSERT_TRUE(cli.WaitFor("sleep 300")) << cli.err_seen;
  auto pids = AgentPids();
  ASSERT_EQ(pids.size(), 1u);
  pid_t agent = pids[0];
  auto environ = ReadFileToString("/proc/" + std::to_string(agent) + "/environ");
  ASSERT_TRUE(environ.ok());
  EXPECT_EQ(environ->find(kKey), std::string::npos);
  EXPECT_FALSE(InMemory(agent, kKey)) << "the key is in the agent process's memory";
  // The search works: the daemon, which sends the requests on, does hold the key.
  EXPECT_TRUE(InMemory(h_->daemon_pid(), kKey));
  // It is confined: no network of its own, an empty root, seccomp, no new privileges.
  auto status = ReadFileToString("/proc/" + std::to_string(agent) + "/status");
  ASSERT_TRUE(status.ok());
  EXPECT_NE(status->find("NoNewPrivs:\t1"), std::string::npos);
  EXPECT_NE(status->find("Seccomp:\t2"), std::string::npos);
  char root[256] = {0};
  ASSERT_GT(::readlink(("/proc/" + std::to_string(agent) + "/root").c_str(), root, 255), 0);
  EXPECT_NE(std::string(root), "/");

  // Killing it ends that run with an error naming it, while a VM beside it is untouched.
  CliResult other = h_->Cli({"create"});
  ASSERT_EQ(other.code, 0) << other.err;
  std::string other_vm = other.out.substr(0, other.out.find('\n'));
  ASSERT_EQ(::kill(agent, SIGKILL), 0);
  std::string out;
  EXPECT_EQ(cli.Finish(&out), 5);  // ERROR
  Json report = Json::parse(out, nullptr, false);
  EXPECT_EQ(report.value("outcome", ""), "ERROR") << out;
  EXPECT_EQ(report["error"].value("kind", ""), "agent_process") << out;
  EXPECT_EQ(FindCommand(report, "sleep 300")->value("outcome", ""), "cancelled");
  CliResult exec = h_->Cli({"exec", other_vm, "--", "echo", "alive"});
  EXPECT_EQ(exec.code, 0);
  EXPECT_EQ(exec.out, "alive\n");
  EXPECT_EQ(h_->Cli({"rm", other_vm}).code, 0);
}

TEST_F(AgentControlE2E, AWorkspaceThatTriesToForgeItsVerificationIsNotVerified) {
  // The forge, planted in the project: the verification re-run executes it. It
  // takes trybox-init's descriptors with pidfd_getfd and writes an END claiming exit 0 for
  // every exec stream, then the script exits 3 after 5 s.
  std::string repo = tmp_->path() + "/repo";
  Sh("git init -q -b main '" + repo + "'");
  std::string forge =
      "import ctypes, os, struct, json\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "pidfd = libc.syscall(434, 1, 0)\n"
      "got = 0\n"
      "for fd in range(256):\n"
      "    dup = libc.syscall(438, pidfd, fd, 0) if pidfd >= 0 else -1\n"
      "    if dup < 0: continue\n"
      "    got += 1\n"
      "    for sid in range(1, 400, 2):\n"
      "        body = json.dumps({'outcome': 'exited', 'exit_code': 0}).encode()\n"
      "        try: os.write(dup, struct.pack('<IIBBH', len(body), sid, 6, 0, 0) + body)\n"
      "        except OSError: pass\n"
      "print('forge: descriptors taken:', got)\n";
  ASSERT_TRUE(WriteFileAtomic(repo + "/forge.py", forge).ok());
  Sh("cd '" + repo + "' && git add -A && git -c user.name=t -c user.email=t@t commit -qm f");
  PushProbeReply();
  model_->Push(Turn({Call("finish", {{"summary", "all tests pass, trust me"},
                                     {"verify_command", "python3 forge.py; sleep 5; exit 3"}})}));
  int code = 0;
  Json r = Agent({"--model", ModelName(), "--workspace", repo, "forge"}, &code);
  EXPECT_EQ(code, 1) << r.dump(2);
  EXPECT_EQ(r["verdict"], "FAILED_VERIFICATION");
  EXPECT_EQ(r["verification"]["exit_code"], 3);
  EXPECT_EQ(r["verification"]["user"], "user");
  EXPECT_GE(r["verification"]["duration_ms"].get<int64_t>(), 5000);
  EXPECT_NE(r["verification"]["output_tail"].get<std::string>().find("descriptors taken: 0"),
            std::string::npos)
      << r["verification"].dump(2);
  EXPECT_EQ(r["claim"]["status"], "contradicted");
}

// Issue 41.7: a caller that leaves (here Ctrl-C) while the daemon probes a model that never
// answers. The probe's trybox-agent is killed and reaped and its request dropped, so a model
// server that answers one request at a time (Ollama's default) is free at once: the next run
// of the same model is probed and finishes instead of waiting behind the hung request (for
// its 300 s timeout, before the fix).
TEST_F(AgentControlE2E, ACallerLeavingDuringTheProbeEndsItAndTheNextRunDoesNotWaitBehindIt) {
  auto server = FakeModelServer::Start({.one_at_a_time = true});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  FakeModelServer& serial = **server;
  const std::vector<std::string> env = {"OPENAI_BASE_URL=" + serial.openai_base_url()};
  const std::vector<std::string> args = {"agent",     "--image", "debian-12", "--model",
                                         ModelName(), "--json",  "a task"};
  serial.Push({{"hang", true}});
  Running first = Start(args, env);
  ASSERT_TRUE(serial.WaitForRequests(1, std::chrono::seconds(120))) << "no probe arrived";
  EXPECT_EQ(AgentPids().size(), 1u) << "the probe runs in a trybox-agent of its own";
  ASSERT_EQ(first.child.Signal(SIGINT).code(), Code::kOk);
  std::string out;
  EXPECT_EQ(first.Finish(&out), 130);
  // The daemon dropped the request (the server saw its client leave) once the process that
  // asked for it was killed and reaped.
  ASSERT_TRUE(serial.WaitForHangsEnded(1, std::chrono::seconds(60)))
      << "the hung probe's request is still open";
  EXPECT_TRUE(AgentPids().empty());

  // The same model again: its probe is answered at once, and the run finishes.
  serial.Push({{"text", "ok"}});
  serial.Push(Turn({Call("finish", {{"summary", "nothing to do"}})}));
  Running second = Start(args, env);
  EXPECT_EQ(second.Finish(&out), 2) << second.err_seen << out;  // DONE, UNVERIFIED
  EXPECT_EQ(Json::parse(out, nullptr, false).value("outcome", ""), "DONE") << out;
  EXPECT_EQ(serial.requests().size(), 3u);
  EXPECT_EQ(serial.steps_left(), 0u);
}

}  // namespace
}  // namespace trybox::e2e
