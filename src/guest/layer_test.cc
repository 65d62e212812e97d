// CopyTree: a commit's copy keeps what overlayfs needs of an upper dir (whiteouts,
// opaque-dir xattrs) and what a file is (owner, mode, times, symlinks, hard links).
#include "guest/layer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "util/fd.h"

namespace trybox::guest {
namespace {

class CopyTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::Make("/tmp", "layer_test-");
    ASSERT_TRUE(dir.ok());
    tmp_.emplace(std::move(dir).value());
    from_ = tmp_->path() + "/from";
    to_ = tmp_->path() + "/to";
    ASSERT_EQ(::mkdir(from_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(to_.c_str(), 0700), 0);
  }
  std::optional<TempDir> tmp_;
  std::string from_, to_;
};

TEST_F(CopyTreeTest, KeepsFilesLinksModesTimesAndXattrs) {
  ASSERT_TRUE(MakeDirs(from_ + "/opt/d").ok());
  ASSERT_TRUE(WriteFileAtomic(from_ + "/opt/d/f", "hello", 0750).ok());
  ASSERT_EQ(::link((from_ + "/opt/d/f").c_str(), (from_ + "/opt/hard").c_str()), 0);
  ASSERT_EQ(::symlink("d/f", (from_ + "/opt/sym").c_str()), 0);
  ASSERT_EQ(::setxattr((from_ + "/opt/d").c_str(), "user.k", "v", 1, 0), 0);
  const struct timespec times[2] = {{1000, 0}, {2000, 5}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (from_ + "/opt/d/f").c_str(), times, 0), 0);
  ASSERT_EQ(::chmod(from_.c_str(), 0711), 0);

  auto copied = CopyTree(from_, to_);
  ASSERT_TRUE(copied.ok()) << copied.status().ToString();
  EXPECT_EQ(copied->bytes, 5u);
  EXPECT_EQ(*ReadFileToString(to_ + "/opt/d/f"), "hello");
  struct stat a, b;
  ASSERT_EQ(::stat((to_ + "/opt/d/f").c_str(), &a), 0);
  ASSERT_EQ(::stat((to_ + "/opt/hard").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(a.st_mode & 07777, 0750u);
  EXPECT_EQ(a.st_mtim.tv_sec, 2000);
  char target[16] = {};
  ASSERT_EQ(::readlink((to_ + "/opt/sym").c_str(), target, sizeof target - 1), 3);
  EXPECT_STREQ(target, "d/f");
  char value[4] = {};
  EXPECT_EQ(::getxattr((to_ + "/opt/d").c_str(), "user.k", value, sizeof value), 1);
  ASSERT_EQ(::stat(to_.c_str(), &a), 0);
  EXPECT_EQ(a.st_mode & 07777, 0711u);
}

TEST_F(CopyTreeTest, KeepsWhiteoutsAndOpaqueDirsWhereThePrivilegeAllows) {
  if (::geteuid() != 0) GTEST_SKIP() << "whiteouts and trusted xattrs need root";
  ASSERT_EQ(::mknod((from_ + "/gone").c_str(), S_IFCHR | 0, ::makedev(0, 0)), 0);
  ASSERT_EQ(::mkdir((from_ + "/opaque").c_str(), 0755), 0);
  ASSERT_EQ(::setxattr((from_ + "/opaque").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
  ASSERT_TRUE(CopyTree(from_, to_).ok());
  struct stat st;
  ASSERT_EQ(::lstat((to_ + "/gone").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, ::makedev(0, 0));
  char value[4] = {};
  EXPECT_EQ(::getxattr((to_ + "/opaque").c_str(), "trusted.overlay.opaque", value, sizeof value),
            1);
  EXPECT_EQ(value[0], 'y');
}

TEST_F(CopyTreeTest, MeasureCountsEntriesAndRoundsBlocks) {
  ASSERT_TRUE(WriteFileAtomic(from_ + "/a", std::string(5000, 'x')).ok());
  ASSERT_EQ(::mkdir((from_ + "/d").c_str(), 0755), 0);
  auto u = MeasureTree(from_);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->inodes, 3u);
  EXPECT_EQ(u->bytes, 8192u + 2 * 4096u);
}

}  // namespace
}  // namespace trybox::guest
