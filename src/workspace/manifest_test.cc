#include "workspace/manifest.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <random>
#include <set>

#include "util/fd.h"
#include "util/utf8.h"

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

// The files are read on several threads: every entry still has its own digests, in place.
TEST(ManifestTest, ListOfManyFilesHasEachFilesOwnDigests) {
  auto t = TempDir::Make("/tmp", "manifest-test-");
  ASSERT_TRUE(t.ok());
  std::string r = t->path();
  std::vector<std::string> paths;
  for (int i = 0; i < 500; ++i) {
    std::string p = "d" + std::to_string(i % 7) + "/f" + std::to_string(i);
    ASSERT_TRUE(MakeDirs(r + "/d" + std::to_string(i % 7)).ok());
    ASSERT_TRUE(
        WriteFileAtomic(r + "/" + p,
                        std::string(static_cast<size_t>(i) * 37, 'a' + i % 26) + std::to_string(i))
            .ok());
    paths.push_back(p);
  }
  ASSERT_EQ(::symlink("d0/f0", (r + "/ln").c_str()), 0);
  paths.push_back("ln");
  paths.push_back("gone");
  std::vector<Skipped> skipped;
  auto m = ManifestFromList(r, paths, ExcludeList(), &skipped, GitObjectHash::kSha1);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->size(), 501u);
  for (int i = 0; i < 500; ++i) {
    std::string p = "d" + std::to_string(i % 7) + "/f" + std::to_string(i);
    std::string content =
        std::string(static_cast<size_t>(i) * 37, 'a' + i % 26) + std::to_string(i);
    const Entry& e = m->at(p);
    EXPECT_EQ(e.size, content.size()) << p;
    EXPECT_EQ(e.sha256, Sha256Hex(content)) << p;
    EXPECT_EQ(e.blob, GitBlobId(content, GitObjectHash::kSha1)) << p;
  }
  EXPECT_TRUE(m->at("ln").symlink);
  EXPECT_EQ(m->at("ln").target, "d0/f0");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].path, "gone");
}

// A name of random bytes: no NUL, '/' only between non-empty components.
std::string RandomPath(std::mt19937& rng) {
  std::string p;
  int comps = 1 + static_cast<int>(rng() % 3);
  for (int c = 0; c < comps; ++c) {
    if (c) p += '/';
    int n = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < n; ++k) {
      char ch;
      do {
        ch = static_cast<char>(rng() % 2 ? rng() : 'a' + rng() % 26);
      } while (ch == '\0' || ch == '/');
      p += ch;
    }
  }
  return p;
}

TEST(ManifestJsonTest, AnyByteStringRoundTripsExactly) {
  std::mt19937 rng(99);
  Manifest m;
  for (int i = 0; i < 2000; ++i) {
    Entry e = File(RandomPath(rng), "c" + std::to_string(i), i % 2 ? 0755 : 0644);
    if (i % 3 == 0) {
      e.symlink = true;
      e.target = RandomPath(rng);
    }
    e.blob = std::string(40, 'b');
    m[e.path] = e;
  }
  m["caf\xc3\xa9"] = File("caf\xc3\xa9", "utf8");
  m["bad\xff\xfe"] = File("bad\xff\xfe", "binary");
  m["a\nb\tc\\d\"e"] = File("a\nb\tc\\d\"e", "controls");
  // Through text, as the store keeps it.
  std::string text = ManifestToJson(m).dump();
  auto back = ManifestFromJson(Json::parse(text));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == m);
  // Valid UTF-8 stays as it is; only other names carry path_b64, with a display form.
  Json j = ManifestToJson(m);
  for (const auto& x : j) {
    if (x["path"] == "caf\xc3\xa9") {
      EXPECT_FALSE(x.contains("path_b64"));
    }
    if (x.contains("path_b64") && x["path_b64"] == Base64Encode("bad\xff\xfe")) {
      EXPECT_EQ(x["path"], "bad\\xff\\xfe");
    }
  }
}

TEST(ManifestJsonTest, ChangesAndSkippedWithBinaryNamesDump) {
  Manifest before, after;
  before["old\xff"] = File("old\xff", "moved");
  before["gone\xfe"] = File("gone\xfe", "bye");
  after["new\xfd"] = File("new\xfd", "moved");
  after["caf\xc3\xa9"] = File("caf\xc3\xa9", "hi");
  Json changes = ChangesToJson(Diff(before, after));
  Json parsed = Json::parse(changes.dump());
  ASSERT_EQ(parsed.size(), 3u);
  std::set<std::string> paths;
  for (const auto& c : parsed) paths.insert(GetBytesField(c, "path").value());
  EXPECT_EQ(paths, (std::set<std::string>{"new\xfd", "gone\xfe", "caf\xc3\xa9"}));
  for (const auto& c : parsed) {
    if (c["change"] == "renamed") {
      EXPECT_EQ(GetBytesField(c, "from").value(), "old\xff");
    }
  }
  Json skipped = SkippedToJson({{"s\xff", "a socket"}, {"ok", "reason with \xfe byte"}});
  Json sp = Json::parse(skipped.dump());
  EXPECT_EQ(GetBytesField(sp[0], "path").value(), "s\xff");
  EXPECT_EQ(sp[1]["reason"], "reason with \\xfe byte");
}

TEST(ManifestDiffTest, RenamesPairInPathOrderAmongEqualContents) {
  Manifest before, after;
  for (const char* p : {"d1", "d2", "d3"}) before[p] = File(p, "same");
  for (const char* p : {"a1", "a2"}) after[p] = File(p, "same");
  auto d = Diff(before, after);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(Find(d, "a1")->old_path, "d1");
  EXPECT_EQ(Find(d, "a2")->old_path, "d2");
  EXPECT_EQ(Find(d, "d3")->kind, Change::Kind::kDeleted);
}

// Names git would drop from the commit are left out of the manifest and named, so the
// record never claims what the commit does not hold.
TEST(ManifestTest, NamesGitRefusesAreSkippedAndNamedNotClaimed) {
  auto t = TempDir::Make("/tmp", "manifest-test-");
  ASSERT_TRUE(t.ok());
  std::string r = t->path();
  for (const char* d : {"git~1", ".GIT", ".git", "ok", ".git. ", "a\nb"}) {
    ASSERT_TRUE(MakeDirs(r + "/" + d).ok());
    ASSERT_TRUE(WriteFileAtomic(r + "/" + d + "/config", "x").ok());
  }
  ASSERT_TRUE(WriteFileAtomic(r + "/ok/line\nbreak", "x").ok());
  ASSERT_EQ(::symlink("x", (r + "/ok/.gitmodules").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(r + "/ok/.gitmodules.txt", "x").ok());
  std::vector<Skipped> skipped;
  auto m = ManifestFromTree(r, ExcludeList(), &skipped);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::vector<std::string> kept;
  for (const auto& [p, e] : *m) kept.push_back(p);
  EXPECT_EQ(kept, (std::vector<std::string>{"ok/.gitmodules.txt", "ok/config"}));
  std::map<std::string, std::string> why;
  for (const auto& s : skipped) why[s.path] = s.reason;
  EXPECT_EQ(why.size(), 6u);  // .git itself is excluded, not skipped
  EXPECT_NE(why["git~1"].find("Windows"), std::string::npos);
  EXPECT_NE(why["git~1"].find("everything below it"), std::string::npos);
  EXPECT_NE(why[".git. "].find("Windows"), std::string::npos);
  EXPECT_NE(why[".GIT"].find("'.git'"), std::string::npos);
  EXPECT_NE(why["a\nb"].find("newline"), std::string::npos);
  EXPECT_NE(why["ok/line\nbreak"].find("newline"), std::string::npos);
  EXPECT_NE(why["ok/.gitmodules"].find("symbolic link"), std::string::npos);

  // The same rule on the way in.
  std::vector<Skipped> in_skipped;
  auto in = ManifestFromList(r, {"git~1/config", "ok/config", "ok/line\nbreak"}, ExcludeList(),
                             &in_skipped);
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(in->size(), 1u);
  EXPECT_EQ(in_skipped.size(), 2u);
}

}  // namespace
}  // namespace trybox::workspace
