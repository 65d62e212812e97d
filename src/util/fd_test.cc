#include "util/fd.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

namespace trybox {
namespace {

std::string ReadAll(const std::string& path) {
  auto s = ReadFileToString(path);
  return s.ok() ? *s : "error: " + s.status().message();
}

// copy_file_range refuses files on file systems of different kinds (EXDEV): a template on the
// state disk copied into a VM directory on a tmpfs failed that way and the restore gave up.
TEST(CopyFileTest, CopiesBetweenFileSystemsOfDifferentKinds) {
  struct stat a, b;
  if (::stat("/tmp", &a) != 0 || ::stat("/dev/shm", &b) != 0 || a.st_dev == b.st_dev) {
    GTEST_SKIP() << "needs /tmp and /dev/shm on different file systems";
  }
  auto src = TempDir::Make("/tmp", "fd-test-");
  auto dst = TempDir::Make("/dev/shm", "fd-test-");
  ASSERT_TRUE(src.ok() && dst.ok());
  std::string data(3 << 20, 'x');
  data[12345] = 'y';
  ASSERT_TRUE(WriteFileAtomic(src->path() + "/f", data, 0600).ok());
  Status st = CopyFile(src->path() + "/f", dst->path() + "/g", 0640);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ReadAll(dst->path() + "/g"), data);
  // And the other way.
  st = CopyFile(dst->path() + "/g", src->path() + "/h", 0600);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ReadAll(src->path() + "/h"), data);
}

TEST(CopyFileTest, RefusesAnExistingDestination) {
  auto d = TempDir::Make("/tmp", "fd-test-");
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(WriteFileAtomic(d->path() + "/a", "1", 0600).ok());
  ASSERT_TRUE(WriteFileAtomic(d->path() + "/b", "2", 0600).ok());
  EXPECT_FALSE(CopyFile(d->path() + "/a", d->path() + "/b", 0600).ok());
  EXPECT_EQ(ReadAll(d->path() + "/b"), "2");
}

}  // namespace
}  // namespace trybox
