#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "vmm/qemu.h"

namespace trybox::vmm {
namespace {

int Count(const std::vector<std::string>& env, const std::string& prefix) {
  return static_cast<int>(std::count_if(
      env.begin(), env.end(), [&](const std::string& e) { return e.rfind(prefix, 0) == 0; }));
}

std::string Value(const std::vector<std::string>& env, const std::string& name) {
  for (const auto& e : env) {
    if (e.rfind(name + "=", 0) == 0) return e.substr(name.size() + 1);
  }
  return "<unset>";
}

TEST(QemuEnvironmentTest, KeepsTheDaemonsAndAsksMallocForHugePages) {
  auto env = QemuEnvironment({"PATH=/usr/bin", "HOME=/root"}, "/run/vms/abc");
  EXPECT_EQ(Value(env, "PATH"), "/usr/bin");
  EXPECT_EQ(Value(env, "HOME"), "/root");
  EXPECT_EQ(Value(env, "GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(Value(env, "TRYBOX_VM_DIR"), "/run/vms/abc");
  EXPECT_EQ(env.size(), 4u);
}

TEST(QemuEnvironmentTest, AddsToTheOperatorsTunablesOnce) {
  auto env = QemuEnvironment({"GLIBC_TUNABLES=glibc.malloc.arena_max=2"}, "/d");
  EXPECT_EQ(Value(env, "GLIBC_TUNABLES"), "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  EXPECT_EQ(Count(env, "GLIBC_TUNABLES="), 1);
}

TEST(QemuEnvironmentTest, TheOperatorsOwnHugePageChoiceStands) {
  for (const std::string t :
       {"glibc.malloc.hugetlb=0", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"}) {
    auto env = QemuEnvironment({"GLIBC_TUNABLES=" + t}, "/d");
    EXPECT_EQ(Value(env, "GLIBC_TUNABLES"), t);
  }
  // A tunable whose name only ends the same way is not that choice.
  auto env = QemuEnvironment({"GLIBC_TUNABLES=x.glibc.malloc.hugetlb=0"}, "/d");
  EXPECT_EQ(Value(env, "GLIBC_TUNABLES"), "x.glibc.malloc.hugetlb=0:glibc.malloc.hugetlb=1");
}

TEST(QemuEnvironmentTest, TheVmDirectoryIsOursNotInherited) {
  auto env = QemuEnvironment({"TRYBOX_VM_DIR=/elsewhere", "A=1"}, "/mine");
  EXPECT_EQ(Count(env, "TRYBOX_VM_DIR="), 1);
  EXPECT_EQ(Value(env, "TRYBOX_VM_DIR"), "/mine");
}

// Issue 51.1: under TCG the guest keeps the TSC as its clocksource (docs/timekeeping.md);
// under KVM the kernel picks kvm-clock itself and nothing is forced.
TEST(KernelCmdlineTest, TcgGuestsKeepTheTscAsTheirClocksource) {
  VmConfig c;
  c.id = "abc";
  c.accel = "tcg";
  c.mode = StartMode::kTemplate;
  const std::string tcg = KernelCmdline(c);
  EXPECT_NE((" " + tcg + " ").find(" tsc=reliable "), std::string::npos) << tcg;
  c.accel = "kvm";
  const std::string kvm = KernelCmdline(c);
  EXPECT_EQ(kvm.find("tsc="), std::string::npos) << kvm;
}

}  // namespace
}  // namespace trybox::vmm
