// The harness itself (issue 51, item 8): a test process that dies leaves no daemon or QEMU
// behind, and a program that exits before reading its input does not kill the suite.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>

#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

// Alive and not a zombie (a dead daemon whose new parent does not reap it stays one).
bool Alive(pid_t pid) {
  auto stat = ReadFileToString("/proc/" + std::to_string(pid) + "/stat");
  if (!stat.ok()) return false;
  size_t close = stat->rfind(')');
  return close != std::string::npos && close + 2 < stat->size() && (*stat)[close + 2] != 'Z';
}

// Not a test of its own: the child process of ADaemonDiesWithItsKilledTestProcess. It starts
// a harness, makes a VM, prints "HOME DAEMON_PID", and waits to be killed.
TEST(HarnessE2E, DISABLED_HoldsADaemonWithAVmUntilKilled) {
  auto h = Harness::Start();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult r = (*h)->Cli({"create", "--memory", "256"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::printf("%s %d\n", (*h)->home().c_str(), static_cast<int>((*h)->daemon_pid()));
  std::fflush(stdout);
  for (;;) ::pause();
}

TEST(HarnessE2E, ADaemonDiesWithItsKilledTestProcess) {
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  UniqueFd out_r(out[0]), out_w(out[1]);
  SpawnOptions o;
  o.argv = {"/proc/self/exe", "--gtest_also_run_disabled_tests",
            "--gtest_filter=HarnessE2E.DISABLED_HoldsADaemonWithAVmUntilKilled"};
  o.stdout_fd = out_w.get();
  auto child = ChildProcess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  out_w.Reset();
  // gtest's own lines come first; ours is the one that starts with the home.
  std::string seen, home;
  pid_t daemon = 0;
  char buf[4096];
  while (home.empty()) {
    auto n = ReadSome(out_r.get(), buf, sizeof buf);
    ASSERT_TRUE(n.ok() && *n > 0) << "the child ended before its VM was made:\n" << seen;
    seen.append(buf, *n);
    std::istringstream lines(seen);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("/tmp/tbx-", 0) == 0 && line.find(' ') != std::string::npos) {
        home = line.substr(0, line.find(' '));
        daemon = static_cast<pid_t>(std::stol(line.substr(line.find(' ') + 1)));
      }
    }
  }
  ASSERT_TRUE(Alive(daemon));
  ASSERT_FALSE(QemuPidsOfHome(home).empty()) << "the child's VM has no QEMU";

  ASSERT_TRUE(child->Signal(SIGKILL).ok());  // no destructor, no atexit handler runs
  ASSERT_TRUE(child->Wait().ok());
  // The daemon got SIGTERM and destroys its VMs on the way out; a generous bound, not a
  // figure: it fails only if they never go.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while ((Alive(daemon) || !QemuPidsOfHome(home).empty()) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_FALSE(Alive(daemon)) << "the daemon of a killed test process is still running";
  EXPECT_TRUE(QemuPidsOfHome(home).empty()) << "QEMUs of a killed test's daemon still run";
  for (pid_t p : QemuPidsOfHome(home)) ::kill(p, SIGKILL);
  if (Alive(daemon)) ::kill(daemon, SIGKILL);
  (void)RemoveTree(home);
}

// A program that exits without reading its standard input: the harness's write then meets
// a closed pipe, which must be an error on that write, not a SIGPIPE that ends the suite.
TEST(HarnessE2E, AProgramThatIgnoresItsInputDoesNotKillTheSuite) {
  const std::string input(4 << 20, 'x');  // more than a pipe holds
  for (int i = 0; i < 5; ++i) {
    CliResult r = RunProgram({"/bin/true"}, {"PATH=/usr/bin:/bin"}, input);
    EXPECT_EQ(r.code, 0) << r.err;
  }
}

}  // namespace
}  // namespace trybox::e2e
