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

// The upper dir reaches MeasureTree and CopyTree as /proc/self/fd/N, a link to it: the
// whole tree is measured (not the link alone, which once sized a layer for one entry and
// a developer image's freeze failed with no inodes left), and the root's own mode and
// xattrs are the directory's, not the link's.
TEST_F(CopyTreeTest, ARootReachedThroughAFdLinkIsTheDirectoryItself) {
  ASSERT_TRUE(MakeDirs(from_ + "/usr/share/doc").ok());
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(WriteFileAtomic(from_ + "/usr/share/doc/f" + std::to_string(i), "x").ok());
  }
  ASSERT_EQ(::chmod(from_.c_str(), 0751), 0);
  ASSERT_EQ(::setxattr(from_.c_str(), "user.root", "r", 1, 0), 0);
  ASSERT_TRUE(WriteFileAtomic(tmp_->path() + "/elsewhere", "not in the tree").ok());
  auto fd = OpenFile(from_, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_TRUE(fd.ok());
  const std::string link = "/proc/self/fd/" + std::to_string(fd->get());

  auto u = MeasureTree(link);
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->inodes, 1u + 3u + 40u);  // the root, usr/share/doc, the files
  EXPECT_EQ(u->bytes, 4 * 4096u + 40 * 4096u);

  auto copied = CopyTree(link, to_);
  ASSERT_TRUE(copied.ok()) << copied.status().ToString();
  EXPECT_EQ(copied->entries, 3u + 40u);
  struct stat st;
  ASSERT_EQ(::stat(to_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0751u);
  char value[4] = {};
  EXPECT_EQ(::getxattr(to_.c_str(), "user.root", value, sizeof value), 1);
}

// Directories are sized by their entries: a directory of many long names takes more than
// the one block a small one does.
TEST_F(CopyTreeTest, MeasureSizesALargeDirectoryByItsNames) {
  ASSERT_EQ(::mkdir((from_ + "/big").c_str(), 0755), 0);
  const std::string stem(100, 'n');
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(::symlink("t", (from_ + "/big/" + stem + std::to_string(i)).c_str()), 0);
  }
  auto u = MeasureTree(from_);
  ASSERT_TRUE(u.ok());
  // 100 entries of 8 + 104 bytes, twice over: 22,400 bytes, 6 blocks; the root 1 block.
  EXPECT_EQ(u->bytes, 7 * 4096u);
  EXPECT_EQ(u->inodes, 102u);
}

}  // namespace
}  // namespace trybox::guest
