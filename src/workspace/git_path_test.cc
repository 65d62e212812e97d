// UnstorablePath against the real git: every name of a corpus of hostile spellings is put
// into an index with `update-index --index-info` (through GitRepo, so with the hardened
// configuration), and the names git kept must be exactly the names the check accepts.
#include "workspace/git_path.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "util/fd.h"
#include "util/utf8.h"
#include "workspace/git.h"
#include "workspace/testing.h"

namespace trybox::workspace {
namespace {

class GitPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = TempDir::Make("/tmp", "ws-gitpath-test-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
    ASSERT_TRUE(MakeDirs(tmp_->path() + "/home").ok());
    auto r = testing::Sh(tmp_->path() + "/home", "git init -q '" + tmp_->path() + "/repo'");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto repo = GitRepo::Open(tmp_->path() + "/repo");
    ASSERT_TRUE(repo.ok()) << repo.status().ToString();
    repo_.emplace(std::move(*repo));
  }

  // The names of `names` that git keeps in an index, as a file or as a symlink.
  std::set<std::string> KeptByGit(const std::vector<std::string>& names, bool symlink) {
    auto blob = repo_->WriteBlob("x");
    EXPECT_TRUE(blob.ok());
    std::string input;
    for (size_t i = 0; i < names.size(); ++i) {
      // A directory of its own per name, so that no two names conflict as file and directory.
      input += std::string(symlink ? "120000 " : "100644 ") + *blob + "\t" + "t" +
               std::to_string(i) + "/" + names[i];
      input.push_back('\0');
    }
    std::string index = tmp_->path() + (symlink ? "/index-links" : "/index-files");
    EXPECT_TRUE(repo_->Run({"update-index", "-z", "--index-info"}, input, index).ok());
    auto listed = repo_->Run({"ls-files", "-z"}, {}, index);
    EXPECT_TRUE(listed.ok());
    std::set<std::string> kept;
    for (const auto& p : SplitRecords(*listed, '\0')) {
      size_t slash = p.find('/');
      kept.insert(names.at(std::stoul(p.substr(1, slash - 1))));
    }
    return kept;
  }

  std::optional<TempDir> tmp_;
  std::optional<GitRepo> repo_;
};

std::vector<std::string> Corpus() {
  std::vector<std::string> names = {
      "ok",
      "a/b/c",
      ".git",
      ".git/config",
      ".GIT/config",
      ".GiT",
      "git~1/config",
      "GIT~1",
      "git~2/config",
      ".git. /config",
      ".git /x",
      ".git.",
      ".git...  ",
      ".git:stream",
      ".git::$INDEX_ALLOCATION/x",
      "a/.git/x",
      "a\\.git/x",
      "a\\git~1",
      "\\.git/x",
      ".gitignore",
      ".gitmodules",
      ".GITMODULES",
      "gitmod~1",
      "gitmod~4",
      "gitmod~5",
      "gi7eba~1",
      "gi7eb~12",
      "GI7EBA~9",
      ".gitmodules .",
      ".gitmodules:x",
      "x/.gitmodules",
      ".gitmodules/x",
      ".",
      "..",
      "a/./b",
      "a/../b",
      "...",
      "..a",
      "a//b",
      "a/",
      ".g\xe2\x80\x8cit/x",
      ".git\xe2\x80\x8d",
      "\xef\xbb\xbf.git",
      ".\xe2\x80\xaeGIT",
      ".git\xff/x",
      ".gi\xfft",
      ".git\xef\xbf\xbf",
      "\xe2\x80\x8c.gitmodules",
      ".gitmodules\xe2\x80\x8f",
      "caf\xc3\xa9",
      "\xff\xfe",
      "tab\there",
      "cr\r",
      "a\\b",
      "a:b",
  };
  // Random spellings built from the pieces those rules look at.
  const std::vector<std::string> pieces = {
      ".",      "git",    "GIT",          "Git",      "~1",
      "~2",     " ",      "..",           ":",        "\\",
      "/",      "a",      "modules",      "MODULES",  "1",
      "gi7eba", "gitmod", "\xe2\x80\x8c", "\xff",     "\xef\xbb\xbf",
      "9",      "~",      "\xef\xbf\xbf", "\xc0\xae", "x"};
  std::mt19937 rng(1234);
  std::set<std::string> seen(names.begin(), names.end());
  while (names.size() < 3000) {
    std::string s;
    int n = 1 + static_cast<int>(rng() % 5);
    for (int k = 0; k < n; ++k) s += pieces[rng() % pieces.size()];
    if (seen.insert(s).second) names.push_back(s);
  }
  return names;
}

TEST_F(GitPathTest, AcceptsExactlyWhatGitKeepsAsFilesAndAsSymlinks) {
  std::vector<std::string> names = Corpus();
  for (bool symlink : {false, true}) {
    std::set<std::string> kept = KeptByGit(names, symlink);
    size_t refused = 0;
    for (const auto& n : names) {
      PathRefusal r = GitPathRefusal(n, symlink);
      refused += !r.ok();
      EXPECT_EQ(r.ok(), kept.count(n) == 1) << (symlink ? "symlink " : "file ") << JsonSafe(n)
                                            << ": trybox says '" << r.reason << "'";
    }
    // The corpus exercises both outcomes in quantity.
    EXPECT_GT(refused, 200u);
    EXPECT_GT(names.size() - refused, 200u);
  }
}

TEST_F(GitPathTest, BuildTreeFailsRatherThanDropAPathGitRefuses) {
  auto blob = repo_->WriteBlob("x");
  ASSERT_TRUE(blob.ok());
  auto tree = repo_->BuildTree(std::nullopt,
                               {{"100644", *blob, "ok.txt"}, {"100644", *blob, "git~1/config"}});
  ASSERT_FALSE(tree.ok());
  EXPECT_NE(tree.status().message().find("git~1/config"), std::string::npos)
      << tree.status().message();
}

TEST_F(GitPathTest, BlobsOfNamesWithCarriageReturnsQuotesAndBackslashesAreTheirOwn) {
  std::string dir = tmp_->path() + "/files";
  ASSERT_TRUE(MakeDirs(dir).ok());
  std::vector<std::string> names = {"name",  "name\r",  "\"q",  "back\\slash",
                                    "nl\nx", "bad\xff", "tab\t"};
  std::vector<std::string> paths;
  for (const auto& n : names) {
    ASSERT_TRUE(WriteFileAtomic(dir + "/" + n, "content of " + n).ok());
    paths.push_back(dir + "/" + n);
  }
  auto ids = repo_->WriteBlobsFromFiles(paths);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  ASSERT_EQ(ids->size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    auto want = repo_->WriteBlob("content of " + names[i]);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ((*ids)[i], *want) << JsonSafe(names[i]);
  }
}

TEST(GitPathRules, ReasonsNameTheSpellingAndTheComponent) {
  EXPECT_TRUE(UnstorablePath("src/main.c", false).ok());
  EXPECT_TRUE(UnstorablePath(".gitmodules", false).ok());
  PathRefusal r = UnstorablePath("git~1/config", false);
  EXPECT_NE(r.reason.find("Windows"), std::string::npos);
  EXPECT_EQ(r.prefix, 5u);
  r = UnstorablePath("a/.g\xe2\x80\x8cit/hooks/x", false);
  EXPECT_NE(r.reason.find("macOS"), std::string::npos);
  EXPECT_EQ(r.prefix, 9u);
  EXPECT_NE(UnstorablePath(".gitmodules", true).reason.find("symbolic link"), std::string::npos);
  r = UnstorablePath("dir/a\nb/c", false);
  EXPECT_NE(r.reason.find("newline"), std::string::npos);
  EXPECT_EQ(r.prefix, 7u);
  EXPECT_NE(UnstorablePath(".GIT/config", false).reason.find("'.git'"), std::string::npos);
}

}  // namespace
}  // namespace trybox::workspace
