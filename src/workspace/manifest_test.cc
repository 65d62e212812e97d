#include "workspace/manifest.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fd.h"

namespace trybox::workspace {
namespace {

Entry File(const std::string& path, const std::string& content, uint32_t mode = 0644) {
  Entry e;
  e.path = path;
  e.mode = mode;
  e.size = content.size();
  e.sha256 = "sha-" + content;
  return e;
}

const Change* Find(const std::vector<Change>& v, const std::string& path) {
  for (const auto& c : v) {
    if (c.path == path) return &c;
  }
  return nullptr;
}

TEST(ManifestDiffTest, EveryKindOfChange) {
  Manifest before, after;
  for (auto e : {File("same", "1"), File("mod", "old"), File("gone", "bye"),
                 File("chmod", "x", 0644), File("old/name", "moved content")}) {
    before[e.path] = e;
  }
  for (auto e : {File("same", "1"), File("mod", "newer"), File("chmod", "x", 0755),
                 File("new/name", "moved content"), File("fresh", "hello")}) {
    after[e.path] = e;
  }
  auto d = Diff(before, after);
  ASSERT_EQ(d.size(), 5u);
  ASSERT_NE(Find(d, "mod"), nullptr);
  EXPECT_EQ(Find(d, "mod")->kind, Change::Kind::kModified);
  EXPECT_EQ(Find(d, "mod")->old_size, 3u);
  EXPECT_EQ(Find(d, "mod")->new_size, 5u);
  EXPECT_EQ(Find(d, "gone")->kind, Change::Kind::kDeleted);
  EXPECT_EQ(Find(d, "chmod")->kind, Change::Kind::kModeChanged);
  EXPECT_EQ(Find(d, "chmod")->new_mode, 0755u);
  EXPECT_EQ(Find(d, "new/name")->kind, Change::Kind::kRenamed);
  EXPECT_EQ(Find(d, "new/name")->old_path, "old/name");
  EXPECT_EQ(Find(d, "fresh")->kind, Change::Kind::kAdded);
  EXPECT_EQ(Find(d, "same"), nullptr);
}

TEST(ManifestDiffTest, RenamesPairOneToOne) {
  Manifest before, after;
  before["a"] = File("a", "dup");
  after["b"] = File("b", "dup");
  after["c"] = File("c", "dup");
  auto d = Diff(before, after);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, Change::Kind::kRenamed);
  EXPECT_EQ(d[0].old_path, "a");
  EXPECT_EQ(d[1].kind, Change::Kind::kAdded);
}

TEST(ManifestDiffTest, FileBecomingSymlinkIsModified) {
  Manifest before, after;
  before["x"] = File("x", "t");
  Entry l = File("x", "t");
  l.symlink = true;
  after["x"] = l;
  auto d = Diff(before, after);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, Change::Kind::kModified);
}

TEST(ManifestTest, TreeWalkNeverFollowsLinksAndHonoursExcludes) {
  auto t = TempDir::Make("/tmp", "manifest-test-");
  ASSERT_TRUE(t.ok());
  std::string r = t->path();
  ASSERT_TRUE(MakeDirs(r + "/src/node_modules/pkg").ok());
  ASSERT_TRUE(WriteFileAtomic(r + "/src/a.txt", "hello").ok());
  ASSERT_TRUE(WriteFileAtomic(r + "/src/node_modules/pkg/i.js", "x").ok());
  ASSERT_EQ(::symlink("/etc/passwd", (r + "/pw").c_str()), 0);
  ASSERT_EQ(::symlink("/etc", (r + "/etcdir").c_str()), 0);
  ASSERT_EQ(::mkfifo((r + "/fifo").c_str(), 0644), 0);
  auto m = ManifestFromTree(r, ExcludeList());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ(m->at("src/a.txt").size, 5u);
  EXPECT_TRUE(m->at("pw").symlink);
  EXPECT_EQ(m->at("pw").target, "/etc/passwd");
  EXPECT_TRUE(m->at("etcdir").symlink);
  auto j = ManifestToJson(*m);
  auto back = ManifestFromJson(j);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(Diff(*m, *back).empty());
}

TEST(ManifestTest, ListReportsMissingAndSpecialPaths) {
  auto t = TempDir::Make("/tmp", "manifest-test-");
  ASSERT_TRUE(t.ok());
  std::string r = t->path();
  ASSERT_TRUE(WriteFileAtomic(r + "/a", "1").ok());
  ASSERT_TRUE(MakeDirs(r + "/sub").ok());
  std::vector<Skipped> skipped;
  auto m = ManifestFromList(r, {"a", "missing", "sub", "build/x"}, ExcludeList(), &skipped);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size(), 1u);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0].path, "missing");
  EXPECT_EQ(skipped[1].path, "sub");
}

}  // namespace
}  // namespace trybox::workspace
