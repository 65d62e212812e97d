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
    auto first = a.Admit(1024, 0);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    // The first is still booting: it holds a VM slot and its memory.
    Status st = a.Admit(1025, 0).status();
    EXPECT_EQ(AdmissionErrorKind(st), "insufficient_memory") << st.ToString();
    st = a.Admit(512, 1).status();
    EXPECT_EQ(AdmissionErrorKind(st), "too_many_vms") << st.ToString();
  }
  EXPECT_TRUE(a.Admit(2048, 1).ok());
}

}  // namespace
}  // namespace trybox::daemon
