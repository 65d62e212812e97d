#include "daemon/admission.h"

#include <gtest/gtest.h>

#include "util/fd.h"

namespace trybox::daemon {
namespace {

constexpr const char* kMeminfo =
    "MemTotal:       24683520 kB\n"
    "MemFree:        18642944 kB\n"
    "MemAvailable:    2097152 kB\n"
    "Buffers:          123456 kB\n";

TEST(AdmissionTest, MemAvailableIsReadInMib) {
  auto mib = ParseMemAvailableMib(kMeminfo);
  ASSERT_TRUE(mib.ok()) << mib.status().ToString();
  EXPECT_EQ(*mib, 2048);
}

TEST(AdmissionTest, AMeminfoWithoutMemAvailableIsAnError) {
  EXPECT_FALSE(ParseMemAvailableMib("MemTotal: 1 kB\nMemFree: 1 kB\n").ok());
  EXPECT_FALSE(ParseMemAvailableMib("MemAvailable: lots\n").ok());
  EXPECT_FALSE(ParseMemAvailableMib("MemAvailable: 12 MB\n").ok());
  EXPECT_FALSE(ParseMemAvailableMib("").ok());
}

TEST(AdmissionTest, AVmThatFitsBesideTheReserveIsAdmitted) {
  AdmissionLimits limits{/*memory_reserve_mib=*/512, /*max_vms=*/4};
  EXPECT_TRUE(AdmitVm(limits, {2048, 3, 0}, 1536).ok());
}

TEST(AdmissionTest, TooLittleMemoryIsRefusedAsInsufficientMemory) {
  AdmissionLimits limits{512, 0};
  Status st = AdmitVm(limits, {2048, 0, 0}, 1537);
  EXPECT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_EQ(AdmissionErrorKind(st), "insufficient_memory");
  EXPECT_NE(st.message().find("2048 MiB available"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("TRYBOX_MEMORY_RESERVE_MIB"), std::string::npos);
}

TEST(AdmissionTest, MemoryPromisedToBootingVmsCounts) {
  AdmissionLimits limits{0, 0};
  EXPECT_TRUE(AdmitVm(limits, {2048, 1, 1024}, 1024).ok());
  Status st = AdmitVm(limits, {2048, 1, 1025}, 1024);
  EXPECT_EQ(AdmissionErrorKind(st), "insufficient_memory") << st.ToString();
}

TEST(AdmissionTest, TheCapIsRefusedAsTooManyVmsBeforeMemory) {
  AdmissionLimits limits{1 << 20, 2};
  Status st = AdmitVm(limits, {2048, 2, 0}, 512);
  EXPECT_EQ(AdmissionErrorKind(st), "too_many_vms") << st.ToString();
  EXPECT_NE(st.message().find("cap is 2"), std::string::npos);
  // No cap: only memory decides.
  EXPECT_EQ(AdmissionErrorKind(AdmitVm({1 << 20, 0}, {2048, 1000, 0}, 512)), "insufficient_memory");
}

TEST(AdmissionTest, OtherErrorsHaveNoAdmissionKind) {
  EXPECT_EQ(AdmissionErrorKind(ResourceExhausted("disk budget")), "");
  EXPECT_EQ(AdmissionErrorKind(Internal("too_many_vms: not ours")), "");
}

TEST(AdmissionTest, TicketsHoldTheirPlaceUntilTheyEnd) {
  auto dir = TempDir::Make(::testing::TempDir(), "admission");
  ASSERT_TRUE(dir.ok());
  std::string meminfo = dir->path() + "/meminfo";
  ASSERT_TRUE(WriteFileAtomic(meminfo, kMeminfo).ok());
  Admission a({/*memory_reserve_mib=*/0, /*max_vms=*/2}, meminfo);
  {
    auto first = a.Admit(1024, 0, 0);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    // The first is still booting: it holds a VM slot and its memory.
    Status st = a.Admit(1025, 0, 0).status();
    EXPECT_EQ(AdmissionErrorKind(st), "insufficient_memory") << st.ToString();
    st = a.Admit(512, 1, 1024).status();
    EXPECT_EQ(AdmissionErrorKind(st), "too_many_vms") << st.ToString();
  }
  EXPECT_TRUE(a.Admit(2048, 1, 1024).ok());
}

// Issue 51.2: 40 creates of 1024 MiB were admitted on a host of 24 GiB because only VMs
// still booting counted (a restored clone uses ~40 MiB at first). Every live VM's promised
// memory counts now, booted or not.
TEST(AdmissionTest, EveryLiveVmsPromisedMemoryCountsBootedOrNot) {
  AdmissionLimits limits{/*memory_reserve_mib=*/256, /*max_vms=*/0};
  // MemAvailable barely moved (the guests touched nothing), 20 VMs of 1024 MiB registered.
  AdmissionLoad load{/*mem_available_mib=*/21212, /*live_vms=*/20, /*booting_memory_mib=*/0,
                     /*mem_total_mib=*/24105, /*promised_mib=*/20 * 1024};
  EXPECT_TRUE(AdmitVm(limits, load, 1024).ok());
  load.live_vms = 23;
  load.promised_mib = 23 * 1024;  // 23552 + 1024 > 24105 - 256
  Status st = AdmitVm(limits, load, 1024);
  EXPECT_EQ(AdmissionErrorKind(st), "insufficient_memory") << st.ToString();
  EXPECT_NE(st.message().find("23552 MiB are promised to the 23 live VMs"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("budget of 23849 MiB"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("overcommit ratio 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--memory-overcommit"), std::string::npos) << st.message();
  // Booting creates count the same.
  load.live_vms = 22;
  load.promised_mib = 22 * 1024;
  load.booting_memory_mib = 1024;
  EXPECT_EQ(AdmissionErrorKind(AdmitVm(limits, load, 1024)), "insufficient_memory");
}

TEST(AdmissionTest, OvercommitIsAnExplicitRatioAndTheTotalAnOperatorSetting) {
  AdmissionLimits limits{/*memory_reserve_mib=*/256, /*max_vms=*/0, /*memory_total_mib=*/1280,
                         /*overcommit=*/1.0};
  EXPECT_EQ(MemoryBudgetMib(limits, 24105), 1024);
  AdmissionLoad load{21212, 2, 0, 24105, 1024};
  Status st = AdmitVm(limits, load, 512);
  EXPECT_EQ(AdmissionErrorKind(st), "insufficient_memory") << st.ToString();
  EXPECT_NE(st.message().find("1280 MiB of host memory as set by tryboxd --memory-total"),
            std::string::npos)
      << st.message();
  limits.overcommit = 2.0;
  EXPECT_EQ(MemoryBudgetMib(limits, 24105), 2048);
  EXPECT_TRUE(AdmitVm(limits, load, 512).ok());
  // A reserve larger than the host: no budget at all, never a negative one.
  limits.memory_reserve_mib = 4096;
  EXPECT_EQ(MemoryBudgetMib(limits, 24105), 0);
}

TEST(AdmissionTest, RegisteredVmsKeepTheirPromiseAfterTheirTicketsEnd) {
  auto dir = TempDir::Make(::testing::TempDir(), "admission");
  ASSERT_TRUE(dir.ok());
  std::string meminfo = dir->path() + "/meminfo";
  // 8 GiB, all of it available: restored guests touched nothing.
  ASSERT_TRUE(WriteFileAtomic(meminfo, "MemTotal: 8388608 kB\nMemAvailable: 8388608 kB\n").ok());
  Admission a({/*memory_reserve_mib=*/0, /*max_vms=*/0}, meminfo);
  int64_t registered = 0;
  for (int i = 0; i < 8; ++i) {
    auto t = a.Admit(1024, i, registered);
    ASSERT_TRUE(t.ok()) << i << ": " << t.status().ToString();
    registered += 1024;  // the ticket ends here: the VM is registered
  }
  Status st = a.Admit(1024, 8, registered).status();
  EXPECT_EQ(AdmissionErrorKind(st), "insufficient_memory") << st.ToString();
  Admission::Memory m = a.Describe();
  EXPECT_EQ(m.total_mib, 8192);
  EXPECT_EQ(m.budget_mib, 8192);
  EXPECT_EQ(m.available_mib, 8192);
  EXPECT_FALSE(m.total_from_setting);
}

TEST(AdmissionTest, AMeminfoWithoutMemTotalAdmitsNothing) {
  auto dir = TempDir::Make(::testing::TempDir(), "admission");
  ASSERT_TRUE(dir.ok());
  std::string meminfo = dir->path() + "/meminfo";
  ASSERT_TRUE(WriteFileAtomic(meminfo, "MemAvailable: 8388608 kB\n").ok());
  Admission a({0, 0}, meminfo);
  EXPECT_FALSE(a.Admit(512, 0, 0).ok());
}

}  // namespace
}  // namespace trybox::daemon
