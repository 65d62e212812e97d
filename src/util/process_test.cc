#include "util/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "util/fd.h"

namespace trybox {
namespace {

TEST(SpawnTest, KeptFdBecomes3AndNothingElseLeaks) {
  auto made = TempDir::Make("/tmp", "spawn");
  ASSERT_TRUE(made.ok());
  const TempDir& dir = *made;
  ASSERT_TRUE(WriteFileAtomic(dir.path() + "/in", "from fd 3", 0600).ok());
  UniqueFd three(::open((dir.path() + "/in").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(three.valid());
  // A descriptor without CLOEXEC must still not reach the child.
  UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  UniqueFd stray(::fcntl(null_fd.get(), F_DUPFD, 100));  // no CLOEXEC
  ASSERT_EQ(stray.get(), 100);
  UniqueFd out(::open((dir.path() + "/out").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  SpawnOptions opts;
  opts.argv = {"/bin/sh", "-c",
               "cat <&3; for f in /proc/self/fd/*; do echo; echo ${f##*/}; done | sort -n | "
               "tr '\\n' ' '"};
  opts.stdout_fd = out.get();
  opts.keep_fds = {three.get()};
  auto child = ChildProcess::Spawn(opts);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  auto exit = child->Wait();
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->exited && exit->code == 0) << exit->Describe();
  auto text = ReadFileToString(dir.path() + "/out");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->rfind("from fd 3", 0), 0u) << *text;
  // 0, 1, 2, 3 and the one the shell's glob opened; no stray descriptor.
  EXPECT_NE(text->find(" 3 "), std::string::npos) << *text;
  EXPECT_EQ(text->find(" 100 "), std::string::npos) << *text;
}

// The child starts with every signal unblocked and at its default action, whatever the
// spawning thread blocked or ignored, and the spawning thread keeps its own (the child is
// made the vfork way, on this process's memory, with every signal blocked meanwhile). Ids
// and the nice value reach the child (as root: set by raw system calls in the child).
TEST(SpawnTest, TheChildStartsCleanAndTheParentKeepsItsSignals) {
  auto made = TempDir::Make("/tmp", "spawn");
  ASSERT_TRUE(made.ok());
  sigset_t usr1, before;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &usr1, &before), 0);
  struct sigaction ignore = {}, old_pipe = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGPIPE, &ignore, &old_pipe), 0);
  UniqueFd out(::open((made->path() + "/out").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  SpawnOptions opts;
  opts.argv = {"sh", "-c",
               "grep -E '^(SigBlk|SigIgn|Uid|Gid)' /proc/self/status; cut -d' ' -f19 "
               "/proc/self/stat"};
  opts.stdout_fd = out.get();
  opts.nice = 5;
  const bool root = ::geteuid() == 0;
  if (root) {
    opts.uid = 65534;
    opts.gid = 65534;
  }
  auto child = ChildProcess::Spawn(opts);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  auto exit = child->Wait();
  sigset_t after;
  ASSERT_EQ(::pthread_sigmask(SIG_SETMASK, &before, &after), 0);
  struct sigaction pipe_now = {};
  ASSERT_EQ(::sigaction(SIGPIPE, &old_pipe, &pipe_now), 0);
  EXPECT_EQ(sigismember(&after, SIGUSR1), 1) << "the spawning thread lost its blocked signal";
  EXPECT_EQ(sigismember(&after, SIGTERM), 0) << "the spawning thread kept the spawn's mask";
  EXPECT_EQ(pipe_now.sa_handler, SIG_IGN) << "the child's reset reached the parent";
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->exited && exit->code == 0) << exit->Describe();
  auto text = ReadFileToString(made->path() + "/out");
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("SigBlk:\t0000000000000000\n"), std::string::npos) << *text;
  EXPECT_NE(text->find("SigIgn:\t0000000000000000\n"), std::string::npos) << *text;
  EXPECT_NE(text->find("\n5\n"), std::string::npos) << *text;
  if (root) {
    EXPECT_NE(text->find("Uid:\t65534\t65534\t65534\t65534\n"), std::string::npos) << *text;
    EXPECT_NE(text->find("Gid:\t65534\t65534\t65534\t65534\n"), std::string::npos) << *text;
  }
}

// A failure in the child after the clone is named by its stage, and the spawning thread
// goes on (the child is reaped).
TEST(SpawnTest, AChildThatCannotStartIsNamedByItsStage) {
  SpawnOptions opts;
  opts.argv = {"/bin/true"};
  opts.cwd = "/nonexistent-trybox-dir";
  auto child = ChildProcess::Spawn(opts);
  ASSERT_FALSE(child.ok());
  EXPECT_NE(child.status().message().find("chdir /bin/true"), std::string::npos)
      << child.status().message();
  opts.cwd.clear();
  opts.argv = {"/nonexistent-trybox-program"};
  child = ChildProcess::Spawn(opts);
  ASSERT_FALSE(child.ok());
  EXPECT_NE(child.status().message().find("execve /nonexistent-trybox-program"), std::string::npos)
      << child.status().message();
}

// The nice value of every thread of `pid` (field 19 of /proc/PID/task/TID/stat).
std::vector<int> ThreadNices(pid_t pid) {
  std::vector<int> out;
  std::string task = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(task.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    auto stat = ReadFileToString(task + "/" + e->d_name + "/stat");
    if (!stat.ok()) continue;
    std::string rest = stat->substr(stat->rfind(')') + 2);  // after "pid (comm) "
    std::istringstream fields(rest);
    std::string f;
    for (int i = 3; i <= 19 && fields >> f; ++i) {
    }
    out.push_back(std::stoi(f));
  }
  ::closedir(d);
  return out;
}

TEST(SpawnTest, NiceIsSetBeforeExecAndCanBeTakenBackForEveryThread) {
  SpawnOptions opts;
  opts.argv = {"/bin/sleep", "30"};
  opts.nice = 7;
  auto child = ChildProcess::Spawn(opts);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(ThreadNices(child->pid()), std::vector<int>{7});
  if (!CanRestorePriority()) GTEST_SKIP() << "this process may not lower a nice value";
  ASSERT_TRUE(SetProcessNice(child->pid(), 0).ok());
  EXPECT_EQ(ThreadNices(child->pid()), std::vector<int>{0});
  (void)child->Signal(SIGKILL);
  (void)child->Wait();
  EXPECT_EQ(SetProcessNice(child->pid(), 0).code(), Code::kNotFound);
}

// The CPU a process used is read from the kernel's account: a child that spins for a
// while shows it (user time, as of its exit it is still a zombie whose stat is readable),
// one that sleeps does not, and a pid that is gone is an error, never 0.
TEST(ProcessCpuTest, CountsTheCpuAChildUsedAndNamesOneThatIsGone) {
  SpawnOptions spin;
  spin.argv = {"/bin/sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"};
  auto busy = ChildProcess::Spawn(spin);
  ASSERT_TRUE(busy.ok()) << busy.status().ToString();
  SpawnOptions rest;
  rest.argv = {"/bin/sleep", "0.5"};
  auto idle = ChildProcess::Spawn(rest);
  ASSERT_TRUE(idle.ok()) << idle.status().ToString();
  // waitid with WNOWAIT: both have ended but are not reaped, so /proc still has them.
  siginfo_t info;
  ASSERT_EQ(::waitid(P_PID, busy->pid(), &info, WEXITED | WNOWAIT), 0);
  ASSERT_EQ(::waitid(P_PID, idle->pid(), &info, WEXITED | WNOWAIT), 0);
  auto spun = ProcessCpuMs(busy->pid());
  auto slept = ProcessCpuMs(idle->pid());
  ASSERT_TRUE(spun.ok()) << spun.status().ToString();
  ASSERT_TRUE(slept.ok()) << slept.status().ToString();
  EXPECT_GE(*spun, 50.0);
  EXPECT_LT(*slept, *spun);
  const pid_t gone = busy->pid();
  (void)busy->Wait();
  (void)idle->Wait();
  EXPECT_FALSE(ProcessCpuMs(gone).ok());
}

TEST(FindProcessesTest, FindsByCommandLineAndOnlyThose) {
  const std::string marker = "trybox-find-test-" + std::to_string(::getpid());
  SpawnOptions opts;
  opts.argv = {"/bin/sh", "-c", "sleep 30; true", marker};  // no exec of the last command
  auto child = ChildProcess::Spawn(opts);
  ASSERT_TRUE(child.ok());
  // Spawn returns after fork: until the child's exec its command line is ours, and while
  // the shell forks for `sleep` that child briefly carries the marker too. Both settle.
  std::vector<pid_t> found;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (found.size() != 1 && std::chrono::steady_clock::now() < until) {
    found = FindProcesses(marker);
    if (found.size() != 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0], child->pid());
  EXPECT_TRUE(FindProcesses(marker + "-other").empty());
  ASSERT_TRUE(child->Signal(SIGKILL).ok());
  (void)child->Wait();
  // A fork of the shell caught before its exec of sleep may outlive it for a moment.
  until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!FindProcesses(marker).empty() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(FindProcesses(marker).empty());
}

// A bare program name is found in PATH, never in the working directory: a planted `sh`
// there does not run (before, execve tried the name relative to the directory first).
TEST(SpawnTest, ABareNameIsLookedUpInPathNotInTheWorkingDirectory) {
  auto dir = TempDir::Make("/tmp", "spawn-cwd-");
  ASSERT_TRUE(dir.ok());
  const std::string marker = dir->path() + "/planted-ran";
  ASSERT_TRUE(
      WriteFileAtomic(dir->path() + "/sh", "#!/bin/sh\ntouch '" + marker + "'\nexit 7\n", 0755)
          .ok());
  SpawnOptions o;
  o.argv = {"sh", "-c", "exit 3"};
  o.cwd = dir->path();
  auto c = ChildProcess::Spawn(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto e = c->Wait();
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->exited);
  EXPECT_EQ(e->code, 3);
  EXPECT_NE(::access(marker.c_str(), F_OK), 0) << "the planted ./sh ran";
}

// A process whose spawner is killed: with die_with_parent it goes too; without, it lives on.
pid_t GrandchildOfAKilledParent(bool die_with_parent) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  pid_t helper = ::fork();
  if (helper == 0) {
    ::close(fds[0]);
    SpawnOptions o;
    o.argv = {"/bin/sleep", "60"};
    o.die_with_parent = die_with_parent;
    auto c = ChildProcess::Spawn(o);
    pid_t p = c.ok() ? c->pid() : -1;
    (void)!::write(fds[1], &p, sizeof p);
    ::pause();
    ::_exit(0);
  }
  ::close(fds[1]);
  pid_t grandchild = -1;
  if (::read(fds[0], &grandchild, sizeof grandchild) != sizeof grandchild) grandchild = -1;
  ::close(fds[0]);
  ::kill(helper, SIGKILL);
  (void)::waitpid(helper, nullptr, 0);
  return grandchild;
}

// Alive and not a zombie (an orphan is reaped by whoever adopts it, maybe not at once).
bool Running(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return false;
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

TEST(SpawnTest, DieWithParentTakesTheChildWhenItsSpawnerIsKilled) {
  pid_t orphan = GrandchildOfAKilledParent(false);
  ASSERT_GT(orphan, 0);
  pid_t taken = GrandchildOfAKilledParent(true);
  ASSERT_GT(taken, 0);
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = !Running(taken);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone) << "pid " << taken << " outlived its spawner";
  EXPECT_TRUE(Running(orphan)) << "the control: without the option the child lives on";
  ::kill(orphan, SIGKILL);
  ::kill(taken, SIGKILL);
}

}  // namespace
// A child that a short-lived thread spawned with die_with_process outlives that thread, and
// goes when the process is killed: QEMUs started by a daemon's worker threads (issue 51.10).
TEST(SpawnTest, DieWithProcessOutlivesItsThreadAndGoesWithTheProcess) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t helper = ::fork();
  if (helper == 0) {
    ::close(fds[0]);
    pid_t p = -1;
    std::thread([&p] {
      SpawnOptions o;
      o.argv = {"/bin/sleep", "60"};
      o.die_with_process = true;
      auto c = ChildProcess::Spawn(o);
      p = c.ok() ? c->Release() : -1;
    }).join();
    // The thread that asked has ended: the child must still run.
    ::usleep(200 * 1000);
    int alive = p > 0 && ::kill(p, 0) == 0 ? 1 : 0;
    int msg[2] = {static_cast<int>(p), alive};
    (void)!::write(fds[1], msg, sizeof msg);
    ::pause();
    ::_exit(0);
  }
  ::close(fds[1]);
  int msg[2] = {-1, 0};
  ASSERT_EQ(::read(fds[0], msg, sizeof msg), static_cast<ssize_t>(sizeof msg));
  ::close(fds[0]);
  const pid_t child = msg[0];
  ASSERT_GT(child, 0);
  EXPECT_EQ(msg[1], 1) << "the child died with the thread that spawned it";
  EXPECT_TRUE(Running(child));
  ::kill(helper, SIGKILL);
  (void)::waitpid(helper, nullptr, 0);
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = !Running(child);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone) << "pid " << child << " outlived the killed process";
  ::kill(child, SIGKILL);
}

}  // namespace trybox
