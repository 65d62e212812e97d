#include "workspace/exclude.h"

#include <gtest/gtest.h>

namespace trybox::workspace {
namespace {

TEST(ExcludeTest, BuiltInDirectoriesAreExcludedAtAnyDepth) {
  ExcludeList l;
  for (const char* p : {"target", "node_modules", "build", ".venv", "__pycache__"}) {
    EXPECT_TRUE(l.Excluded(p, true)) << p;
    EXPECT_TRUE(l.Excluded(std::string("a/b/c/") + p, true)) << p;
    EXPECT_TRUE(l.Excluded(std::string("a/") + p + "/x/y.txt", false)) << p;
  }
  // Directory patterns do not catch files of the same name.
  EXPECT_FALSE(l.Excluded("build", false));
  EXPECT_FALSE(l.Excluded("src/build", false));
  EXPECT_FALSE(l.Excluded("src/builder/x", false));
  EXPECT_FALSE(l.Excluded("src/main.cc", false));
}

TEST(ExcludeTest, GitIsAlwaysExcluded) {
  ExcludeList l;
  EXPECT_TRUE(l.Excluded(".git", true));
  EXPECT_TRUE(l.Excluded(".git", false));
  EXPECT_TRUE(l.Excluded("sub/.git/config", false));
  EXPECT_FALSE(l.Excluded(".gitignore", false));
  // Other spellings are not silently dropped: they are skipped and named (UnstorablePath).
  EXPECT_FALSE(l.Excluded("sub/.GIT/config", false));
}

TEST(ExcludeTest, ALineThatIsNotUtf8IsRefusedWithItsNumber) {
  auto l = ExcludeList::WithProjectFile("*.log\ncaf\xe9/\n");
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("line 2: not valid UTF-8"), std::string::npos)
      << l.status().message();
  EXPECT_TRUE(ExcludeList::WithProjectFile("caf\xc3\xa9/\n").ok());
}

TEST(ExcludeTest, ProjectPatterns) {
  auto l = ExcludeList::WithProjectFile(
      "# comment\n\n*.log\ndist/\n/top-only.txt\ndocs/*.pdf\n  cache  \n");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_TRUE(l->Excluded("a.log", false));
  EXPECT_TRUE(l->Excluded("deep/er/a.log", false));
  EXPECT_TRUE(l->Excluded("x/dist/bundle.js", false));
  EXPECT_FALSE(l->Excluded("x/dist", false));  // a file named dist stays
  EXPECT_TRUE(l->Excluded("top-only.txt", false));
  EXPECT_FALSE(l->Excluded("sub/top-only.txt", false));
  EXPECT_TRUE(l->Excluded("docs/a.pdf", false));
  EXPECT_FALSE(l->Excluded("docs/sub/a.pdf", false));
  EXPECT_TRUE(l->Excluded("cache/x", false));
  EXPECT_EQ(l->project_lines().size(), 5u);
  EXPECT_TRUE(l->Excluded("node_modules/x", false));  // the built-ins stay
}

TEST(ExcludeTest, NegationIsRefusedWithItsLineNumber) {
  auto l = ExcludeList::WithProjectFile("*.log\n!keep.log\n");
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("line 2"), std::string::npos) << l.status().message();
}

TEST(ExcludeTest, PlainDirNamesAreOnlyLiteralUnanchoredDirectories) {
  auto l = ExcludeList::WithProjectFile("dist/\n*.tmp/\nsub/dir/\nfile\n");
  ASSERT_TRUE(l.ok());
  auto names = l->PlainDirNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "dist"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "node_modules"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "*.tmp"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "sub/dir"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "file"), names.end());
}

}  // namespace
}  // namespace trybox::workspace
