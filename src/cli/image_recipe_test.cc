#include "cli/image_recipe.h"

#include <gtest/gtest.h>

#include "agent/tools.h"
#include "cli/agent_settings.h"
#include "util/fd.h"

namespace trybox::cli {
namespace {

TEST(ImageRecipeTest, TheManifestsParentAndRecipeHashDecideTheNoOp) {
  auto m = nlohmann::json::parse(R"({"format": 2, "recipe_sha256": "ab",
      "parent": {"name": "debian-12", "manifest_sha256": "cd"}})");
  RecordedBuild r = RecordedBuildOf(m);
  EXPECT_EQ(r.recipe_sha256, "ab");
  EXPECT_EQ(r.base_manifest_sha256, "cd");
  // A base image (format 1) records neither: it is never "unchanged" for a recipe.
  RecordedBuild none = RecordedBuildOf(nlohmann::json::parse(R"({"format": 1})"));
  EXPECT_EQ(none.recipe_sha256, "");
  EXPECT_EQ(none.base_manifest_sha256, "");
}

TEST(ImageRecipeTest, OnlyAFileOrABuiltinNameUsesARecipe) {
  EXPECT_TRUE(UsesRecipe("debian-12-dev", ""));
  EXPECT_TRUE(UsesRecipe("mine", "/tmp/r.json"));
  EXPECT_FALSE(UsesRecipe("debian-12", ""));
}

TEST(ImageRecipeTest, AgentImageIsTheFlagThenAgentJsonThenTheDeveloperImage) {
  char tmpl[] = "/tmp/agent-image-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  Paths paths;
  paths.config = tmpl;
  EXPECT_EQ(*ResolveAgentImage(paths, ""), "debian-12-dev");
  EXPECT_EQ(*ResolveAgentImage(paths, "debian-12"), "debian-12");
  ASSERT_TRUE(WriteFileAtomic(paths.config + "/agent.json", R"({"image": "mine"})").ok());
  EXPECT_EQ(*ResolveAgentImage(paths, ""), "mine");
  EXPECT_EQ(*ResolveAgentImage(paths, "debian-12"), "debian-12");
  ASSERT_TRUE(WriteFileAtomic(paths.config + "/agent.json", R"({"image": "../x"})").ok());
  EXPECT_FALSE(ResolveAgentImage(paths, "").ok());
  ASSERT_TRUE(WriteFileAtomic(paths.config + "/agent.json", R"({"image": 3})").ok());
  EXPECT_FALSE(ResolveAgentImage(paths, "").ok());
  (void)RemoveTree(tmpl);
}

TEST(ImageRecipeTest, ThePromptNamesTheImageItsDistributionAndItsChecks) {
  std::string p = agent::SystemPrompt({.name = "debian-12-dev",
                                       .distribution = "Debian 12 (bookworm)",
                                       .checks = {"make --version", "node -v"}});
  EXPECT_NE(p.find("Debian 12 (bookworm), image debian-12-dev"), std::string::npos) << p;
  EXPECT_NE(p.find("make --version; node -v"), std::string::npos) << p;
  EXPECT_NE(agent::SystemPrompt().find("(Debian)"), std::string::npos);
}

}  // namespace
}  // namespace trybox::cli
