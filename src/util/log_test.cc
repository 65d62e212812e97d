#include "util/log.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "util/fd.h"

namespace trybox {
namespace {

std::vector<std::string> Lines(const std::string& path) {
  std::vector<std::string> out;
  std::string text = ReadFileToString(path).value_or("");
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    EXPECT_NE(nl, std::string::npos) << "a line cut short in " << path;
    if (nl == std::string::npos) break;
    out.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

uint64_t Size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

class LogFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = TempDir::Make("/tmp", "log-test-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
    path_ = tmp_->path() + "/tryboxd.log";
  }
  void TearDown() override { ASSERT_TRUE(SetLogFile("", 0).ok()); }
  std::optional<TempDir> tmp_;
  std::string path_;
};

TEST_F(LogFileTest, RotatesToOneOldFileAtTheCap) {
  ASSERT_TRUE(SetLogFile(path_, 1000, /*take_stdio=*/false).ok());
  for (int i = 0; i < 100; ++i) LogInfo("test", "line " + std::to_string(i) + std::string(40, 'x'));
  EXPECT_LE(Size(path_), 1000u);
  EXPECT_LE(Size(path_ + ".1"), 1000u);
  EXPECT_GT(Size(path_ + ".1"), 800u);
  auto now = Lines(path_);
  auto old = Lines(path_ + ".1");
  ASSERT_FALSE(now.empty());
  ASSERT_FALSE(old.empty());
  EXPECT_NE(now.back().find(" I test: line 99x"), std::string::npos) << now.back();
  // The old file ends where the new one starts: nothing in between is lost.
  int last_old = std::stoi(old.back().substr(old.back().find("line ") + 5));
  int first_new = std::stoi(now.front().substr(now.front().find("line ") + 5));
  EXPECT_EQ(first_new, last_old + 1);
  // Only one old file is kept.
  EXPECT_EQ(Size(path_ + ".2"), 0u);
}

TEST_F(LogFileTest, AMessageIsOneLineWhateverItHolds) {
  ASSERT_TRUE(SetLogFile(path_, 1 << 20, false).ok());
  LogError("egress", "host evil.test\n2026-01-01T00:00:00.000Z I daemon: forged\r\x1b[2J");
  LogInfo("x", std::string(kMaxLogLine + 100, 'y'));
  auto lines = Lines(path_);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("evil.test\\u{000A}2026"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("[... 100 bytes cut]"), std::string::npos);
}

// Descriptors 1 and 2 follow the rotation, so stray writes to stderr land in the current
// file and the old one is closed. In a child process (it moves the test binary's stderr);
// gtest's threadsafe style re-runs this test in the child, which finds the parent's
// directory in the environment.
TEST(LogStdioTest, StderrFollowsTheRotation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const char* kEnv = "TRYBOX_LOG_TEST_DIR";
  std::optional<TempDir> tmp;
  std::string dir;
  if (const char* inherited = std::getenv(kEnv)) {
    dir = inherited;
  } else {
    auto t = TempDir::Make("/tmp", "log-test-");
    ASSERT_TRUE(t.ok());
    tmp.emplace(std::move(*t));
    dir = tmp->path();
    ::setenv(kEnv, dir.c_str(), 1);
  }
  std::string path = dir + "/tryboxd.log";
  EXPECT_EXIT(
      {
        if (!SetLogFile(path, 500).ok()) _exit(2);
        (void)!::write(2, "stray-before\n", 13);
        for (int i = 0; i < 8; ++i) LogInfo("t", "fill " + std::string(50, 'z'));
        (void)!::write(2, "stray-after\n", 12);
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  ::unsetenv(kEnv);
  std::string now = ReadFileToString(path).value_or("");
  std::string old = ReadFileToString(path + ".1").value_or("");
  EXPECT_NE(now.find("stray-after"), std::string::npos) << now;
  EXPECT_EQ(old.find("stray-after"), std::string::npos);
  EXPECT_NE(old.find("stray-before"), std::string::npos) << old;
  EXPECT_LE(now.size(), 500u);
}

}  // namespace
}  // namespace trybox
