#include "image/build.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "image/image.h"
#include "util/fd.h"
#include "util/process.h"
#include "util/sha256.h"

namespace trybox::image {
namespace {

class BuildTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::Make("/tmp", "build_test-");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    tmp_.emplace(std::move(dir).value());
    apt_ = tmp_->path() + "/apt";
    ASSERT_TRUE(MakeDirs(apt_ + "/sources.list.d").ok());
  }

  void Write(const std::string& rel, const std::string& text) {
    ASSERT_TRUE(WriteFileAtomic(tmp_->path() + "/" + rel, text).ok());
  }

  // A pid that was just alive and is now reaped.
  static pid_t DeadPid() {
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    int status;
    ::waitpid(pid, &status, 0);
    return pid;
  }

  std::optional<TempDir> tmp_;
  std::string apt_;
};

constexpr char kDeb822[] =
    "Types: deb\n"
    "# comment\n"
    "URIs: http://mirror.invalid/debian\n"
    "Suites: bookworm bookworm-updates\n"
    "Components: main\n"
    "\n"
    "Types: deb\n"
    "URIs: http://mirror.invalid/debian-security\n"
    "Suites: bookworm-security\n"
    "Components: main\n";

TEST_F(BuildTest, FindsDeb822SourcesForSuiteAndSkipsDisabledFiles) {
  Write("apt/sources.list.d/a.sources.disabled-by-farm", kDeb822);
  Write("apt/sources.list.d/b.sources",
        "Types: deb\nURIs: http://other.invalid/\nSuites: stable\nComponents: main\n");
  Write("apt/sources.list.d/debian.sources", kDeb822);
  auto found = FindAptSources(apt_, "bookworm");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->path, apt_ + "/sources.list.d/debian.sources");
  EXPECT_EQ(found->content, kDeb822);
}

TEST_F(BuildTest, SuiteMustMatchAWholeWordInAnEnabledDebStanza) {
  Write("apt/sources.list.d/a.sources",
        "Types: deb-src\nURIs: http://m.invalid/\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://m.invalid/\nSuites: bookworm\nEnabled: no\n\n"
        "Types: deb\nURIs: http://m.invalid/\nSuites: bookworm-backports\n");
  EXPECT_EQ(FindAptSources(apt_, "bookworm").status().code(), Code::kNotFound);
  EXPECT_TRUE(FindAptSources(apt_, "bookworm-backports").ok());
}

TEST_F(BuildTest, FallsBackToOneLineSourcesList) {
  Write("apt/sources.list",
        "# deb http://m.invalid/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://m.invalid/debian bookworm main\n");
  auto found = FindAptSources(apt_, "bookworm");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->path, apt_ + "/sources.list");
  EXPECT_EQ(FindAptSources(apt_, "trixie").status().code(), Code::kNotFound);
}

TEST_F(BuildTest, OneLineListInSourcesListDIsRead) {
  Write("apt/sources.list.d/x.list", "deb http://m.invalid/debian bookworm main\n");
  auto found = FindAptSources(apt_, "bookworm");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->path, apt_ + "/sources.list.d/x.list");
}

TEST_F(BuildTest, RemovesLeftoversOfDeadBuildsOnly) {
  std::string dead = std::to_string(DeadPid());
  std::string live = std::to_string(::getpid());
  std::string d = tmp_->path() + "/images";
  for (const std::string& n : std::vector<std::string>{
           ".build-debian-12-" + dead, ".old-debian-12-" + dead, ".build-debian-12-" + live,
           "rootfs-" + dead + "-Ab12Cd", "scratch-" + live + "-Ab12Cd", "debian-12", ".lock"}) {
    ASSERT_TRUE(MakeDirs(d + "/" + n).ok());
  }
  // Frozen like a finished image: RemoveTree must cope.
  ASSERT_TRUE(WriteFileAtomic(d + "/.old-debian-12-" + dead + "/rootfs.ext4", "x", 0444).ok());
  ASSERT_EQ(::chmod((d + "/.old-debian-12-" + dead).c_str(), 0555), 0);

  std::vector<std::string> removed = RemoveStaleBuilds(d);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{d + "/.build-debian-12-" + dead,
                                               d + "/.old-debian-12-" + dead,
                                               d + "/rootfs-" + dead + "-Ab12Cd"}));
  struct stat st;
  EXPECT_EQ(::stat((d + "/.build-debian-12-" + live).c_str(), &st), 0);
  EXPECT_EQ(::stat((d + "/scratch-" + live + "-Ab12Cd").c_str(), &st), 0);
  EXPECT_EQ(::stat((d + "/debian-12").c_str(), &st), 0);
}

TEST_F(BuildTest, UnknownRecipeListsTheKnownOnes) {
  BuildOptions opts;
  opts.name = "alpine";
  opts.images_root = tmp_->path() + "/images";
  opts.cache_dir = tmp_->path() + "/cache";
  opts.init_binary = "/nonexistent";
  Status st = BuildImage(opts);
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_NE(st.message().find("known: debian-12"), std::string::npos) << st.message();
  EXPECT_EQ(KnownRecipes(), std::vector<std::string>{"debian-12"});
}

TEST_F(BuildTest, InvalidNameIsRejectedBeforeAnythingIsWritten) {
  BuildOptions opts;
  opts.name = "../x";
  opts.images_root = tmp_->path() + "/images";
  opts.cache_dir = tmp_->path() + "/cache";
  EXPECT_EQ(BuildImage(opts).code(), Code::kInvalidArgument);
  struct stat st;
  EXPECT_NE(::stat(opts.images_root.c_str(), &st), 0);
}

TEST_F(BuildTest, DynamicInitIsRefusedAndLeavesNoBuildDirectory) {
  BuildOptions opts;
  opts.images_root = tmp_->path() + "/images";
  opts.cache_dir = tmp_->path() + "/cache";
  opts.init_binary = "/bin/sh";  // dynamically linked on Debian
  Status st = BuildImage(opts);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("dynamically linked"), std::string::npos) << st.message();
  auto list = ListImages(opts.images_root);
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
}

// The scratch part must be the same bytes on every build: with mke2fs's random UUID, hash
// seed and times, every rebuild of debian-12 changed its manifest and made debian-12-dev
// (and every template) stale.
TEST_F(BuildTest, TheScratchPartIsTheSameBytesOnEveryBuild) {
  std::vector<std::string> hashes;
  for (int i = 0; i < 2; ++i) {
    const std::string dir = tmp_->path() + "/scratch" + std::to_string(i);
    ASSERT_TRUE(MakeDirs(dir).ok());
    Status made = MakeScratchImage(dir, dir + "/scratch.qcow2");
    ASSERT_TRUE(made.ok()) << made.ToString();
    auto sha = Sha256File(dir + "/scratch.qcow2");
    ASSERT_TRUE(sha.ok()) << sha.status().ToString();
    hashes.push_back(*sha);
    // Seconds apart on the clock: a build's time must not reach the bytes.
    if (i == 0) ::sleep(1);
  }
  EXPECT_EQ(hashes[0], hashes[1]);
  // And it is an ext4 labelled for the guest to find.
  auto info =
      RunCommand({"blkid", "-o", "value", "-s", "LABEL", tmp_->path() + "/scratch0/scratch.raw"});
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->output, "trybox-scratch\n");
}

}  // namespace
}  // namespace trybox::image

namespace trybox::image {
namespace {

// Issue 51.9: what prune reports before removing, with the bytes on disk.
TEST_F(BuildTest, FindStaleBuildsMeasuresWithoutRemoving) {
  std::string dead = std::to_string(DeadPid());
  std::string d = tmp_->path() + "/images2";
  ASSERT_TRUE(MakeDirs(d + "/.build-img-" + dead).ok());
  ASSERT_TRUE(MakeDirs(d + "/.build-img-" + std::to_string(::getpid())).ok());
  ASSERT_TRUE(
      WriteFileAtomic(d + "/.build-img-" + dead + "/layer-1.ext4", std::string(1 << 20, 'x'), 0444)
          .ok());
  ASSERT_EQ(::chmod((d + "/.build-img-" + dead).c_str(), 0555), 0);
  std::vector<StaleBuild> found = FindStaleBuilds(d);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].path, d + "/.build-img-" + dead);
  EXPECT_GE(found[0].bytes, uint64_t{1} << 20);
  struct stat st;
  EXPECT_EQ(::stat(found[0].path.c_str(), &st), 0);
  EXPECT_EQ(RemoveStaleBuilds(d), (std::vector<std::string>{found[0].path}));
  EXPECT_NE(::stat(found[0].path.c_str(), &st), 0);
}

}  // namespace
}  // namespace trybox::image
