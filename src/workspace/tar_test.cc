#include "workspace/tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "util/fd.h"

namespace trybox::workspace {
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
                  const std::string& link = "", bool hard = false) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, path.c_str());
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, 0644);
    if (type == AE_IFREG && !hard) archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
    if (type == AE_IFLNK) archive_entry_set_symlink(e, link.c_str());
    if (hard) archive_entry_set_hardlink(e, link.c_str());
    if (type == AE_IFCHR) archive_entry_set_rdev(e, makedev(1, 3));
    archive_write_header(a_, e);
    if (!data.empty()) archive_write_data(a_, data.data(), data.size());
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

}  // namespace
}  // namespace trybox::workspace
