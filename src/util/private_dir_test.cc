#include "util/private_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fd.h"

namespace trybox {
namespace {

class PrivateDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = TempDir::Make("/tmp", "private-dir-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
    path_ = tmp_->path() + "/run";
  }
  mode_t ModeOf(const std::string& p) {
    struct stat st;
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  }
  static void ExpectRefused(const Status& st, const std::string& path, const std::string& why) {
    EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.ToString();
    EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("mode 0700"), std::string::npos) << st.message();
  }
  std::optional<TempDir> tmp_;
  std::string path_;
};

TEST_F(PrivateDirTest, MissingIsNotFound) {
  EXPECT_EQ(CheckPrivateDir(path_).code(), Code::kNotFound);
}

TEST_F(PrivateDirTest, MakeCreatesTheDirectoryAndItsParentsWithMode0700) {
  std::string deep = path_ + "/a/b";
  ASSERT_TRUE(MakePrivateDir(deep).ok());
  EXPECT_EQ(ModeOf(path_), 0700u);
  EXPECT_EQ(ModeOf(path_ + "/a"), 0700u);
  EXPECT_EQ(ModeOf(deep), 0700u);
  EXPECT_TRUE(CheckPrivateDir(deep).ok());
  EXPECT_TRUE(MakePrivateDir(deep).ok());  // existing and private: fine
}

TEST_F(PrivateDirTest, ASymlinkIsRefusedEvenToAPrivateDirectory) {
  std::string real = tmp_->path() + "/real";
  ASSERT_TRUE(MakePrivateDir(real).ok());
  ASSERT_EQ(::symlink(real.c_str(), path_.c_str()), 0);
  ExpectRefused(CheckPrivateDir(path_), path_, "symbolic link");
  ExpectRefused(MakePrivateDir(path_), path_, "symbolic link");
}

TEST_F(PrivateDirTest, AWorldWritableDirectoryIsRefusedAndLeftAsItIs) {
  ASSERT_EQ(::mkdir(path_.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(path_.c_str(), 0777), 0);
  ExpectRefused(CheckPrivateDir(path_), path_, "its mode is 0777");
  ExpectRefused(MakePrivateDir(path_), path_, "its mode is 0777");
  EXPECT_EQ(ModeOf(path_), 0777u) << "an existing directory was changed";
  ASSERT_EQ(::chmod(path_.c_str(), 0750), 0);
  ExpectRefused(CheckPrivateDir(path_), path_, "its mode is 0750");
}

TEST_F(PrivateDirTest, ADirectoryOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  ASSERT_EQ(::mkdir(path_.c_str(), 0700), 0);
  ASSERT_EQ(::chown(path_.c_str(), 65534, 65534), 0);
  ExpectRefused(CheckPrivateDir(path_), path_, "owned by uid 65534");
  ExpectRefused(MakePrivateDir(path_), path_, "owned by uid 65534");
}

TEST_F(PrivateDirTest, AFileIsRefused) {
  ASSERT_TRUE(WriteFileAtomic(path_, "x", 0600).ok());
  ExpectRefused(CheckPrivateDir(path_), path_, "not a directory");
}

}  // namespace
}  // namespace trybox
