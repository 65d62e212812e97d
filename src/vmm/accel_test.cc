#include "vmm/accel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <random>

#include "util/fd.h"
#include "util/process.h"

namespace trybox::vmm {
namespace {

using Json = nlohmann::json;

class AccelCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = TempDir::Make(::testing::TempDir(), "accel_test");
    ASSERT_TRUE(d.ok());
    dir_.emplace(std::move(*d));
  }
  std::string Path(const std::string& name) const { return dir_->path() + "/" + name; }
  std::optional<TempDir> dir_;
};

const Json kKey = {{"host_kernel", "Linux 6.1"},
                   {"qemu_version", "QEMU emulator version 7.2.0"},
                   {"cpu_flags_sha256", "ab"},
                   {"kvm_device", "present"},
                   {"probe_kernel_sha256", "cd"}};

TEST_F(AccelCacheTest, TheAnswerIsReusedUnderTheSameKeyOnly) {
  ASSERT_TRUE(SaveAccel(Path("accel.json"), kKey, {"tcg", "KVM aborted the guest"}).ok());
  auto same = LoadCachedAccel(Path("accel.json"), kKey);
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(same->accel, "tcg");
  EXPECT_EQ(same->reason, "KVM aborted the guest");
  for (const char* field :
       {"host_kernel", "qemu_version", "cpu_flags_sha256", "kvm_device", "probe_kernel_sha256"}) {
    Json changed = kKey;
    changed[field] = "something else";
    EXPECT_FALSE(LoadCachedAccel(Path("accel.json"), changed).has_value()) << field;
  }
}

TEST_F(AccelCacheTest, AMissingMalformedOrKeylessFileIsNoAnswer) {
  EXPECT_FALSE(LoadCachedAccel(Path("none.json"), kKey).has_value());
  ASSERT_TRUE(WriteFileAtomic(Path("bad.json"), "{not json").ok());
  EXPECT_FALSE(LoadCachedAccel(Path("bad.json"), kKey).has_value());
  // What a daemon forced with --accel writes: no key, never reused as a probe's answer.
  ASSERT_TRUE(WriteFileAtomic(Path("forced.json"), R"({"accel":"kvm","reason":"forced"})").ok());
  EXPECT_FALSE(LoadCachedAccel(Path("forced.json"), kKey).has_value());
  Json odd = {{"accel", "xen"}, {"reason", ""}, {"key", kKey}};
  ASSERT_TRUE(WriteFileAtomic(Path("odd.json"), odd.dump()).ok());
  EXPECT_FALSE(LoadCachedAccel(Path("odd.json"), kKey).has_value());
}

TEST_F(AccelCacheTest, TheKeyNamesTheHostQemuCpuDeviceAndProbeKernel) {
  Json manifest = {{"files", {{"vmlinux", {{"sha256", std::string(64, 'e')}}}}}};
  ASSERT_TRUE(WriteFileAtomic(Path("manifest.json"), manifest.dump()).ok());
  auto key = AccelKey("qemu-system-x86_64", dir_->path());
  if (!key.ok() && key.status().code() == Code::kNotFound) GTEST_SKIP() << "no QEMU here";
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_NE((*key)["host_kernel"].get<std::string>().find("Linux"), std::string::npos);
  EXPECT_NE((*key)["qemu_version"].get<std::string>().find("QEMU"), std::string::npos);
  EXPECT_EQ((*key)["cpu_flags_sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ((*key)["probe_kernel_sha256"], std::string(64, 'e'));
  EXPECT_TRUE((*key)["kvm_device"] == "absent" || (*key)["kvm_device"] == "no access" ||
              (*key)["kvm_device"] == "present");
}

// A probe guest that never ends costs the probe's timeout, not more, and means TCG.
TEST_F(AccelCacheTest, AProbeThatHangsGivesUpAtItsTimeout) {
  int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "no usable /dev/kvm: the probe does not boot anything";
  ::close(fd);
  ASSERT_TRUE(WriteFileAtomic(Path("hang-qemu"), "#!/bin/sh\nexec sleep 60\n", 0755).ok());
  AccelChoice c =
      ProbeAccel(dir_->path(), dir_->path(), Path("hang-qemu"), std::chrono::milliseconds(300));
  EXPECT_EQ(c.accel, "tcg");
  EXPECT_NE(c.reason.find("timed out"), std::string::npos) << c.reason;
}

// Stands in for a probe QEMU: a process group leader whose command line names the token.
// A token no other process on the machine carries: ReapProbe finds a probe by its token, and
// another unit_tests running this test at the same moment (a CI run beside a developer's)
// made a fixed token find that process's probe instead (seen: the pid one above ours).
std::string UniqueToken() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", static_cast<unsigned>(::getpid()), rd());
  return buf;
}

Result<ChildProcess> FakeProbe(const std::string& token) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "sleep 600; true", "sh", "-name", "trybox-probe-" + token};
  return ChildProcess::Spawn(o);
}

TEST_F(AccelCacheTest, AProbeLeftByADeadDaemonIsKilledByItsRecordedPid) {
  const std::string token = UniqueToken();
  auto probe = FakeProbe(token);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  ASSERT_TRUE(
      WriteFileAtomic(Path(kProbePidFile), std::to_string(probe->pid()) + " " + token + "\n").ok());
  EXPECT_EQ(ReapProbe(dir_->path()), probe->pid());
  auto exit = probe->Wait();
  ASSERT_TRUE(exit.ok());
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_NE(::access(Path(kProbePidFile).c_str(), F_OK), 0);
}

TEST_F(AccelCacheTest, AProbeKilledBeforeItsPidWasRecordedIsFoundByItsToken) {
  const std::string token = UniqueToken();
  auto probe = FakeProbe(token);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  ASSERT_TRUE(WriteFileAtomic(Path(kProbePidFile), "0 " + token + "\n").ok());
  // The shell may not have exec'd yet: its command line names the token once it has.
  for (int i = 0; i < 500 && ProcessCmdline(probe->pid()).find(token) == std::string::npos; ++i) {
    ::usleep(10000);
  }
  EXPECT_EQ(ReapProbe(dir_->path()), probe->pid());
  auto exit = probe->Wait();
  ASSERT_TRUE(exit.ok());
  EXPECT_EQ(exit->signal, SIGKILL);
}

TEST_F(AccelCacheTest, ARecordedPidThatIsNoLongerTheProbeIsLeftAlone) {
  auto other = FakeProbe("11111111");
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(
      WriteFileAtomic(Path(kProbePidFile), std::to_string(other->pid()) + " 22222222\n").ok());
  EXPECT_EQ(ReapProbe(dir_->path()), 0);
  EXPECT_TRUE(ProcessExists(other->pid()));
  EXPECT_NE(::access(Path(kProbePidFile).c_str(), F_OK), 0);
  (void)other->Signal(SIGKILL);
  (void)other->Wait();
}

}  // namespace
}  // namespace trybox::vmm
