// Host-side deadlines and the heartbeat (issue 19; docs/reliability.md): a guest that stops
// answering (its QEMU SIGSTOPped) ends its execs as guest_unresponsive, is shown as
// unresponsive, is noticed when it answers again, and can always be destroyed.
//
// Only QEMUs of this suite's own daemon are signalled: their pids come from its `ls`.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>

#include "tests/e2e/harness.h"
#include "util/fd.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

class UnresponsiveE2E : public SharedHarness<UnresponsiveE2E> {
 protected:
  static std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

  // The VM's entry in `list`, or null.
  static Json Vm(const std::string& id) {
    auto r = h_->Call({{"verb", "list"}});
    if (!r.ok()) return nullptr;
    for (const auto& v : (*r)["vms"]) {
      if (v["id"] == id) return v;
    }
    return nullptr;
  }

  // Waits for `done` to hold, checking it again each time the daemon is asked; false after
  // `limit` (generous: the machine may be loaded).
  static bool WaitFor(const std::function<bool()>& done,
                      std::chrono::seconds limit = std::chrono::seconds(120)) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return true;
  }

  // A VM of this daemon and its QEMU's pid.
  static std::pair<std::string, pid_t> Create() {
    CliResult c = h_->Cli({"create"});
    EXPECT_EQ(c.code, 0) << c.err;
    std::string id = FirstLine(c.out);
    Json v = Vm(id);
    EXPECT_TRUE(v.is_object()) << id;
    pid_t pid = v.is_object() ? v["pid"].get<pid_t>() : -1;
    // Ours: the QEMU's command line names this harness's home.
    auto ours = h_->QemuPids();
    EXPECT_NE(std::find(ours.begin(), ours.end(), pid), ours.end()) << pid;
    return {id, pid};
  }
};

TEST_F(UnresponsiveE2E, AStoppedGuestsExecEndsAsGuestUnresponsiveAndTheGuestIsNoticedAgain) {
  // Not a structured binding: clang 14 cannot capture one in the lambdas below.
  const auto [created_id, pid] = Create();
  const std::string id = created_id;
  ASSERT_GT(pid, 0);
  // The exec runs; then its guest stops answering. Its timeout lives in the guest, which
  // will never act on it: only the host's deadline (or heartbeat) can end it.
  auto exec = std::async(std::launch::async, [&, id = id] {
    return h_->Cli({"exec", "--timeout", "5", id, "--", "sleep", "60"});
  });
  ASSERT_TRUE(WaitFor([&] {
    Json v = Vm(id);
    return v.is_object() && v["running_execs"] == 1;
  }));
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  CliResult r = exec.get();
  EXPECT_EQ(r.code, 125) << r.err;
  EXPECT_NE(r.err.find("the guest stopped answering"), std::string::npos) << r.err;

  // Recorded with its own name and no exit code.
  auto ps = h_->Call({{"verb", "ps"}, {"vm", id}});
  ASSERT_TRUE(ps.ok()) << ps.status().ToString();
  ASSERT_EQ((*ps)["execs"].size(), 1u) << ps->dump();
  const Json& e = (*ps)["execs"][0];
  EXPECT_EQ(e["outcome"], "guest_unresponsive") << e.dump();
  EXPECT_FALSE(e.contains("exit_code")) << e.dump();

  // Shown as unresponsive, in ls and in doctor; an exec is refused, and nothing recorded.
  ASSERT_TRUE(WaitFor([&] { return Vm(id).value("state", "") == "unresponsive"; }));
  CliResult ls = h_->Cli({"ls"});
  EXPECT_NE(ls.out.find("unresponsive"), std::string::npos) << ls.out;
  CliResult doctor = h_->Cli({"doctor"});
  EXPECT_NE(doctor.out.find("VM " + id + ": unresponsive"), std::string::npos) << doctor.out;
  CliResult refused = h_->Cli({"exec", id, "--", "true"});
  EXPECT_EQ(refused.code, 125);
  EXPECT_NE(refused.err.find("is unresponsive"), std::string::npos) << refused.err;
  ps = h_->Call({{"verb", "ps"}, {"vm", id}});
  ASSERT_TRUE(ps.ok());
  EXPECT_EQ((*ps)["execs"].size(), 1u) << ps->dump();

  // It answers again: noticed, said, and it works.
  ASSERT_EQ(::kill(pid, SIGCONT), 0);
  ASSERT_TRUE(WaitFor([&] { return Vm(id).value("state", "") == "running"; }));
  auto log = ReadFileToString(h_->home() + "/tryboxd.log");
  ASSERT_TRUE(log.ok());
  EXPECT_NE(log->find("VM " + id + " answers again"), std::string::npos);
  CliResult ok = h_->Cli({"exec", id, "--", "echo", "back"});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(ok.out, "back\n");
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

TEST_F(UnresponsiveE2E, AStoppedVmIsDestroyedWithoutWaitingForItsGuest) {
  auto [id, pid] = Create();
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  CliResult rm = h_->Cli({"rm", id});
  EXPECT_EQ(rm.code, 0) << rm.err;
  EXPECT_TRUE(Vm(id).is_null());
  auto left = h_->QemuPids();
  EXPECT_EQ(std::find(left.begin(), left.end(), pid), left.end()) << "QEMU " << pid << " left";
}

}  // namespace
}  // namespace trybox::e2e

namespace trybox::e2e {
namespace {

// The VMs' directories on a small tmpfs of the test's own, unmounted at the end (after its
// VMs are gone, so nothing holds it).
class FullDiskE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a tmpfs";
    auto h = Harness::Start({"TRYBOX_SPARES=0"});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    h_ = std::move(*h);
    ASSERT_EQ(::mount("tmpfs", h_->vms_dir().c_str(), "tmpfs", 0, "size=48m,mode=0700"), 0)
        << std::strerror(errno);
    mounted_ = true;
  }
  void TearDown() override {
    if (h_) (void)h_->StopDaemon();  // destroys its VMs
    if (mounted_) ::umount2(h_->vms_dir().c_str(), MNT_DETACH);
  }
  // Fills the tmpfs to the last byte with a file of the test's own.
  void Fill() {
    UniqueFd fd(::open((h_->vms_dir() + "/filler").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600));
    ASSERT_TRUE(fd.valid());
    std::string block(1 << 16, 'x');
    while (::write(fd.get(), block.data(), block.size()) > 0) {
    }
    std::string byte(1, 'x');
    while (::write(fd.get(), byte.data(), 1) > 0) {
    }
  }
  std::unique_ptr<Harness> h_;
  bool mounted_ = false;
};

// A restore that fails for want of room is not the template's fault: the create fails as
// no_space, the template stays, and once there is room the next create restores from that
// same template (it is not rebuilt).
TEST_F(FullDiskE2E, ARestoreOnAFullDiskFailsAsNoSpaceAndKeepsItsTemplate) {
  auto first = h_->Call({{"verb", "create"}});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ((*first)["vm"]["start"]["mode"], "restored") << first->dump();
  ASSERT_TRUE(h_->Call({{"verb", "destroy"}, {"vm", (*first)["vm"]["id"]}}).ok());
  Fill();
  auto full = h_->Call({{"verb", "create"}});
  ASSERT_FALSE(full.ok()) << full->dump();
  EXPECT_EQ(full.status().code(), Code::kResourceExhausted) << full.status().ToString();
  EXPECT_NE(full.status().message().find("no_space"), std::string::npos)
      << full.status().ToString();
  EXPECT_NE(full.status().message().find("the template was kept"), std::string::npos)
      << full.status().ToString();
  ASSERT_EQ(::unlink((h_->vms_dir() + "/filler").c_str()), 0);
  auto again = h_->Call({{"verb", "create"}});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)["vm"]["start"]["mode"], "restored") << again->dump();
  EXPECT_EQ((*again)["vm"]["start"]["template"]["built"], false) << again->dump();
  CliResult e = h_->Cli({"exec", (*again)["vm"]["id"].get<std::string>(), "--", "true"});
  EXPECT_EQ(e.code, 0) << e.err;
}

TEST_F(FullDiskE2E, ACopyIntoAVmOnAFullHostDiskFailsAsNoSpaceAndWorksOnceThereIsRoom) {
  CliResult c = h_->Cli({"create"});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string id = c.out.substr(0, c.out.find('\n'));
  auto local = TempDir::Make("/tmp", "tbx-deadlines-cp-");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  const std::string file = local->path() + "/f";
  ASSERT_TRUE(WriteFileAtomic(file, std::string(2 << 20, 'a'), 0644).ok());

  Fill();
  // QEMU used to pause the VM on the host's ENOSPC: the copy hung, and the VM for good.
  CliResult cp = h_->Cli({"cp", file, id + ":/root/f"});
  EXPECT_NE(cp.code, 0);
  EXPECT_NE(cp.err.find("no space"), std::string::npos) << cp.err;
  CliResult ls = h_->Cli({"ls"});
  EXPECT_EQ(ls.out.find("paused"), std::string::npos) << ls.out;
  CliResult alive = h_->Cli({"exec", id, "--", "true"});
  EXPECT_EQ(alive.code, 0) << alive.err;

  ASSERT_EQ(::unlink((h_->vms_dir() + "/filler").c_str()), 0);
  cp = h_->Cli({"cp", file, id + ":/root/f2"});
  EXPECT_EQ(cp.code, 0) << cp.err;
  CliResult size = h_->Cli({"exec", id, "--", "stat", "-c", "%s", "/root/f2"});
  EXPECT_EQ(size.out, std::to_string(2 << 20) + "\n") << size.err;
}

}  // namespace
}  // namespace trybox::e2e
