// ImageBuilds runs a build as a child process and keeps its lines. Here the child is a
// shell script standing in for `trybox image build` (the real build is the dashboard's e2e
// test): what is tested is the job runner, its arguments, lines, states and cancel.
#include "daemon/image_builds.h"

#include <gtest/gtest.h>

#include "util/fd.h"

namespace trybox::daemon {
namespace {

// Prints its arguments and five lines. With `-f`, waits for SIGINT (answering it as the CLI
// does, with exit 130), else exits 3.
constexpr const char* kScript = R"SH(#!/bin/sh
echo "args: $*"
echo "progress: $TRYBOX_PROGRESS"
for i in 0 1 2 3 4; do echo "line-$i"; done
if [ "$3" = "-f" ]; then
  trap 'echo interrupted; exit 130' INT
  echo "recipe: $(cat "$4")"
  sleep 30 & wait
  exit 0
fi
printf 'no newline at the end'
exit 3
)SH";

class ImageBuildsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = TempDir::Make("/tmp", "image-builds-test-");
    ASSERT_TRUE(d.ok());
    dir_.emplace(std::move(*d));
    ASSERT_TRUE(WriteFileAtomic(dir_->path() + "/trybox", kScript, 0700).ok());
    settings_.trybox_binary = dir_->path() + "/trybox";
    settings_.work_dir = dir_->path() + "/work";
  }

  // Every line of build `id`, once it ended.
  static std::vector<std::string> AllLines(ImageBuilds& builds, const std::string& id) {
    std::vector<std::string> lines;
    for (;;) {
      auto c = builds.Follow(id, static_cast<int64_t>(lines.size()),
                             std::chrono::steady_clock::now() + std::chrono::seconds(20));
      EXPECT_TRUE(c.ok()) << c.status().message();
      if (!c.ok()) return lines;
      EXPECT_EQ(c->first, static_cast<int64_t>(lines.size()));
      lines.insert(lines.end(), c->lines.begin(), c->lines.end());
      if (c->ended) return lines;
    }
  }

  std::optional<TempDir> dir_;
  ImageBuildSettings settings_;
};

TEST_F(ImageBuildsTest, ABuiltInRecipeBuildRunsTheCliAndKeepsEveryLineAndTheExitCode) {
  ImageBuilds builds(settings_);
  auto id = builds.Start("debian-12-dev", nullptr);
  ASSERT_TRUE(id.ok()) << id.status().message();
  const std::vector<std::string> lines = AllLines(builds, *id);
  ASSERT_EQ(lines.size(), 8u);
  EXPECT_EQ(lines[0], "args: image build -- debian-12-dev");
  EXPECT_EQ(lines[1], "progress: always");
  EXPECT_EQ(lines[6], "line-4");
  EXPECT_EQ(lines[7], "no newline at the end");
  auto shown = builds.Show(*id);
  ASSERT_TRUE(shown.ok());
  const Json b = (*shown)["build"];
  EXPECT_EQ(b["state"], "failed");
  EXPECT_EQ(b["exit_code"], 3);
  EXPECT_EQ(b["recipe"], "builtin");
  EXPECT_EQ(b["lines"], 8);
  EXPECT_FALSE(b["ended_at"].is_null());
  EXPECT_EQ(builds.List()["builds"].size(), 1u);
  // A follower that comes later starts where it asks.
  auto late = builds.Follow(*id, 6, std::chrono::steady_clock::now());
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->first, 6);
  EXPECT_EQ(late->lines.size(), 2u);
  EXPECT_TRUE(late->ended);
}

TEST_F(ImageBuildsTest, RefusalsNameWhatIsWrongAndStartNothing) {
  ImageBuilds builds(settings_);
  auto bad_name = builds.Start("../x", nullptr);
  EXPECT_EQ(bad_name.status().code(), Code::kInvalidArgument);
  auto no_recipe = builds.Start("not-built-in", nullptr);
  EXPECT_EQ(no_recipe.status().code(), Code::kNotFound);
  auto copy = builds.Start(
      "x", Json{{"from", "debian-12"}, {"steps", Json::array({{{"copy", "a"}, {"to", "/a"}}})}});
  EXPECT_EQ(copy.status().code(), Code::kInvalidArgument);
  EXPECT_NE(copy.status().message().find("copy"), std::string::npos);
  auto unparsed = builds.Start("x", Json{{"form", "debian-12"}});
  EXPECT_EQ(unparsed.status().code(), Code::kInvalidArgument);
  auto not_object = builds.Start("x", Json::array());
  EXPECT_EQ(not_object.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(builds.List()["builds"].empty());
  EXPECT_EQ(builds.Show("nope").status().code(), Code::kNotFound);
  EXPECT_EQ(builds.Cancel("nope").code(), Code::kNotFound);
}

// A name reaches the CLI's command line: `--rebuild-rootfs` as a name once started a build
// of debian-12 with its root filesystem rebuilt (issue 41.8).
TEST_F(ImageBuildsTest, ANameThatReadsAsAnOptionIsRefusedAndStartsNothing) {
  ImageBuilds builds(settings_);
  const Json recipe = {{"from", "debian-12"}, {"check", Json::array({"true"})}};
  for (const char* name : {"--rebuild-rootfs", "-f", "-"}) {
    for (const Json& r : {recipe, Json()}) {
      auto id = builds.Start(name, r);
      ASSERT_FALSE(id.ok()) << name;
      EXPECT_EQ(id.status().code(), Code::kInvalidArgument) << name;
      EXPECT_NE(id.status().message().find("does not start with '-'"), std::string::npos)
          << id.status().message();
    }
  }
  EXPECT_TRUE(builds.List()["builds"].empty());
}

TEST_F(ImageBuildsTest, APostedRecipeIsAFileForTheCliAndCancelInterruptsIt) {
  ImageBuilds builds(settings_);
  const Json recipe = {{"from", "debian-12"}, {"check", Json::array({"true"})}};
  auto id = builds.Start("slow", recipe);
  ASSERT_TRUE(id.ok()) << id.status().message();
  // The same name again while it runs is refused, naming the build.
  auto again = builds.Start("slow", recipe);
  EXPECT_EQ(again.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(again.status().message().find(*id), std::string::npos);
  // Wait for the script to have set its trap (and read its recipe).
  auto seen = builds.Follow(*id, 7, std::chrono::steady_clock::now() + std::chrono::seconds(20));
  ASSERT_TRUE(seen.ok());
  ASSERT_EQ(seen->lines.size(), 1u);
  EXPECT_EQ(seen->lines[0], "recipe: " + recipe.dump());
  ASSERT_TRUE(builds.Cancel(*id).ok());
  const std::vector<std::string> lines = AllLines(builds, *id);
  EXPECT_EQ(lines.back(), "interrupted");
  EXPECT_EQ(lines[0].rfind("args: image build -f " + settings_.work_dir + "/", 0), 0u) << lines[0];
  EXPECT_EQ(lines[0].substr(lines[0].size() - 8), " -- slow") << lines[0];
  const Json b = (*builds.Show(*id))["build"];
  EXPECT_EQ(b["state"], "cancelled");
  EXPECT_EQ(b["exit_code"], 130);
  EXPECT_EQ(b["recipe"], "posted");
  EXPECT_EQ(builds.Cancel(*id).code(), Code::kFailedPrecondition);
}

TEST_F(ImageBuildsTest, PastTheLineCapTheOldestLinesGo) {
  settings_.max_lines = 3;
  ImageBuilds builds(settings_);
  auto id = builds.Start("debian-12-dev", nullptr);
  ASSERT_TRUE(id.ok());
  std::vector<std::string> lines;
  for (;;) {
    auto c = builds.Follow(*id, 0, std::chrono::steady_clock::now() + std::chrono::seconds(20));
    ASSERT_TRUE(c.ok());
    if (c->ended) {
      EXPECT_EQ(c->first, 5) << "8 lines, 3 kept";
      lines = c->lines;
      break;
    }
  }
  EXPECT_EQ(lines, (std::vector<std::string>{"line-3", "line-4", "no newline at the end"}));
  EXPECT_EQ((*builds.Show(*id))["build"]["lines"], 8);
}

TEST_F(ImageBuildsTest, ShutdownInterruptsARunningBuild) {
  ImageBuilds builds(settings_);
  auto id = builds.Start("slow", Json{{"from", "debian-12"}});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(
      builds.Follow(*id, 7, std::chrono::steady_clock::now() + std::chrono::seconds(20)).ok());
  builds.Shutdown();
  EXPECT_EQ((*builds.Show(*id))["build"]["state"], "cancelled");
  EXPECT_EQ(builds.Start("other", Json{{"from", "debian-12"}}).status().code(), Code::kUnavailable);
}

}  // namespace
}  // namespace trybox::daemon
