// End to end: real tryboxd, real CLI, real QEMU guests booted from the real image.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "store/store.h"
#include "tests/e2e/harness.h"
#include "util/paths.h"
#include "util/socket.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

class LifecycleE2E : public SharedHarness<LifecycleE2E> {
 protected:
  void SetUp() override { ASSERT_NE(h_, nullptr); }

  static std::string Create(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"create"};
    args.insert(args.end(), extra.begin(), extra.end());
    CliResult r = h_->Cli(args);
    EXPECT_EQ(r.code, 0) << r.err;
    std::string id = r.out.substr(0, r.out.find('\n'));
    return id;
  }
  static Json List() {
    CliResult r = h_->Cli({"ls", "--json"});
    EXPECT_EQ(r.code, 0) << r.err;
    return Json::parse(r.out, nullptr, false);
  }
  static Json FindVm(const std::string& id) {
    for (const auto& v : List()) {
      if (v["id"] == id) return v;
    }
    return nullptr;
  }
};

TEST_F(LifecycleE2E, RunUnameExitsZeroAndPrintsLinux) {
  CliResult r = h_->Cli({"run", "--", "uname", "-a"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Linux trybox-"), std::string::npos) << r.out;
}

TEST_F(LifecycleE2E, ExitCodesMapLikeDocker) {
  std::string id = Create();
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(h_->Cli({"exec", id, "--", "sh", "-c", "exit 3"}).code, 3);
  EXPECT_EQ(h_->Cli({"exec", id, "--", "true"}).code, 0);
  CliResult nf = h_->Cli({"exec", id, "--", "no-such-command-xyz"});
  EXPECT_EQ(nf.code, 127);
  EXPECT_NE(nf.err.find("no-such-command-xyz"), std::string::npos) << nf.err;
  CliResult nx = h_->Cli({"exec", id, "--", "/etc/hostname"});
  EXPECT_EQ(nx.code, 126) << nx.err;
  CliResult sig = h_->Cli({"exec", id, "--", "sh", "-c", "kill -9 $$"});
  EXPECT_EQ(sig.code, 137);
  EXPECT_NE(sig.err.find("signal 9"), std::string::npos) << sig.err;
  CliResult cwd = h_->Cli({"exec", id, "--workdir", "/nonexistent", "--", "true"});
  EXPECT_EQ(cwd.code, 126);
  EXPECT_NE(cwd.err.find("/nonexistent"), std::string::npos) << cwd.err;
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

TEST_F(LifecycleE2E, StdoutAndStderrStaySeparate) {
  CliResult r = h_->Cli({"run", "--", "sh", "-c", "echo to-out; echo to-err >&2; echo more-out"});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "to-out\nmore-out\n");
  EXPECT_EQ(r.err, "to-err\n");
}

// The guest relays a command's output from a SCHED_BATCH thread (guest/exec.cc): the command
// must not inherit that policy, and output written in many small pieces on both channels
// arrives whole and in order.
TEST_F(LifecycleE2E, SmallWritesArriveWholeAndTheCommandKeepsTheNormalPolicy) {
  CliResult r =
      h_->Cli({"run", "--", "sh", "-c",
               "chrt -p $$ | sed -n '1s/.*: //p'; seq 1 100000; seq 1 3000 >&2; echo end"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::string out = "SCHED_OTHER\n", err;
  for (int i = 1; i <= 100000; ++i) out += std::to_string(i) + "\n";
  out += "end\n";
  for (int i = 1; i <= 3000; ++i) err += std::to_string(i) + "\n";
  EXPECT_EQ(r.out.substr(0, 12), "SCHED_OTHER\n") << r.out.substr(0, 200);
  EXPECT_EQ(r.out.size(), out.size());
  EXPECT_TRUE(r.out == out) << "stdout differs from seq's output";
  EXPECT_TRUE(r.err == err) << "stderr differs: " << r.err.substr(0, 200);
}

TEST_F(LifecycleE2E, EnvWorkdirAndStdinReachTheCommand) {
  std::string id = Create();
  CliResult r = h_->Cli({"exec", id, "--env", "GREETING=hello world", "--workdir", "/tmp", "--",
                         "sh", "-c", "echo \"$GREETING\"; pwd; echo \"$PATH\""});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("hello world\n/tmp\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/usr/bin"), std::string::npos);
  CliResult in = h_->Cli({"exec", "-i", id, "--", "sh", "-c", "tr a-z A-Z"}, "piped input\n");
  EXPECT_EQ(in.code, 0) << in.err;
  EXPECT_EQ(in.out, "PIPED INPUT\n");
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

TEST_F(LifecycleE2E, TimeoutKillsTheWholeProcessTree) {
  std::string id = Create();
  // A background child and a grandchild that left the process group: all must die.
  CliResult r = h_->Cli({"exec", id, "--timeout", "2", "--", "sh", "-c",
                         "sleep 300 & setsid sleep 301 & echo started; wait"});
  EXPECT_EQ(r.code, 124) << r.err;
  EXPECT_EQ(r.out, "started\n");
  EXPECT_NE(r.err.find("timed out"), std::string::npos) << r.err;
  CliResult ps =
      h_->Cli({"exec", id, "--", "sh", "-c", "ps -eo args | grep -c '^sleep 30[01]' || true"});
  EXPECT_EQ(ps.out, "0\n") << "sleep survived the timeout";
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

TEST_F(LifecycleE2E, CreateListExecRemove) {
  std::string id = Create({"--memory", "384", "--cpus", "2"});
  Json vm = FindVm(id);
  ASSERT_TRUE(vm.is_object());
  EXPECT_EQ(vm["state"], "running");
  EXPECT_EQ(vm["memory_mib"], 384);
  EXPECT_EQ(vm["cpus"], 2);
  CliResult n = h_->Cli({"exec", id, "--", "nproc"});
  EXPECT_EQ(n.out, "2\n");
  CliResult table = h_->Cli({"ls"});
  EXPECT_NE(table.out.find(id), std::string::npos);
  CliResult rm = h_->Cli({"rm", id});
  EXPECT_EQ(rm.code, 0) << rm.err;
  EXPECT_EQ(rm.out, id + "\n");
  EXPECT_TRUE(FindVm(id).is_null());
  struct stat st;
  EXPECT_NE(::stat((h_->vms_dir() + "/" + id).c_str(), &st), 0) << "VM dir left behind";
  // A second rm is a clear error, not a silent success.
  CliResult again = h_->Cli({"rm", id});
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.err.find("already destroyed"), std::string::npos) << again.err;
  CliResult ex = h_->Cli({"exec", id, "--", "true"});
  EXPECT_EQ(ex.code, 125);
  EXPECT_NE(ex.err.find("already destroyed"), std::string::npos) << ex.err;
}

TEST_F(LifecycleE2E, UnknownAndInvalidNamesAreClearErrors) {
  // A failed request starts no QEMU of its own. Spare clones come and go in the background:
  // wait until the pool is idle (a failed request is no demand, so it stays idle).
  ASSERT_TRUE(h_->WaitForSparePoolIdle().ok());
  auto before = h_->QemuPids();
  CliResult img = h_->Cli({"run", "--image", "no-such-image", "--", "true"});
  EXPECT_EQ(img.code, 125);
  EXPECT_NE(img.err.find("image 'no-such-image' is not built"), std::string::npos) << img.err;
  CliResult bad = h_->Cli({"run", "--image", "../../etc", "--", "true"});
  EXPECT_EQ(bad.code, 125);
  EXPECT_NE(bad.err.find("may contain only"), std::string::npos) << bad.err;
  CliResult vm = h_->Cli({"exec", "deadbeef0000", "--", "true"});
  EXPECT_EQ(vm.code, 125);
  EXPECT_NE(vm.err.find("no VM with id 'deadbeef0000'"), std::string::npos) << vm.err;
  CliResult rm = h_->Cli({"rm", "nope-nope"});
  EXPECT_EQ(rm.code, 1);
  EXPECT_NE(rm.err.find("no VM with id"), std::string::npos);
  for (pid_t p : h_->QemuPids()) {
    EXPECT_NE(std::find(before.begin(), before.end(), p), before.end()) << "new QEMU " << p;
  }
}

std::string RandomFile(const std::string& path, size_t size) {
  std::mt19937_64 rng(size);
  std::string data(size, '\0');
  for (size_t i = 0; i + 8 <= size; i += 8) {
    uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  EXPECT_TRUE(WriteFileAtomic(path, data, 0640).ok());
  return data;
}

TEST_F(LifecycleE2E, CopyRoundTripsBinaryFilesAndTrees) {
  auto dir = TempDir::Make("/tmp", "tbx-cp-");
  ASSERT_TRUE(dir.ok());
  std::string big = dir->path() + "/big.bin";
  RandomFile(big, 64u << 20);
  struct timespec ts[2] = {{1600000000, 123456789}, {1600000000, 123456789}};
  ASSERT_EQ(::utimensat(AT_FDCWD, big.c_str(), ts, 0), 0);
  std::string id = Create();
  CliResult put = h_->Cli({"cp", big, id + ":/root/big.bin"});
  ASSERT_EQ(put.code, 0) << put.err;
  CliResult sum = h_->Cli({"exec", id, "--", "sha256sum", "/root/big.bin"});
  EXPECT_EQ(sum.out.substr(0, 64), Sha256OfFile(big));
  CliResult mode = h_->Cli({"exec", id, "--", "stat", "-c", "%a %Y", "/root/big.bin"});
  EXPECT_EQ(mode.out, "640 1600000000\n");
  std::string back = dir->path() + "/back.bin";
  CliResult get = h_->Cli({"cp", id + ":/root/big.bin", back});
  ASSERT_EQ(get.code, 0) << get.err;
  EXPECT_EQ(Sha256OfFile(back), Sha256OfFile(big));
  struct stat st;
  ASSERT_EQ(::stat(back.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_mtim.tv_sec, 1600000000);

  // A tree: nested dirs, an executable, an empty file, a symlink.
  std::string tree = dir->path() + "/tree";
  ASSERT_TRUE(MakeDirs(tree + "/a/b/c").ok());
  ASSERT_TRUE(WriteFileAtomic(tree + "/a/b/c/deep.txt", "deep\n").ok());
  ASSERT_TRUE(WriteFileAtomic(tree + "/run.sh", "#!/bin/sh\necho ran\n", 0755).ok());
  ASSERT_TRUE(WriteFileAtomic(tree + "/empty", "").ok());
  ASSERT_EQ(::symlink("a/b/c/deep.txt", (tree + "/link").c_str()), 0);
  ASSERT_EQ(h_->Cli({"cp", tree, id + ":/srv/tree"}).code, 0);
  CliResult ran = h_->Cli({"exec", id, "--workdir", "/srv/tree", "--", "sh", "-c",
                           "./run.sh && cat link && stat -c %s empty"});
  EXPECT_EQ(ran.out, "ran\ndeep\n0\n") << ran.err;
  std::string tree_back = dir->path() + "/tree-back";
  CliResult tb = h_->Cli({"cp", id + ":/srv/tree", tree_back});
  ASSERT_EQ(tb.code, 0) << tb.err;
  EXPECT_EQ(ReadFileToString(tree_back + "/a/b/c/deep.txt").value_or(""), "deep\n");
  ASSERT_EQ(::stat((tree_back + "/run.sh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  char target[256] = {};
  ASSERT_GT(::readlink((tree_back + "/link").c_str(), target, sizeof target - 1), 0);
  EXPECT_STREQ(target, "a/b/c/deep.txt");
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

TEST_F(LifecycleE2E, CopyOfMissingPathIsAnErrorNotAnEmptyFile) {
  auto dir = TempDir::Make("/tmp", "tbx-cp-");
  ASSERT_TRUE(dir.ok());
  std::string id = Create();
  std::string dst = dir->path() + "/out";
  CliResult r = h_->Cli({"cp", id + ":/no/such/file", dst});
  EXPECT_EQ(r.code, 125);
  EXPECT_NE(r.err.find("/no/such/file"), std::string::npos) << r.err;
  struct stat st;
  EXPECT_NE(::stat(dst.c_str(), &st), 0) << "a missing guest path created a local file";
  CliResult up = h_->Cli({"cp", dir->path() + "/missing-local", id + ":/root/x"});
  EXPECT_EQ(up.code, 125);
  EXPECT_NE(up.err.find("missing-local"), std::string::npos) << up.err;
  CliResult noparent = h_->Cli({"exec", id, "--", "test", "-e", "/root/x"});
  EXPECT_EQ(noparent.code, 1);
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

TEST_F(LifecycleE2E, FullDiskIsItsOwnErrorAndLeavesNoPartialFile) {
  auto dir = TempDir::Make("/tmp", "tbx-full-");
  ASSERT_TRUE(dir.ok());
  std::string blob = dir->path() + "/blob";
  RandomFile(blob, 4u << 20);
  std::string id = Create();
  // Reserve every free block of the VM's writable layer without writing them.
  CliResult fill = h_->Cli({"exec", id, "--", "sh", "-c",
                            "fallocate -l $(( $(stat -f -c '%f*%S' /root) )) /root/fill; "
                            "df --output=avail -B1 /root | tail -1"});
  ASSERT_EQ(fill.code, 0) << fill.err;
  ASSERT_LT(std::stoll(fill.out), 1 << 20) << "the layer still has room: " << fill.out;
  CliResult put = h_->Cli({"cp", blob, id + ":/root/blob"});
  EXPECT_EQ(put.code, 125);
  EXPECT_NE(put.err.find("no space left on device"), std::string::npos) << "[" << put.err << "]";
  CliResult ls = h_->Cli({"exec", id, "--", "sh", "-c", "ls -a /root | grep -c blob || true"});
  EXPECT_EQ(ls.out, "0\n") << "a partial file was left behind";
  // The VM still works, and freeing space makes the same put succeed.
  EXPECT_EQ(h_->Cli({"exec", id, "--", "rm", "/root/fill"}).code, 0);
  CliResult again = h_->Cli({"cp", blob, id + ":/root/blob"});
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

TEST_F(LifecycleE2E, LongExecDoesNotBlockOtherRequests) {
  std::string id = Create();
  std::atomic<bool> long_done{false};
  std::thread longer([&] {
    CliResult r = h_->Cli({"exec", id, "--", "sh", "-c", "sleep 20; echo slept"});
    EXPECT_EQ(r.out, "slept\n");
    long_done = true;
  });
  // Wait until the long command is really running in the guest.
  for (int i = 0; i < 200; ++i) {
    CliResult ps = h_->Cli({"exec", id, "--", "pgrep", "-f", "sleep 20"});
    if (ps.code == 0) break;
  }
  CliResult quick = h_->Cli({"exec", id, "--", "echo", "quick"});
  EXPECT_EQ(quick.out, "quick\n");
  auto dir = TempDir::Make("/tmp", "tbx-cc-");
  ASSERT_TRUE(dir.ok());
  CliResult get = h_->Cli({"cp", id + ":/etc/hostname", dir->path() + "/h"});
  EXPECT_EQ(get.code, 0) << get.err;
  EXPECT_FALSE(long_done) << "the quick requests waited for the long exec";
  longer.join();
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

TEST_F(LifecycleE2E, GuestDeathMidExecIsReportedAsLostNotAsAnExitCode) {
  std::string id = Create();
  Json vm = FindVm(id);
  ASSERT_TRUE(vm.is_object());
  pid_t qemu = vm["pid"].get<pid_t>();
  CliResult r;
  std::thread t([&] { r = h_->Cli({"exec", id, "--", "sh", "-c", "echo before; sleep 60"}); });
  for (int i = 0; i < 200; ++i) {
    if (h_->Cli({"exec", id, "--", "pgrep", "-f", "sleep 60"}).code == 0) break;
  }
  ASSERT_EQ(::kill(qemu, SIGKILL), 0);
  t.join();
  EXPECT_EQ(r.code, 125);
  EXPECT_EQ(r.out, "before\n");
  EXPECT_NE(r.err.find("lost the guest"), std::string::npos) << r.err;
  Json after = FindVm(id);
  ASSERT_TRUE(after.is_object());
  EXPECT_EQ(after["state"], "dead");
  EXPECT_NE(after["note"].get<std::string>().find("QEMU exited"), std::string::npos);
  CliResult ex = h_->Cli({"exec", id, "--", "true"});
  EXPECT_EQ(ex.code, 125);
  EXPECT_NE(ex.err.find("gone"), std::string::npos) << ex.err;
  CliResult rm = h_->Cli({"rm", id});
  EXPECT_EQ(rm.code, 0) << rm.err;
  struct stat st;
  EXPECT_NE(::stat((h_->vms_dir() + "/" + id).c_str(), &st), 0);
}

TEST_F(LifecycleE2E, DaemonSurvivesGarbageOnItsSocket) {
  {
    auto fd = ConnectUnix(h_->socket());
    ASSERT_TRUE(fd.ok());
    // A header announcing 4 GiB, then a hang-up.
    std::string junk = std::string("\xff\xff\xff\xff\x01\x00\x00\x00\x01\x00\x00\x00", 12);
    ASSERT_TRUE(WriteFull(fd->get(), junk).ok());
  }
  {
    auto fd = ConnectUnix(h_->socket());
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(WriteFull(fd->get(), std::string("\x05\x00\x00", 3)).ok());  // half a header
  }
  CliResult r = h_->Cli({"ls", "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(LifecycleE2E, TamperedImageRefusesToBootAndNamesTheFile) {
  // A private copy of the image with one byte of the kernel changed.
  auto dir = TempDir::Make("/tmp", "tbx-img-");
  ASSERT_TRUE(dir.ok());
  std::string images = Paths::FromEnvironment().images;
  const char* env_images = std::getenv("TRYBOX_IMAGES");
  if (env_images && *env_images) images = env_images;
  std::string src = images + "/debian-12";
  std::string dst = dir->path() + "/debian-12";
  ASSERT_EQ(RunCommand({"cp", "-a", src, dst}).value().exit.code, 0);
  ::chmod(dst.c_str(), 0755);
  ::chmod((dst + "/vmlinux").c_str(), 0644);
  {
    auto fd = OpenFile(dst + "/vmlinux", O_WRONLY);
    ASSERT_TRUE(fd.ok());
    ASSERT_EQ(::pwrite(fd->get(), "X", 1, 4096), 1);
  }
  ::setenv("TRYBOX_IMAGES", dir->path().c_str(), 1);
  auto h = Harness::Start();
  if (env_images) {
    ::setenv("TRYBOX_IMAGES", env_images, 1);
  } else {
    ::unsetenv("TRYBOX_IMAGES");
  }
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult r = (*h)->Cli({"run", "--", "true"});
  EXPECT_EQ(r.code, 125);
  EXPECT_NE(r.err.find("vmlinux"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("does not match"), std::string::npos) << r.err;
  EXPECT_TRUE((*h)->QemuPids().empty());
}

TEST_F(LifecycleE2E, GuestThatNeverAnswersIsDestroyedNotRegistered) {
  // Half a second is far less than a TCG boot: QEMU runs, the agent cannot answer in time.
  auto h = Harness::Start({"TRYBOX_BOOT_TIMEOUT=0.5"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult r = (*h)->Cli({"create"});
  EXPECT_EQ(r.code, 125);
  EXPECT_NE(r.err.find("did not answer within"), std::string::npos) << r.err;
  EXPECT_EQ((*h)->Cli({"ls", "--json"}).out, "[]\n");
  EXPECT_TRUE((*h)->QemuPids().empty());
  auto left = RunCommand({"find", (*h)->vms_dir(), "-mindepth", "1"});
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->output, "");
}

// A killed daemon takes its QEMUs with it (issue 51.10: they used to run until a daemon
// started again for that home), and the next daemon still settles their records.
TEST_F(LifecycleE2E, AKilledDaemonTakesItsQemusAndTheNextOneReapsTheirRecords) {
  auto h = Harness::Start();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult c = (*h)->Cli({"create"});
  ASSERT_EQ(c.code, 0) << c.err;
  std::string id = c.out.substr(0, c.out.find('\n'));
  // The VM and, once restored in the background, a spare clone: both must be reaped.
  for (int i = 0; i < 600 && (*h)->QemuPids().size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ((*h)->QemuPids().size(), 2u);
  (*h)->CrashDaemon();
  // No daemon runs for this home now: nothing else would ever end these QEMUs.
  for (int i = 0; i < 300 && !(*h)->QemuPids().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE((*h)->QemuPids().empty()) << "QEMUs outlived their killed daemon";
  ASSERT_TRUE((*h)->RestartDaemon().ok());
  auto left = (*h)->QemuPids();
  std::string which;
  for (pid_t p : left) which += ProcessCmdline(p) + "\n";
  EXPECT_TRUE(left.empty()) << "the new daemon did not reap: " << which
                            << ReadFileToString((*h)->home() + "/tryboxd.log").value_or("");
  struct stat st;
  EXPECT_NE(::stat(((*h)->vms_dir() + "/" + id).c_str(), &st), 0);
  CliResult rm = (*h)->Cli({"rm", id});
  EXPECT_EQ(rm.code, 1);
  EXPECT_NE(rm.err.find("already reaped"), std::string::npos) << rm.err;
}

TEST_F(LifecycleE2E, KilledRunLeavesNoVmBehind) {
  SpawnOptions o;
  o.argv = {BinDir() + "/trybox", "run", "--", "sleep", "300"};
  o.env = h_->Env();
  auto run = ChildProcess::Spawn(o);
  ASSERT_TRUE(run.ok());
  bool up = false;
  std::string id;
  for (int i = 0; i < 600 && !up; ++i) {
    for (const auto& v : List()) {
      id = v["id"].get<std::string>();
      if (h_->Cli({"exec", id, "--", "pgrep", "-x", "sleep"}).code == 0) up = true;
    }
    if (!up) ::usleep(100000);
  }
  ASSERT_TRUE(up) << "the run never started its command";
  (void)run->Signal(SIGKILL);  // no chance to clean up: the daemon must
  (void)run->Wait();
  bool gone = false;
  for (int i = 0; i < 300 && !gone; ++i) {
    gone = List().empty();
    if (!gone) ::usleep(100000);
  }
  EXPECT_TRUE(gone) << List().dump();
  // Its QEMU is gone (a spare clone restored meanwhile may run; it is not this VM).
  auto left = RunCommand({"pgrep", "-f", "trybox-vm-" + id});
  ASSERT_TRUE(left.ok());
  EXPECT_NE(left->exit.code, 0) << left->output;
}

// A client killed mid-exec cancels the command: its process tree in the guest is killed and
// the exec is recorded as cancelled, with stdin forwarded or not.
TEST_F(LifecycleE2E, KilledExecClientCancelsTheCommandAndRecordsIt) {
  std::string id = Create();
  ASSERT_FALSE(id.empty());
  for (bool interactive : {false, true}) {
    std::string marker = interactive ? "4242" : "4343";
    SpawnOptions o;
    o.argv = {BinDir() + "/trybox", "exec", id, "--", "sleep", marker};
    if (interactive) o.argv.insert(o.argv.begin() + 2, "-i");
    o.env = h_->Env();
    int in[2];
    ASSERT_EQ(::pipe2(in, O_CLOEXEC), 0);
    UniqueFd in_r(in[0]), in_w(in[1]);  // stdin left open: the command never sees EOF
    o.stdin_fd = in_r.get();
    auto exec = ChildProcess::Spawn(o);
    ASSERT_TRUE(exec.ok());
    bool up = false;
    for (int i = 0; i < 600 && !up; ++i) {
      up = h_->Cli({"exec", id, "--", "pgrep", "-f", "sleep " + marker}).code == 0;
      if (!up) ::usleep(100000);
    }
    ASSERT_TRUE(up) << "the command never started";
    (void)exec->Signal(SIGKILL);
    (void)exec->Wait();
    bool gone = false;
    for (int i = 0; i < 300 && !gone; ++i) {
      gone = h_->Cli({"exec", id, "--", "pgrep", "-f", "sleep " + marker}).code == 1;
      if (!gone) ::usleep(100000);
    }
    EXPECT_TRUE(gone) << "the command outlived its client (interactive=" << interactive << ")";
    auto store = store::Store::Open(h_->home() + "/state/trybox.db");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto execs = (*store)->ListExecs(id);
    ASSERT_TRUE(execs.ok());
    const store::ExecRecord* rec = nullptr;
    for (const auto& e : *execs) {
      if (e.argv == Json::array({"sleep", marker})) rec = &e;
    }
    ASSERT_NE(rec, nullptr);
    EXPECT_EQ(rec->outcome, "cancelled") << "interactive=" << interactive << ": " << rec->error;
    EXPECT_FALSE(rec->exit_code.has_value());
  }
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

// `exec -i` whose input stays open ends when the command ends: the daemon does not wait for
// the client's EOF before it answers.
TEST_F(LifecycleE2E, InteractiveExecEndsWithItsCommandWhileInputStaysOpen) {
  std::string id = Create();
  ASSERT_FALSE(id.empty());
  SpawnOptions o;
  o.argv = {BinDir() + "/trybox", "exec", "-i", id, "--", "sh", "-c", "exit 3"};
  o.env = h_->Env();
  int in[2];
  ASSERT_EQ(::pipe2(in, O_CLOEXEC), 0);
  UniqueFd in_r(in[0]), in_w(in[1]);
  o.stdin_fd = in_r.get();
  auto exec = ChildProcess::Spawn(o);
  ASSERT_TRUE(exec.ok());
  auto done = exec->WaitFor(std::chrono::seconds(120));
  ASSERT_TRUE(done.ok()) << "trybox exec -i did not end with its command: "
                         << done.status().ToString();
  EXPECT_EQ(done->code, 3);
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

TEST_F(LifecycleE2E, DoctorExplainsTheAccelerationChoice) {
  CliResult r = h_->Cli({"doctor"});
  EXPECT_EQ(r.code, 0) << r.err;
  bool named = r.out.find("acceleration: tcg") != std::string::npos ||
               r.out.find("acceleration: kvm") != std::string::npos;
  EXPECT_TRUE(named) << r.out;
  EXPECT_NE(r.out.find("why: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("debian-12: ok"), std::string::npos) << r.out;
}

TEST_F(LifecycleE2E, InterruptedImageBuildLeavesNothingListed) {
  auto images = TempDir::Make("/tmp", "tbx-ib-");
  ASSERT_TRUE(images.ok());
  std::vector<std::string> env = h_->Env();
  for (auto& kv : env) {
    if (kv.rfind("TRYBOX_IMAGES=", 0) == 0) kv = "TRYBOX_IMAGES=" + images->path();
  }
  SpawnOptions o;
  o.argv = {BinDir() + "/trybox", "image", "build"};
  o.env = env;
  auto build = ChildProcess::Spawn(o);
  ASSERT_TRUE(build.ok());
  // Wait until the build has made its in-progress directory, then interrupt it.
  bool started = false;
  for (int i = 0; i < 3000 && !started; ++i) {
    auto l = RunCommand({"sh", "-c", "ls -a " + images->path() + " | grep -c '^.build-' || true"});
    started = l.ok() && l->output == "1\n";
    if (!started) ::usleep(10000);
  }
  ASSERT_TRUE(started) << "the build never started";
  ::kill(build->pid(), SIGINT);
  auto done = build->Wait();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->code, 130) << done->Describe();
  auto left = RunCommand({"sh", "-c", "ls -A " + images->path() + " | grep -v '^.lock$' || true"});
  EXPECT_EQ(left->output, "") << "an interrupted build left files behind";
  auto ls = RunCommand(
      {"sh", "-c", "TRYBOX_IMAGES=" + images->path() + " " + BinDir() + "/trybox image ls --json"});
  ASSERT_TRUE(ls.ok());
  EXPECT_EQ(ls->output, "[]\n");
}

// Runs last (gtest runs tests in definition order within a file).
TEST_F(LifecycleE2E, ZzNothingIsLeftBehind) {
  Json vms = List();
  for (const auto& v : vms) h_->Cli({"rm", v["id"].get<std::string>()});
  ASSERT_TRUE(h_->StopDaemon().ok());
  EXPECT_TRUE(h_->QemuPids().empty());
  struct stat st;
  EXPECT_NE(::stat(h_->socket().c_str(), &st), 0) << "daemon socket left behind";
  auto left = RunCommand({"find", h_->vms_dir(), "-mindepth", "1"});
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->output, "") << "VM directories left behind";
  auto all = RunCommand({"pgrep", "-f", "trybox-vm-.*" + h_->home()});
  EXPECT_NE(all->exit.code, 0) << all->output;
  ASSERT_TRUE(h_->RestartDaemon().ok());
}

}  // namespace
}  // namespace trybox::e2e
