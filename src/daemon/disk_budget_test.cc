#include "daemon/disk_budget.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "util/fd.h"

namespace trybox::daemon {
namespace {

class DiskBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = TempDir::Make("/tmp", "disk-budget-test-");
    ASSERT_TRUE(d.ok());
    dir_.emplace(std::move(*d));
  }
  // A file of `written` real bytes and `length` in all (the rest a hole).
  void MakeFile(const std::string& name, int64_t written, int64_t length) {
    auto fd = OpenFile(dir_->path() + "/" + name, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(fd.ok());
    std::string chunk(1 << 20, 'x');
    for (int64_t at = 0; at < written; at += chunk.size()) {
      ASSERT_TRUE(WriteFull(fd->get(), chunk).ok());
    }
    ASSERT_EQ(::ftruncate(fd->get(), length), 0);
    ASSERT_EQ(::fsync(fd->get()), 0);
  }
  std::optional<TempDir> dir_;
};

TEST_F(DiskBudgetTest, AVmsUseIsWhatItsFilesHoldNotTheirLength) {
  MakeFile("disk.qcow2", 3 << 20, int64_t{8} << 30);  // 3 MiB written, 8 GiB long
  MakeFile("xfer.img", 0, int64_t{1} << 30);          // announced, empty
  const int64_t disk = DiskBudget::AllocatedBytes(dir_->path() + "/disk.qcow2");
  EXPECT_GE(disk, 3 << 20);
  EXPECT_LT(disk, 4 << 20);
  EXPECT_LT(DiskBudget::AllocatedBytes(dir_->path() + "/xfer.img"), 64 << 10);
  EXPECT_EQ(DiskBudget::AllocatedBytes(dir_->path() + "/missing"), 0);
  const int64_t vm = DiskBudget::VmBytes(dir_->path());
  EXPECT_GE(vm, disk);
  EXPECT_LT(vm, disk + (64 << 10));
}

TEST_F(DiskBudgetTest, ACreateIsRefusedOnceTheRunningVmsUseTheBudget) {
  DiskBudget b(100 << 20, 0, dir_->path());
  EXPECT_TRUE(b.Admit({}).ok());
  EXPECT_TRUE(b.Admit({{"a", 60 << 20}, {"b", 39 << 20}}).ok());
  Status st = b.Admit({{"a", 60 << 20}, {"b", 40 << 20}});
  EXPECT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_NE(st.message().find("100.0 MiB"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--disk-budget"), std::string::npos) << st.message();
  // No budget: only the reserve counts.
  EXPECT_TRUE(DiskBudget(0, 0, dir_->path()).Admit({{"a", int64_t{1} << 40}}).ok());
}

TEST_F(DiskBudgetTest, ACreateIsRefusedWhenTheStateFilesystemHasLessThanTheReserve) {
  DiskBudget b(0, int64_t{1} << 60, dir_->path());  // more than any disk has
  Status st = b.Admit({});
  EXPECT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_NE(st.message().find("--disk-reserve"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(dir_->path()), std::string::npos) << st.message();
  EXPECT_TRUE(DiskBudget(0, 1 << 20, dir_->path()).Admit({}).ok());
}

TEST_F(DiskBudgetTest, OverTheBudgetTheVmUsingTheMostIsNamed) {
  DiskBudget b(100 << 20, 0, dir_->path());
  EXPECT_FALSE(b.OverBudget({{"a", 50 << 20}, {"b", 50 << 20}}).has_value());
  auto over = b.OverBudget({{"a", 30 << 20}, {"big", 60 << 20}, {"c", 20 << 20}});
  ASSERT_TRUE(over.has_value());
  EXPECT_EQ(over->vm_id, "big");
  EXPECT_EQ(over->bytes, 60 << 20);
  EXPECT_FALSE(DiskBudget(0, 0, dir_->path()).OverBudget({{"a", int64_t{1} << 40}}));
}

TEST_F(DiskBudgetTest, TheDefaultBudgetIsHalfTheFreeSpace) {
  auto auto_budget = DiskBudgetBytes(0, dir_->path());
  ASSERT_TRUE(auto_budget.ok());
  EXPECT_GT(*auto_budget, 0);
  EXPECT_EQ(DiskBudgetBytes(300, dir_->path()).value_or(0), int64_t{300} << 20);
  EXPECT_FALSE(DiskBudgetBytes(0, dir_->path() + "/missing").ok());
}

}  // namespace
}  // namespace trybox::daemon
