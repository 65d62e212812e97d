#include "image/recipe.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fd.h"
#include "util/process.h"

namespace trybox::image {
namespace {

constexpr const char* kIssueExample = R"({"from": "debian-12",
 "packages": ["jq", "nodejs"],
 "allow": ["pypi.example:443"],
 "env": {"LANG": "C.UTF-8"},
 "steps": [{"run": "npm install -g some-tool", "workdir": "/opt", "env": {"K": "V"}},
           {"copy": "./local/dir", "to": "/opt/dir"}],
 "check": ["node --version"]})";

// The error of parsing `text`, which must fail.
std::string ErrorOf(const std::string& text) {
  auto r = ParseRecipe(text);
  EXPECT_FALSE(r.ok()) << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  return r.status().message();
}

TEST(RecipeTest, ParsesTheIssueExample) {
  auto r = ParseRecipe(kIssueExample);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->from, "debian-12");
  EXPECT_EQ(r->packages, (std::vector<std::string>{"jq", "nodejs"}));
  EXPECT_EQ(r->allow, (std::vector<std::string>{"pypi.example:443"}));
  EXPECT_EQ(r->env.at("LANG"), "C.UTF-8");
  ASSERT_EQ(r->steps.size(), 2u);
  EXPECT_EQ(r->steps[0].kind, RecipeStep::Kind::kRun);
  EXPECT_EQ(r->steps[0].run, "npm install -g some-tool");
  EXPECT_EQ(r->steps[0].workdir, "/opt");
  EXPECT_EQ(r->steps[0].env.at("K"), "V");
  EXPECT_EQ(r->steps[1].kind, RecipeStep::Kind::kCopy);
  EXPECT_EQ(r->steps[1].copy, "./local/dir");
  EXPECT_EQ(r->steps[1].to, "/opt/dir");
  EXPECT_EQ(r->check, (std::vector<std::string>{"node --version"}));
}

TEST(RecipeTest, OnlyFromIsRequired) {
  auto r = ParseRecipe(R"({"from": "debian-12"})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->steps.empty());
  EXPECT_TRUE(r->packages.empty());
}

TEST(RecipeTest, CanonicalJsonRoundTrips) {
  auto r = ParseRecipe(kIssueExample);
  ASSERT_TRUE(r.ok());
  auto again = ParseRecipe(RecipeToJson(*r).dump());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(*again, *r);
}

TEST(RecipeTest, CanonicalJsonIgnoresKeyOrderAndSpacingAndEmptyDefaults) {
  auto a = ParseRecipe(R"({"from":"debian-12","check":["true"]})");
  auto b = ParseRecipe(R"({ "check" : ["true"], "packages": [], "env": {}, "from": "debian-12" })");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(RecipeToJson(*a).dump(), RecipeToJson(*b).dump());
}

TEST(RecipeTest, EveryErrorNamesItsJsonPath) {
  struct Case {
    const char* text;
    const char* want;
  };
  const Case cases[] = {
      {"not json", "recipe: not valid JSON"},
      {"[]", "$: must be an object, not an array"},
      {R"({})", "$.from: missing"},
      {R"({"from": "debian-12", "form": 1})", "$.form: unknown key"},
      {R"({"from": 12})", "$.from: must be a string, not a number"},
      {R"({"from": "../etc"})", "$.from: base image name"},
      {R"({"from": "debian-12", "packages": "jq"})", "$.packages: must be an array of strings"},
      {R"({"from": "debian-12", "packages": ["jq", 3]})", "$.packages[1]: must be a string"},
      {R"({"from": "debian-12", "packages": ["-oAPT::x=1"]})",
       "$.packages[0]: '-oAPT::x=1' is not a Debian package name"},
      {R"({"from": "debian-12", "packages": [""]})", "$.packages[0]: must not be empty"},
      {R"({"from": "debian-12", "allow": ["http://x"]})", "$.allow[0]: "},
      {R"({"from": "debian-12", "allow": {}})", "$.allow: must be an array of strings"},
      {R"({"from": "debian-12", "env": []})", "$.env: must be an object of strings"},
      {R"({"from": "debian-12", "env": {"1X": "v"}})",
       "$.env.1X: is not a valid environment variable name"},
      {R"({"from": "debian-12", "env": {"K": 1}})", "$.env.K: must be a string, not a number"},
      {R"({"from": "debian-12", "env": {"K": "a\u0000b"}})", "$.env.K: contains a NUL byte"},
      {R"({"from": "debian-12", "steps": {}})", "$.steps: must be an array of steps"},
      {R"({"from": "debian-12", "steps": ["ls"]})", "$.steps[0]: must be an object, not a string"},
      {R"({"from": "debian-12", "steps": [{}]})", "$.steps[0]: a step has exactly one of"},
      {R"({"from": "debian-12", "steps": [{"run": "a", "copy": "b"}]})",
       "$.steps[0]: a step has exactly one of"},
      {R"({"from": "debian-12", "steps": [{"run": "a"}, {"run": "a", "cwd": "/"}]})",
       "$.steps[1].cwd: unknown key"},
      {R"({"from": "debian-12", "steps": [{"run": ""}]})", "$.steps[0].run: must not be empty"},
      {R"({"from": "debian-12", "steps": [{"run": ["ls"]}]})",
       "$.steps[0].run: must be a string, not an array"},
      {R"({"from": "debian-12", "steps": [{"run": "a", "workdir": "opt"}]})",
       "$.steps[0].workdir: must be an absolute path"},
      {R"({"from": "debian-12", "steps": [{"run": "a", "env": {"A-B": "1"}}]})",
       "$.steps[0].env.A-B: is not a valid environment variable name"},
      {R"({"from": "debian-12", "steps": [{"copy": "a", "to": "/a", "mode": 1}]})",
       "$.steps[0].mode: unknown key"},
      {R"({"from": "debian-12", "steps": [{"copy": "a"}]})", "$.steps[0].to: missing"},
      {R"({"from": "debian-12", "steps": [{"copy": "a", "to": "rel"}]})",
       "$.steps[0].to: must be an absolute path"},
      {R"({"from": "debian-12", "steps": [{"copy": "/etc/passwd", "to": "/a"}]})",
       "$.steps[0].copy: must be relative to the recipe's folder"},
      {R"({"from": "debian-12", "check": "true"})", "$.check: must be an array of strings"},
      {R"({"from": "debian-12", "check": [true]})", "$.check[0]: must be a string, not a boolean"},
  };
  for (const auto& c : cases) {
    std::string err = ErrorOf(c.text);
    EXPECT_NE(err.find(c.want), std::string::npos) << c.text << " -> " << err;
  }
}

class RecipeDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/recipe-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    top_ = tmpl;
    dir_ = top_ + "/r";
    ASSERT_TRUE(MakeDirs(dir_ + "/files/sub").ok());
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/files/a.txt", "a").ok());
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/files/sub/b.txt", "b").ok());
    ASSERT_TRUE(WriteFileAtomic(top_ + "/outside.txt", "secret").ok());
  }
  void TearDown() override { (void)RemoveTree(top_); }

  Recipe WithCopy(const std::string& rel) {
    Recipe r;
    r.from = "debian-12";
    r.steps.push_back({.kind = RecipeStep::Kind::kCopy, .copy = rel, .to = "/opt/x"});
    return r;
  }

  std::string top_, dir_;
};

TEST_F(RecipeDirTest, CopySourceInsideTheFolderResolves) {
  auto p = ResolveCopySource(dir_, "./files/../files/a.txt");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->substr(p->size() - 12), "/files/a.txt");
}

TEST_F(RecipeDirTest, CopySourceEscapingTheFolderIsRefused) {
  auto p = ResolveCopySource(dir_, "../outside.txt");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kInvalidArgument);
  EXPECT_NE(p.status().message().find("escapes the recipe's folder"), std::string::npos);
}

TEST_F(RecipeDirTest, CopySourceEscapingThroughASymlinkIsRefused) {
  ASSERT_EQ(::symlink((top_ + "/outside.txt").c_str(), (dir_ + "/link").c_str()), 0);
  auto p = ResolveCopySource(dir_, "link");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("escapes the recipe's folder"), std::string::npos);
  // A directory link that leaves, then a path through it.
  ASSERT_EQ(::symlink(top_.c_str(), (dir_ + "/up").c_str()), 0);
  EXPECT_FALSE(ResolveCopySource(dir_, "up/outside.txt").ok());
}

TEST_F(RecipeDirTest, CopySourceMissingIsNotFound) {
  auto p = ResolveCopySource(dir_, "nope");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kNotFound);
}

TEST_F(RecipeDirTest, HashCoversTheRecipeAndTheCopiedContent) {
  Recipe r = WithCopy("files");
  auto h1 = RecipeSha256(r, dir_);
  ASSERT_TRUE(h1.ok()) << h1.status().message();
  EXPECT_EQ(h1->size(), 64u);
  EXPECT_EQ(*RecipeSha256(r, dir_), *h1);  // stable

  ASSERT_TRUE(WriteFileAtomic(dir_ + "/files/sub/b.txt", "B").ok());
  auto h2 = RecipeSha256(r, dir_);
  ASSERT_TRUE(h2.ok());
  EXPECT_NE(*h2, *h1);  // content

  ASSERT_EQ(::chmod((dir_ + "/files/sub/b.txt").c_str(), 0755), 0);
  auto h3 = RecipeSha256(r, dir_);
  EXPECT_NE(*h3, *h2);  // mode

  ASSERT_TRUE(WriteFileAtomic(dir_ + "/files/new", "").ok());
  auto h4 = RecipeSha256(r, dir_);
  EXPECT_NE(*h4, *h3);  // a new file

  Recipe r2 = r;
  r2.check.push_back("true");
  EXPECT_NE(*RecipeSha256(r2, dir_), *h4);  // the recipe itself
}

TEST_F(RecipeDirTest, HashRefusesACopyThatEscapes) {
  auto h = RecipeSha256(WithCopy("../outside.txt"), dir_);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), Code::kInvalidArgument);
}

TEST(RecipeTest, TheBuiltinDeveloperRecipeParses) {
  auto text = BuiltinRecipe("debian-12-dev");
  ASSERT_TRUE(text.ok());
  auto r = ParseRecipe(*text);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->from, "debian-12");
  for (const char* p : {"build-essential", "make", "git", "python3-pip", "python3-venv", "nodejs",
                        "npm", "curl", "jq"}) {
    EXPECT_NE(std::find(r->packages.begin(), r->packages.end(), p), r->packages.end()) << p;
  }
  EXPECT_FALSE(r->check.empty());
  EXPECT_FALSE(BuiltinRecipe("debian-13-nope").ok());
}

}  // namespace
}  // namespace trybox::image

namespace trybox::image {
namespace {

TEST(RecipeTest, DescribeImageReadsTheSuiteAndTheRecipesChecksThroughTheParent) {
  char tmpl[] = "/tmp/describe-image-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  ASSERT_TRUE(MakeDirs(root + "/base").ok());
  ASSERT_TRUE(MakeDirs(root + "/dev").ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/base/manifest.json", R"({"suite": "bookworm"})").ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/dev/manifest.json",
                              R"({"parent": {"name": "base", "manifest_sha256": "x"},
                                  "recipe": {"from": "base", "check": ["jq --version"]}})")
                  .ok());
  ImageDescription d = DescribeImage(root, "dev");
  EXPECT_EQ(d.distribution, "Debian 12 (bookworm)");
  EXPECT_EQ(d.checks, (std::vector<std::string>{"jq --version"}));
  EXPECT_EQ(DescribeImage(root, "missing").distribution, "Debian");
  (void)RemoveTree(root);
}

}  // namespace
}  // namespace trybox::image
