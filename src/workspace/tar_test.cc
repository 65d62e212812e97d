#include "workspace/tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <map>
#include <ostream>
#include <set>

#include "util/fd.h"

namespace trybox::workspace {

// For gtest's messages: an entry as its fields, not its bytes.
void PrintTo(const Entry& e, std::ostream* os) {
  *os << "{" << e.path << (e.symlink ? " -> " + e.target : "") << " mode " << std::oct << e.mode
      << std::dec << " size " << e.size << " sha256 " << e.sha256.substr(0, 12) << "}";
}

namespace {

// Builds a tar in memory, entry by entry, the way a hostile guest could.
class TarBuilder {
 public:
  TarBuilder() : a_(archive_write_new()) {
    archive_write_set_format_pax_restricted(a_);
    archive_write_open(a_, &out_, nullptr, &TarBuilder::Write, nullptr);
  }
  ~TarBuilder() { archive_write_free(a_); }
  TarBuilder& Add(const std::string& path, mode_t type, const std::string& data = "",
                  const std::string& link = "", bool hard = false, mode_t perm = 0644) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, path.c_str());
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, perm);
    if (type == AE_IFREG && !hard) archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
    if (type == AE_IFLNK) archive_entry_set_symlink(e, link.c_str());
    if (hard) archive_entry_set_hardlink(e, link.c_str());
    if (type == AE_IFCHR) archive_entry_set_rdev(e, makedev(1, 3));
    archive_write_header(a_, e);
    if (!data.empty()) archive_write_data(a_, data.data(), data.size());
    archive_entry_free(e);
    return *this;
  }
  // A sparse file: `size` bytes long, holding `data` at `offset` and holes elsewhere.
  TarBuilder& AddSparse(const std::string& path, int64_t size, int64_t offset,
                        const std::string& data) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, path.c_str());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, size);
    archive_entry_sparse_add_entry(e, offset, static_cast<la_int64_t>(data.size()));
    archive_write_header(a_, e);
    archive_write_data(a_, data.data(), data.size());
    archive_entry_free(e);
    return *this;
  }
  std::string Finish() {
    archive_write_close(a_);
    return out_;
  }

 private:
  static la_ssize_t Write(archive*, void* ud, const void* buf, size_t len) {
    static_cast<std::string*>(ud)->append(static_cast<const char*>(buf), len);
    return static_cast<la_ssize_t>(len);
  }
  archive* a_;
  std::string out_;
};

std::function<Result<std::string>()> Chunks(std::string data) {
  auto done = std::make_shared<bool>(false);
  auto d = std::make_shared<std::string>(std::move(data));
  return [done, d]() -> Result<std::string> {
    if (*done) return std::string();
    *done = true;
    return *d;
  };
}

bool Exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

std::string ReasonFor(const ExtractReport& r, const std::string& path) {
  for (const auto& s : r.skipped) {
    if (s.path == path) return s.reason;
  }
  return "";
}

class TarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = TempDir::Make("/tmp", "ws-tar-test-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
    dest_ = tmp_->path() + "/dest/inner";
    outside_ = tmp_->path() + "/dest";
  }
  std::optional<TempDir> tmp_;
  std::string dest_, outside_;
};

TEST_F(TarTest, EscapesAreSkippedAndNamedNeverWritten) {
  std::string tar = TarBuilder()
                        .Add("ok.txt", AE_IFREG, "fine")
                        .Add("../escape.txt", AE_IFREG, "evil")
                        .Add("a/../../escape2.txt", AE_IFREG, "evil")
                        .Add(tmp_->path() + "/abs.txt", AE_IFREG, "evil")
                        .Add("link", AE_IFLNK, "", outside_)
                        .Add("link/through.txt", AE_IFREG, "evil")
                        .Add("flink", AE_IFLNK, "", outside_ + "/victim.txt")
                        .Add("flink", AE_IFREG, "evil")
                        .Add("hard", AE_IFREG, "", "/etc/passwd", true)
                        .Add("hard2", AE_IFREG, "", "../escape.txt", true)
                        .Add("dev", AE_IFCHR)
                        .Add("fifo", AE_IFIFO)
                        .Add("node_modules/x.js", AE_IFREG, "dep")
                        .Finish();
  ExtractReport r;
  ExcludeList ex;
  ExtractOptions o;
  o.excludes = &ex;
  Status st = ExtractTar(Chunks(tar), dest_, o, &r);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(Exists(dest_ + "/ok.txt"));
  EXPECT_FALSE(Exists(outside_ + "/escape.txt"));
  EXPECT_FALSE(Exists(tmp_->path() + "/escape2.txt"));
  EXPECT_FALSE(Exists(tmp_->path() + "/abs.txt"));
  EXPECT_FALSE(Exists(outside_ + "/through.txt"));
  EXPECT_FALSE(Exists(outside_ + "/victim.txt"));  // a file over a symlink replaces the link
  EXPECT_FALSE(Exists(dest_ + "/dev"));
  EXPECT_FALSE(Exists(dest_ + "/fifo"));
  EXPECT_FALSE(Exists(dest_ + "/node_modules"));
  EXPECT_TRUE(Exists(dest_ + "/link"));  // the symlink itself is content
  EXPECT_EQ(ReasonFor(r, "../escape.txt"), "a '..' component");
  EXPECT_EQ(ReasonFor(r, "a/../../escape2.txt"), "a '..' component");
  EXPECT_EQ(ReasonFor(r, tmp_->path() + "/abs.txt"), "an absolute path");
  EXPECT_NE(ReasonFor(r, "link/through.txt").find("refused"), std::string::npos);
  EXPECT_EQ(ReasonFor(r, "hard"), "a hard link to an absolute path");
  EXPECT_EQ(ReasonFor(r, "hard2"), "a hard link to a '..' component");
  EXPECT_EQ(ReasonFor(r, "dev"), "a character device");
  EXPECT_EQ(ReasonFor(r, "fifo"), "a fifo");
  EXPECT_EQ(r.excluded, 1u);
  EXPECT_EQ(r.files, 2u);  // ok.txt, and flink as a plain file
}

TEST_F(TarTest, SetUidAndSetGidBitsAreDropped) {
  archive* a = archive_write_new();
  std::string tar;
  archive_write_set_format_pax_restricted(a);
  archive_write_open(
      a, &tar, nullptr,
      [](archive*, void* ud, const void* buf, size_t len) -> la_ssize_t {
        static_cast<std::string*>(ud)->append(static_cast<const char*>(buf), len);
        return static_cast<la_ssize_t>(len);
      },
      nullptr);
  archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, "suid");
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 06755);
  archive_entry_set_size(e, 1);
  archive_write_header(a, e);
  archive_write_data(a, "x", 1);
  archive_entry_free(e);
  archive_write_close(a);
  archive_write_free(a);
  ExtractReport r;
  ASSERT_TRUE(ExtractTar(Chunks(tar), dest_, {}, &r).ok());
  struct stat st;
  ASSERT_EQ(::stat((dest_ + "/suid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
}

TEST_F(TarTest, QuotaStopsExtraction) {
  std::string tar = TarBuilder()
                        .Add("a", AE_IFREG, std::string(600, 'a'))
                        .Add("b", AE_IFREG, std::string(600, 'b'))
                        .Finish();
  ExtractReport r;
  ExtractOptions o;
  o.quota_bytes = 1000;
  Status st = ExtractTar(Chunks(tar), dest_, o, &r);
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("1000"), std::string::npos);
}

// A full host disk was reported as libarchive's "Write failed".
TEST_F(TarTest, AFullDiskIsNamedNoSpace) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  std::string mnt = tmp_->path() + "/small";
  ASSERT_TRUE(MakeDirs(mnt, 0700).ok());
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << ErrnoError("mount").message();
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  std::string tar = TarBuilder()
                        .Add("a", AE_IFREG, std::string(200 << 10, 'a'))
                        .Add("b", AE_IFREG, std::string(200 << 10, 'b'))
                        .Finish();
  ExtractReport r;
  Status st = ExtractTar(Chunks(tar), mnt + "/dest", {}, &r);
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  EXPECT_EQ(st.message().rfind("no_space: ", 0), 0u) << st.message();
  EXPECT_EQ(st.message().find(mnt), std::string::npos) << st.message();
}

TEST_F(TarTest, ManifestRoundTripsThroughTar) {
  std::string src = tmp_->path() + "/src";
  ASSERT_TRUE(MakeDirs(src + "/d/e").ok());
  ASSERT_TRUE(WriteFileAtomic(src + "/d/e/f.txt", "content", 0755).ok());
  ASSERT_TRUE(WriteFileAtomic(src + "/top", std::string(300000, 'z')).ok());
  ASSERT_EQ(::symlink("d/e/f.txt", (src + "/ln").c_str()), 0);
  auto m = ManifestFromTree(src, ExcludeList());
  ASSERT_TRUE(m.ok());
  std::string tar;
  ASSERT_TRUE(WriteTar(src, *m, [&](std::string_view d) {
                tar.append(d);
                return Status::Ok();
              }).ok());
  ExtractReport r;
  ASSERT_TRUE(ExtractTar(Chunks(tar), dest_, {}, &r).ok());
  auto back = ManifestFromTree(dest_, ExcludeList());
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(Diff(*m, *back).empty());
  EXPECT_EQ(back->size(), 3u);
  EXPECT_EQ(back->at("d/e/f.txt").mode, 0755u);
}

// Every entry below `root` (itself included) whose mode has any of `bits`, symlinks aside.
std::vector<std::string> WithBits(const std::string& root, mode_t bits) {
  std::vector<std::string> out;
  std::vector<std::string> todo = {root};
  while (!todo.empty()) {
    std::string p = todo.back();
    todo.pop_back();
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || S_ISLNK(st.st_mode)) continue;
    if (st.st_mode & bits) out.push_back(p);
    if (!S_ISDIR(st.st_mode)) continue;
    DIR* d = ::opendir(p.c_str());
    if (!d) continue;
    while (dirent* de = ::readdir(d)) {
      std::string n = de->d_name;
      if (n != "." && n != "..") todo.push_back(p + "/" + n);
    }
    ::closedir(d);
  }
  return out;
}

TEST_F(TarTest, NothingIsWrittenSetUidSetGidOrStickyEvenUnderASetGidParent) {
  // A set-gid parent makes new directories set-gid by inheritance, whatever the tar says.
  ASSERT_TRUE(MakeDirs(outside_).ok());
  ASSERT_EQ(::chmod(outside_.c_str(), 02775), 0);
  std::string tar = TarBuilder()
                        .Add("d", AE_IFDIR, "", "", false, 07777)
                        .Add("d/suid", AE_IFREG, "x", "", false, 06755)
                        .Add("d/sub", AE_IFDIR, "", "", false, 02755)
                        .Add("d/sub/f", AE_IFREG, "y", "", false, 04700)
                        .Add("sticky", AE_IFDIR, "", "", false, 01777)
                        .Add("implied/deep/f", AE_IFREG, "z", "", false, 02644)
                        .Add("hard", AE_IFREG, "", "d/suid", true, 06755)
                        .Finish();
  ExtractReport r;
  Status st = ExtractTar(Chunks(tar), dest_, {}, &r);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(Exists(dest_ + "/d/sub/f"));
  EXPECT_TRUE(Exists(dest_ + "/implied/deep/f"));
  EXPECT_EQ(WithBits(dest_, S_ISUID | S_ISGID | S_ISVTX), std::vector<std::string>());
  struct stat sb;
  ASSERT_EQ(::stat((dest_ + "/d/suid").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 0755u);
}

// In C (the daemon's locale) libarchive cannot translate a non-ASCII name to the UTF-8 a pax
// header wants; the names must still travel as their exact bytes both ways.
TEST_F(TarTest, NamesThatAreNotAsciiOrNotUtf8RoundTripExactly) {
  std::string src = tmp_->path() + "/src";
  ASSERT_TRUE(MakeDirs(src + "/d\xe9j\xe0").ok());
  for (std::string n : {"caf\xc3\xa9", "bad\xff\xfe", "d\xe9j\xe0/x", "cr\r", "tab\there"}) {
    ASSERT_TRUE(WriteFileAtomic(src + "/" + n, "content of " + n).ok());
  }
  ASSERT_EQ(::symlink("target\xfd", (src + "/link\xfc").c_str()), 0);
  auto m = ManifestFromTree(src, ExcludeList());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->size(), 6u);
  std::string tar;
  Status w = WriteTar(src, *m, [&](std::string_view d) {
    tar.append(d);
    return Status::Ok();
  });
  ASSERT_TRUE(w.ok()) << w.ToString();
  ExtractReport r;
  ExtractOptions o;
  o.commit_paths_only = true;
  ASSERT_TRUE(ExtractTar(Chunks(tar), dest_, o, &r).ok());
  EXPECT_TRUE(r.skipped.empty());
  auto back = ManifestFromTree(dest_, ExcludeList());
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == *m);
}

TEST_F(TarTest, EntryQuotaStopsExtractionAndNamesTheCount) {
  TarBuilder b;
  b.Add("dir", AE_IFDIR);
  for (int i = 0; i < 20; ++i) b.Add("dir/f" + std::to_string(i), AE_IFREG, "x");
  ExtractReport r;
  ExtractOptions o;
  o.quota_entries = 10;
  Status st = ExtractTar(Chunks(b.Finish()), dest_, o, &r);
  ASSERT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("quota of 10 entries"), std::string::npos) << st.message();
  EXPECT_EQ(r.entries, 11u);
  EXPECT_FALSE(Exists(dest_ + "/dir/f10"));  // stopped early
  // Skipped entries count too: a flood of fifos is not free.
  TarBuilder fifos;
  for (int i = 0; i < 20; ++i) fifos.Add("p" + std::to_string(i), AE_IFIFO);
  ExtractReport r2;
  st = ExtractTar(Chunks(fifos.Finish()), tmp_->path() + "/dest2", o, &r2);
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
}

TEST_F(TarTest, SparseFileCountsAtItsFullSizeAgainstTheQuota) {
  // 64 MiB long, 5 bytes of data: the host would hash (and git store) all 64 MiB.
  std::string tar = TarBuilder().AddSparse("sparse", 64 << 20, 1 << 20, "hello").Finish();
  ExtractReport r;
  ExtractOptions o;
  o.quota_bytes = 1 << 20;
  Status st = ExtractTar(Chunks(tar), dest_, o, &r);
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  EXPECT_GT(r.bytes, o.quota_bytes);
}

TEST_F(TarTest, SkippedListIsCappedAndTheRestCounted) {
  TarBuilder b;
  for (size_t i = 0; i < kMaxListedSkipped + 500; ++i) b.Add("p" + std::to_string(i), AE_IFIFO);
  std::string tar = b.Finish();
  ExtractReport r;
  ExcludeList ex;
  ASSERT_TRUE(ExtractTar(Chunks(tar), dest_, ExtractOptions::ForCollect(&ex, 0, 0), &r).ok());
  EXPECT_EQ(r.skipped.size(), kMaxListedSkipped);
  EXPECT_EQ(r.skipped_unlisted, 500u);
  // Without a cap (trybox cp), every one is listed.
  ExtractReport all;
  ASSERT_TRUE(ExtractTar(Chunks(tar), tmp_->path() + "/all", {}, &all).ok());
  EXPECT_EQ(all.skipped.size(), kMaxListedSkipped + 500);
}

TEST_F(TarTest, CommitPathsOnlySkipsWhatGitRefusesNamingEachPlaceOnce) {
  std::string tar = TarBuilder()
                        .Add("ok", AE_IFREG, "fine")
                        .Add("git~1", AE_IFDIR)
                        .Add("git~1/config", AE_IFREG, "[core]")
                        .Add("git~1/hooks/post-checkout", AE_IFREG, "#!/bin/sh")
                        .Add(".GIT/config", AE_IFREG, "[core]")
                        .Add(".git. /config", AE_IFREG, "[core]")
                        .Add("a\nb", AE_IFREG, "newline")
                        .Add("x/.gitmodules", AE_IFLNK, "", "/etc/passwd")
                        .Add(".git/config", AE_IFREG, "excluded, not skipped")
                        .Finish();
  ExtractReport r;
  ExcludeList ex;
  ASSERT_TRUE(ExtractTar(Chunks(tar), dest_, ExtractOptions::ForCollect(&ex, 0, 0), &r).ok());
  std::map<std::string, std::string> why;
  for (const auto& s : r.skipped) why[s.path] = s.reason;
  EXPECT_EQ(why.size(), 5u);
  EXPECT_NE(why["git~1"].find("Windows"), std::string::npos);
  EXPECT_NE(why["git~1"].find("everything below it"), std::string::npos);
  EXPECT_NE(why[".GIT"].find("'.git'"), std::string::npos);
  EXPECT_NE(why[".git. "].find("Windows"), std::string::npos);
  EXPECT_NE(why["a\nb"].find("newline"), std::string::npos);
  EXPECT_NE(why["x/.gitmodules"].find("symbolic link"), std::string::npos);
  EXPECT_EQ(r.excluded, 1u);
  EXPECT_TRUE(Exists(dest_ + "/ok"));
  for (const char* p : {"git~1", ".GIT", ".git. ", "a\nb", "x/.gitmodules", ".git"}) {
    EXPECT_FALSE(Exists(dest_ + "/" + p)) << p;
  }
  // Without the option (trybox cp), those are ordinary names.
  ExtractReport plain;
  ASSERT_TRUE(ExtractTar(Chunks(tar), tmp_->path() + "/plain", {}, &plain).ok());
  EXPECT_TRUE(Exists(tmp_->path() + "/plain/git~1/config"));
}

TEST_F(TarTest, ReasonsNeverNameTheHostDirectory) {
  std::string tar = TarBuilder()
                        .Add("link", AE_IFLNK, "", "/")
                        .Add("link/through.txt", AE_IFREG, "evil")
                        .Add("h", AE_IFREG, "", "missing-target", true)
                        .Finish();
  ExtractReport r;
  ASSERT_TRUE(ExtractTar(Chunks(tar), dest_, {}, &r).ok());
  ASSERT_EQ(r.skipped.size(), 2u);
  for (const auto& s : r.skipped) {
    EXPECT_EQ(s.reason.find(tmp_->path()), std::string::npos) << s.reason;
    EXPECT_NE(s.reason.find("refused"), std::string::npos) << s.reason;
  }
}

TEST_F(TarTest, PathLongerThanTheHostTakesIsSkippedNotFatal) {
  std::string deep;
  for (int i = 0; i < 25; ++i) deep += std::string(200, static_cast<char>('a' + i)) + "/";
  std::string tar =
      TarBuilder().Add(deep + "f", AE_IFREG, "far").Add("near", AE_IFREG, "x").Finish();
  ExtractReport r;
  ExtractOptions o;
  o.commit_paths_only = true;
  ASSERT_TRUE(ExtractTar(Chunks(tar), dest_, o, &r).ok());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_NE(r.skipped[0].reason.find("longer than"), std::string::npos) << r.skipped[0].reason;
  auto m = ManifestFromTree(dest_, ExcludeList());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->size(), 1u);
}

// The manifest of what a tar brings back, and the paths it skipped: extracted whole, or with
// unchanged files left unwritten (a collect without --into).
struct Outcome {
  Manifest manifest;
  std::set<std::string> skipped;
  Manifest unwritten;
};

Outcome ExtractAndList(const std::string& tar, const std::string& dest, const Manifest* before) {
  Outcome out;
  ExtractReport r;
  ExtractOptions o;
  o.unchanged_from = before;
  Status st = ExtractTar(Chunks(tar), dest, o, &r);
  EXPECT_TRUE(st.ok()) << st.ToString();
  auto m = ManifestFromTree(dest, ExcludeList());
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (m.ok()) out.manifest = *m;
  for (const auto& [p, e] : r.unwritten) {
    EXPECT_FALSE(Exists(dest + "/" + p)) << p << " was left unwritten but is there";
    EXPECT_TRUE(out.manifest.emplace(p, e).second) << p << " is both written and unwritten";
  }
  for (const auto& s : r.skipped) out.skipped.insert(s.path);
  out.unwritten = r.unwritten;
  return out;
}

// Extracts `back` whole and again with the files of `before` it holds unchanged left
// unwritten: the two trees must list the same. Returns the second.
Outcome ExpectTheSameTreeEitherWay(const std::string& back, const Manifest& before,
                                   const std::string& tmp) {
  Outcome whole = ExtractAndList(back, tmp + "/whole", nullptr);
  Outcome lean = ExtractAndList(back, tmp + "/lean", &before);
  EXPECT_EQ(whole.manifest, lean.manifest);
  EXPECT_EQ(whole.skipped, lean.skipped);
  EXPECT_TRUE(whole.unwritten.empty());
  return lean;
}

// What went in: every file of `tar` as extraction lists it, each with a blob id.
Manifest BeforeOf(const std::string& tar, const std::string& dest) {
  ExtractReport r;
  EXPECT_TRUE(ExtractTar(Chunks(tar), dest, {}, &r).ok());
  auto m = ManifestFromTree(dest, ExcludeList());
  EXPECT_TRUE(m.ok());
  Manifest out = m.ok() ? *m : Manifest();
  for (auto& [p, e] : out) e.blob = "blob-of-" + p;
  return out;
}

TEST_F(TarTest, UnchangedFilesAreLeftUnwrittenAndTheTreeListsTheSame) {
  const std::string big(3 << 20, 'q');
  std::string in = TarBuilder()
                       .Add("same.txt", AE_IFREG, "unchanged")
                       .Add("d/e/deep.txt", AE_IFREG, "deep")
                       .Add("edited.txt", AE_IFREG, "aaaa")
                       .Add("grown.txt", AE_IFREG, "short")
                       .Add("moded.sh", AE_IFREG, "#!/bin/sh\n")
                       .Add("big.bin", AE_IFREG, big)
                       .Add("gone.txt", AE_IFREG, "deleted in the VM")
                       .Add("ln", AE_IFLNK, "", "same.txt")
                       .Finish();
  Manifest before = BeforeOf(in, tmp_->path() + "/before");
  ASSERT_EQ(before.size(), 8u);
  std::string back = TarBuilder()
                         .Add("d", AE_IFDIR)
                         .Add("d/e", AE_IFDIR)
                         .Add("same.txt", AE_IFREG, "unchanged")
                         .Add("d/e/deep.txt", AE_IFREG, "deep")
                         .Add("edited.txt", AE_IFREG, "bbbb")  // same size, other bytes
                         .Add("grown.txt", AE_IFREG, "longer now")
                         .Add("moded.sh", AE_IFREG, "#!/bin/sh\n", "", false, 0755)
                         .Add("big.bin", AE_IFREG, big)
                         .Add("new.txt", AE_IFREG, "unchanged")  // content of a file, new path
                         .Add("ln", AE_IFLNK, "", "same.txt")
                         .Add("hard", AE_IFREG, "", "same.txt", true)
                         .Finish();
  Outcome lean = ExpectTheSameTreeEitherWay(back, before, tmp_->path());
  // Unwritten: the unchanged files (a mode change is still the same content; 3 MiB is read
  // whole to know) and the hard link to one. Written: what changed, what is new, symlinks.
  std::set<std::string> unwritten;
  for (const auto& [p, e] : lean.unwritten) unwritten.insert(p);
  EXPECT_EQ(unwritten,
            (std::set<std::string>{"big.bin", "d/e/deep.txt", "hard", "moded.sh", "same.txt"}));
  EXPECT_EQ(lean.manifest.at("moded.sh").mode, 0755u);
  EXPECT_TRUE(Exists(tmp_->path() + "/lean/edited.txt"));
  EXPECT_TRUE(Exists(tmp_->path() + "/lean/new.txt"));
  EXPECT_TRUE(Exists(tmp_->path() + "/lean/ln"));
}

// A guest's tar may name a path twice, put entries under a file, or turn a directory into a
// link after filling it: whatever extraction makes of such a tree, leaving unchanged files
// unwritten makes the same of it.
TEST_F(TarTest, LeavingFilesUnwrittenChangesNothingForHostileOrders) {
  std::string in = TarBuilder()
                       .Add("a", AE_IFREG, "A")
                       .Add("d/f", AE_IFREG, "F")
                       .Add("e/g", AE_IFREG, "G")
                       .Add("twice", AE_IFREG, "T")
                       .Add("twice2", AE_IFREG, "U")
                       .Add("x/y", AE_IFREG, "Y")
                       .Add("hl", AE_IFREG, "H")
                       .Finish();
  Manifest before = BeforeOf(in, tmp_->path() + "/before");
  std::string back = TarBuilder()
                         .Add("a", AE_IFREG, "A")
                         .Add("a/b", AE_IFREG, "under a file")  // refused
                         .Add("d/f", AE_IFREG, "F")
                         .Add("d", AE_IFLNK, "", "/tmp")  // d holds f: refused
                         .Add("e/g", AE_IFREG, "G")
                         .Add("e", AE_IFREG, "a file over a directory")  // refused
                         .Add("twice", AE_IFREG, "T")
                         .Add("twice", AE_IFREG, "changed")  // the later one wins
                         .Add("twice2", AE_IFREG, "U")
                         .Add("twice2", AE_IFLNK, "", "elsewhere")
                         .Add("x", AE_IFLNK, "", "/tmp")
                         .Add("x/y", AE_IFREG, "Y")  // through a link: refused
                         .Add("hl", AE_IFREG, "H")
                         .Add("hl2", AE_IFREG, "", "hl", true)
                         .Add("hl", AE_IFREG, "now other")  // the link keeps the old content
                         .Add("hl3", AE_IFREG, "", "hl", true)
                         .Finish();
  Outcome lean = ExpectTheSameTreeEitherWay(back, before, tmp_->path());
  EXPECT_FALSE(lean.unwritten.empty());
}

}  // namespace
}  // namespace trybox::workspace
