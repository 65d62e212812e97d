#include "guest/spawn.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "util/fd.h"

namespace trybox::guest {
namespace {

TEST(MergeEnvTest, DefaultsWithRequestOnTop) {
  const std::vector<std::string> proxy = {
      "HTTPS_PROXY=http://127.0.0.1:3128", "HTTP_PROXY=http://127.0.0.1:3128",
      "NO_PROXY=localhost,127.0.0.1,::1",  "https_proxy=http://127.0.0.1:3128",
      "http_proxy=http://127.0.0.1:3128",  "no_proxy=localhost,127.0.0.1,::1"};
  auto with_proxy = [&](std::vector<std::string> v) {
    v.insert(v.end(), proxy.begin(), proxy.end());
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(MergeEnv({}),
            with_proxy({"HOME=/root", "LANG=C.UTF-8", "LOGNAME=root",
                        std::string("PATH=") + kDefaultPath, "TERM=dumb", "USER=root"}));
  std::vector<std::string> env = MergeEnv({{"TERM", "xterm"}, {"FOO", ""}, {"PATH", "/x"}});
  EXPECT_EQ(env, with_proxy({"FOO=", "HOME=/root", "LANG=C.UTF-8", "LOGNAME=root", "PATH=/x",
                             "TERM=xterm", "USER=root"}));
  EXPECT_EQ(EnvValue(env, "PATH", "?"), "/x");
  EXPECT_EQ(EnvValue(env, "FOO", "?"), "");
  EXPECT_EQ(EnvValue(env, "PAT", "?"), "?");
  // The account's own names, unless the request sets them.
  EXPECT_EQ(EnvValue(MergeEnv({}, "user", "/home/user"), "HOME", "?"), "/home/user");
  EXPECT_EQ(EnvValue(MergeEnv({}, "user", "/home/user"), "LOGNAME", "?"), "user");
  env = MergeEnv({{"HOME", "/w"}, {"USER", "u2"}}, "user", "/home/user");
  EXPECT_EQ(EnvValue(env, "HOME", "?"), "/w");
  EXPECT_EQ(EnvValue(env, "USER", "?"), "u2");
  EXPECT_EQ(EnvValue(env, "LOGNAME", "?"), "user");
}

TEST(ExecCandidatesTest, SlashMeansNoSearch) {
  EXPECT_EQ(ExecCandidates("./run", "/a:/b"), (std::vector<std::string>{"./run"}));
  EXPECT_EQ(ExecCandidates("/bin/sh", "/a"), (std::vector<std::string>{"/bin/sh"}));
}

TEST(ExecCandidatesTest, SearchesTheRequestPathInOrderAndEmptyMeansCwd) {
  EXPECT_EQ(ExecCandidates("ls", "/usr/bin::/bin"),
            (std::vector<std::string>{"/usr/bin/ls", "ls", "/bin/ls"}));
  EXPECT_EQ(ExecCandidates("ls", ""), (std::vector<std::string>{"ls"}));
}

TEST(ExecSearchTest, MissingEverywhereIsNotFound) {
  ExecSearch s;
  EXPECT_TRUE(s.Failed(ENOENT));
  EXPECT_TRUE(s.Failed(ENOTDIR));
  EXPECT_EQ(s.Result(), ENOENT);
  EXPECT_EQ(ClassifyExecErrno(s.Result()), SpawnError::kNotFound);
}

TEST(ExecSearchTest, FoundButNotExecutableWinsOverMissing) {
  ExecSearch s;
  EXPECT_TRUE(s.Failed(EACCES));
  EXPECT_TRUE(s.Failed(ENOENT));
  EXPECT_EQ(s.Result(), EACCES);
  EXPECT_EQ(ClassifyExecErrno(s.Result()), SpawnError::kNotExecutable);
}

TEST(ExecSearchTest, OtherErrorsStopTheSearch) {
  ExecSearch s;
  EXPECT_TRUE(s.Failed(EACCES));
  EXPECT_FALSE(s.Failed(ENOEXEC));
  EXPECT_EQ(s.Result(), ENOEXEC);
  EXPECT_EQ(ClassifyExecErrno(ENOEXEC), SpawnError::kNotExecutable);
  EXPECT_EQ(ClassifyExecErrno(E2BIG), SpawnError::kSpawnFailed);
}

TEST(SpawnErrorTest, NamesAreTheProtocolStrings) {
  EXPECT_STREQ(SpawnErrorName(SpawnError::kNotFound), "not_found");
  EXPECT_STREQ(SpawnErrorName(SpawnError::kNotExecutable), "not_executable");
  EXPECT_STREQ(SpawnErrorName(SpawnError::kBadCwd), "bad_cwd");
  EXPECT_STREQ(SpawnErrorName(SpawnError::kSpawnFailed), "spawn_failed");
}

// The reaper calls waitpid(-1), which would steal other tests' children, so the real spawns
// run in a re-executed copy of this binary (a threadsafe death test) with only this test.
void SpawnThroughReaperAndExit() {
  int failures = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "FAILED: %s\n", what.c_str());
      ++failures;
    }
  };
  BlockChildSignal();
  Reaper reaper;
  reaper.Start();

  auto dir = TempDir::Make(::testing::TempDir(), "spawn_test");
  expect(dir.ok(), "temp dir");
  const std::string d = dir->path();
  expect(WriteFileAtomic(d + "/seven", "#!/bin/sh\necho \"$0 $FOO\"\nexit 7\n", 0755).ok(), "w1");
  expect(WriteFileAtomic(d + "/plain", "data\n", 0644).ok(), "w2");
  expect(WriteFileAtomic(d + "/noshebang", "\x01\x02garbage\n", 0755).ok(), "w3");

  auto out = MakePipe();
  SpawnSpec spec;
  spec.argv = {"seven"};
  spec.env = MergeEnv({{"PATH", "/nonexistent:" + d}, {"FOO", "bar"}});
  spec.stdout_fd = out->write.get();
  SpawnOutcome ok = Spawn(reaper, spec);
  out->write.Reset();
  expect(ok.error == SpawnError::kNone, "spawn seven: " + ok.message);
  if (ok.child) {
    ExitInfo e = ExitInfoFromWaitStatus(ok.child->Wait());
    expect(e.exited && e.code == 7, "exit code 7");
    auto text = ReadFileToString("/proc/self/fd/" + std::to_string(out->read.get()));
    expect(text.ok() && *text == d + "/seven bar\n", "output: " + (text.ok() ? *text : ""));
  }

  spec.stdout_fd = -1;
  spec.argv = {"plain"};
  SpawnOutcome r = Spawn(reaper, spec);
  expect(r.error == SpawnError::kNotExecutable, "plain: " + r.message);
  spec.argv = {"noshebang"};
  r = Spawn(reaper, spec);
  expect(r.error == SpawnError::kNotExecutable, "noshebang: " + r.message);
  spec.argv = {"missing"};
  r = Spawn(reaper, spec);
  expect(r.error == SpawnError::kNotFound && r.message.find("missing") != std::string::npos,
         "missing: " + r.message);
  spec.argv = {"seven"};
  spec.cwd = d + "/nonexistent";
  r = Spawn(reaper, spec);
  expect(r.error == SpawnError::kBadCwd && r.message.find("nonexistent") != std::string::npos,
         "bad cwd: " + r.message);

  // A child that exits at once is still delivered; its orphaned grandchild is reaped.
  spec.cwd = "/";
  spec.argv = {"/bin/sh", "-c", "sleep 0.1 & exit 3"};
  for (int i = 0; i < 20; ++i) {
    SpawnOutcome quick = Spawn(reaper, spec);
    expect(quick.child && ExitInfoFromWaitStatus(quick.child->Wait()).code == 3, "quick exit");
  }
  spec.argv = {"/bin/sh", "-c", "kill -TERM $$"};
  SpawnOutcome sig = Spawn(reaper, spec);
  ExitInfo e = ExitInfoFromWaitStatus(sig.child->Wait());
  expect(!e.exited && e.signal == SIGTERM, "SIGTERM default restored in child");
  std::fflush(stderr);
  std::_Exit(failures == 0 ? 0 : 1);
}

TEST(SpawnTest, RealSpawnsThroughTheReaperReportOutcomes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Like PID 1, which ignores SIGTERM: the child must get default dispositions back.
  auto old = ::signal(SIGTERM, SIG_IGN);
  EXPECT_EXIT(SpawnThroughReaperAndExit(), ::testing::ExitedWithCode(0), "");
  ::signal(SIGTERM, old);
}

// A cgroup v2 directory for the test, or "" where there is none to write (not root, no
// cgroup2 mount).
std::string MakeTestCgroup() {
  for (const char* root : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
    std::string dir = std::string(root) + "/trybox-spawn-test-" + std::to_string(::getpid());
    if (::access((std::string(root) + "/cgroup.procs").c_str(), W_OK) != 0) continue;
    if (::mkdir(dir.c_str(), 0755) == 0) return dir;
  }
  return "";
}

// Born in a cgroup (clone3 CLONE_INTO_CGROUP, sharing our memory until execve): the child
// is in it from its first instruction, and its outcomes come back as through Fork.
void SpawnIntoCgroupAndExit(const std::string& cg) {
  int failures = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "FAILED: %s\n", what.c_str());
      ++failures;
    }
  };
  BlockChildSignal();
  Reaper reaper;
  reaper.Start();
  UniqueFd dir(::open(cg.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  expect(dir.valid(), "open the cgroup");
  auto out = MakePipe();
  SpawnSpec spec;
  spec.argv = {"/bin/sh", "-c", "cat /proc/self/cgroup; exit 5"};
  spec.env = MergeEnv({});
  spec.stdout_fd = out->write.get();
  spec.cgroup_dir_fd = dir.get();
  SpawnOutcome ok = Spawn(reaper, spec);
  out->write.Reset();
  expect(ok.error == SpawnError::kNone, "spawn: " + ok.message);
  if (ok.child) {
    ExitInfo e = ExitInfoFromWaitStatus(ok.child->Wait());
    expect(e.exited && e.code == 5, "exit code 5: " + e.Describe());
    auto text = ReadFileToString("/proc/self/fd/" + std::to_string(out->read.get()));
    const std::string name = cg.substr(cg.rfind('/'));
    expect(text.ok() && text->find("0::" + name + "\n") != std::string::npos,
           "in the cgroup: " + (text.ok() ? *text : ""));
  }
  spec.stdout_fd = -1;
  spec.argv = {"missing-command"};
  SpawnOutcome missing = Spawn(reaper, spec);
  expect(missing.error == SpawnError::kNotFound, "missing: " + missing.message);
  spec.argv = {"/bin/true"};
  spec.cwd = "/nonexistent";
  SpawnOutcome cwd = Spawn(reaper, spec);
  expect(cwd.error == SpawnError::kBadCwd, "bad cwd: " + cwd.message);
  std::fflush(stderr);
  std::_Exit(failures == 0 ? 0 : 1);
}

TEST(SpawnTest, ChildBornInItsCgroupReportsOutcomes) {
  const std::string cg = MakeTestCgroup();
  if (cg.empty()) GTEST_SKIP() << "no writable cgroup2 hierarchy here";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(SpawnIntoCgroupAndExit(cg), ::testing::ExitedWithCode(0), "");
  ::rmdir(cg.c_str());
}

}  // namespace
}  // namespace trybox::guest
