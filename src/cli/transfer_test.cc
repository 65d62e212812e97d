// `trybox cp ID:/path DST` against a scripted tryboxd serving `get` over the real protocol:
// what a hostile guest sends must never become privileged, never be written outside DST,
// never be written through a planted link, and never be left half-done.
#include "cli/transfer.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>

#include "cli/testing.h"
#include "cli/tree_tar.h"
#include "util/fd.h"

namespace trybox::cli {
namespace {

using testing::Home;

// A tar built entry by entry, the way a hostile guest's tar could be.
class Tar {
 public:
  Tar() : a_(archive_write_new()) {
    archive_write_set_format_pax_restricted(a_);
    archive_write_open(a_, &out_, nullptr, &Tar::Write, nullptr);
  }
  ~Tar() { archive_write_free(a_); }
  Tar& File(const std::string& path, mode_t perm, const std::string& data) {
    return Entry(path, AE_IFREG, perm, data, "", "");
  }
  Tar& Dir(const std::string& path, mode_t perm) { return Entry(path, AE_IFDIR, perm, "", "", ""); }
  Tar& Symlink(const std::string& path, const std::string& target) {
    return Entry(path, AE_IFLNK, 0777, "", target, "");
  }
  // A hard link that carries data: extraction links, then writes into what it linked.
  Tar& HardLinkWithData(const std::string& path, const std::string& target,
                        const std::string& data) {
    return Entry(path, AE_IFREG, 0644, data, "", target);
  }
  std::string Finish() {
    archive_write_close(a_);
    return out_;
  }

 private:
  Tar& Entry(const std::string& path, mode_t type, mode_t perm, const std::string& data,
             const std::string& symlink, const std::string& hardlink) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, path.c_str());
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, perm);
    archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
    if (!symlink.empty()) archive_entry_set_symlink(e, symlink.c_str());
    if (!hardlink.empty()) archive_entry_set_hardlink(e, hardlink.c_str());
    archive_write_header(a_, e);
    if (!data.empty()) archive_write_data(a_, data.data(), data.size());
    archive_entry_free(e);
    return *this;
  }
  static la_ssize_t Write(archive*, void* ud, const void* buf, size_t len) {
    static_cast<std::string*>(ud)->append(static_cast<const char*>(buf), len);
    return static_cast<la_ssize_t>(len);
  }
  archive* a_;
  std::string out_;
};

// The daemon's `get`: the meta event, `data` on channel 1, EOF and END. With `cut_at`, only
// that many bytes are sent and the stream is then held open until the client goes away.
testing::ScriptedDaemon::Script ServeGet(const std::string& kind, mode_t mode, std::string data,
                                         size_t cut_at = std::string::npos) {
  return [=](std::shared_ptr<channel::Stream> s, const Json&) {
    Json meta = {
        {"type", "meta"}, {"kind", kind}, {"mode", mode}, {"mtime_ns", 1600000000000000000}};
    if (kind == "file") meta["size"] = data.size();
    if (!s->SendEvent(meta).ok()) return;
    size_t end = std::min(cut_at, data.size());
    for (size_t off = 0; off < end; off += 65536) {
      size_t n = std::min<size_t>(65536, end - off);
      if (!s->Write(channel::kChanOut, std::string_view(data).substr(off, n)).ok()) return;
    }
    if (cut_at != std::string::npos) {
      (void)s->Next();  // until the client resets the stream or goes away
      return;
    }
    (void)s->CloseWrite(channel::kChanOut);
    (void)s->End({{"ok", true}, {"bytes", data.size()}});
  };
}

using testing::Entries;
using testing::ModeOf;

class GetPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    old_umask_ = ::umask(022);  // the usual one; what a copy keeps depends on it
    auto t = TempDir::Make("/tmp", "cp-out-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
    dir_ = tmp_->path() + "/dst";
    ASSERT_EQ(::mkdir(dir_.c_str(), 0755), 0);
    victim_ = tmp_->path() + "/victim";
    ASSERT_TRUE(WriteFileAtomic(victim_, "precious\n", 0600).ok());
  }
  void Serve(testing::ScriptedDaemon::Script script) {
    auto d = testing::ScriptedDaemon::Start(home_.paths, std::move(script));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
    auto c = Client::Connect(home_.paths, false);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
  }
  Status Get(const std::string& guest_path, const std::string& dst) {
    auto r = GetPath(*client_, "vm1", guest_path, dst);
    return r.ok() ? Status::Ok() : r.status();
  }
  void ExpectVictimUntouched() {
    EXPECT_EQ(ReadFileToString(victim_).value_or(""), "precious\n");
    EXPECT_EQ(ModeOf(victim_) & 07777, 0600u);
  }

  void TearDown() override { ::umask(old_umask_); }

  mode_t old_umask_ = 022;
  Home home_;
  std::optional<TempDir> tmp_;
  std::string dir_, victim_;
  std::unique_ptr<testing::ScriptedDaemon> daemon_;
  std::unique_ptr<Client> client_;
};

// A guest's `chmod 4755` copy of a binary once landed set-uid root on the host.
TEST_F(GetPathTest, FileLosesSetUidSetGidAndStickyBits) {
  Serve(ServeGet("file", 07755, "#!/bin/sh\nid\n"));
  ASSERT_TRUE(Get("/root/id", dir_ + "/id").ok());
  EXPECT_EQ(ReadFileToString(dir_ + "/id").value_or(""), "#!/bin/sh\nid\n");
  EXPECT_EQ(ModeOf(dir_ + "/id") & 07777, 0755u);
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/id").c_str(), &st), 0);
  EXPECT_EQ(st.st_mtim.tv_sec, 1600000000);
  EXPECT_EQ(Entries(dir_), std::set<std::string>{"id"});
}

// The old code wrote DST.trybox-part-PID with O_CREAT|O_TRUNC, following a link planted
// there, then chmod'ed what it wrote: a root file overwritten and made set-uid.
TEST_F(GetPathTest, ALinkPlantedAtTheOldTemporaryNameIsNeverFollowed) {
  Serve(ServeGet("file", 04755, "guest bytes"));
  std::string dst = dir_ + "/out";
  std::string planted = dst + ".trybox-part-" + std::to_string(::getpid());
  ASSERT_EQ(::symlink(victim_.c_str(), planted.c_str()), 0);
  ASSERT_TRUE(Get("/root/id", dst).ok());
  ExpectVictimUntouched();
  EXPECT_EQ(ReadFileToString(dst).value_or(""), "guest bytes");
  EXPECT_TRUE(S_ISREG(ModeOf(dst)));
  EXPECT_TRUE(S_ISLNK(ModeOf(planted)));
}

// Decision: a DST that is a symbolic link is refused (cp(1) would write through it).
TEST_F(GetPathTest, DestinationThatIsASymlinkIsRefused) {
  Serve(ServeGet("file", 0644, "guest bytes"));
  std::string link = dir_ + "/link";
  ASSERT_EQ(::symlink(victim_.c_str(), link.c_str()), 0);
  Status st = Get("/root/f", link);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find(link + " is a symbolic link"), std::string::npos) << st.message();
  ExpectVictimUntouched();
  EXPECT_TRUE(S_ISLNK(ModeOf(link)));
  EXPECT_EQ(Entries(dir_), std::set<std::string>{"link"});
  // The same link as the entry of a DST directory.
  ASSERT_EQ(::symlink(victim_.c_str(), (dir_ + "/f").c_str()), 0);
  st = Get("/root/f", dir_);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  ExpectVictimUntouched();
}

TEST_F(GetPathTest, TrailingSlashCopiesIntoTheDirectoryALinkPointsTo) {
  Serve(ServeGet("file", 0640, "x"));
  std::string real = tmp_->path() + "/real";
  ASSERT_EQ(::mkdir(real.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(real.c_str(), (dir_ + "/to-real").c_str()), 0);
  ASSERT_TRUE(Get("/etc/hostname", dir_ + "/to-real/").ok());
  EXPECT_EQ(ReadFileToString(real + "/hostname").value_or(""), "x");
  EXPECT_EQ(ModeOf(real + "/hostname") & 07777, 0640u);
}

TEST_F(GetPathTest, FileReplacesTheEntryNotTheFileItWasLinkedTo) {
  Serve(ServeGet("file", 0644, "new"));
  ASSERT_EQ(::link(victim_.c_str(), (dir_ + "/f").c_str()), 0);  // DST shares the victim's inode
  ASSERT_TRUE(Get("/root/f", dir_ + "/f").ok());
  EXPECT_EQ(ReadFileToString(dir_ + "/f").value_or(""), "new");
  ExpectVictimUntouched();
}

TEST_F(GetPathTest, TreeLosesSpecialBitsEverywhere) {
  std::string tar = Tar()
                        .Dir("./", 03755)
                        .File("./id", 06755, "suid")
                        .Dir("./sticky", 01777)
                        .Dir("./sgid", 02755)
                        .File("./sgid/tool", 02711, "sgid")
                        .Finish();
  Serve(ServeGet("tar", 03755, tar));
  std::string dst = dir_ + "/tree";
  ASSERT_TRUE(Get("/root/tree", dst).ok());
  EXPECT_EQ(ModeOf(dst) & 07777, 0755u);
  EXPECT_EQ(ModeOf(dst + "/id") & 07777, 0755u);
  EXPECT_EQ(ModeOf(dst + "/sticky") & 07777, 0755u);
  EXPECT_EQ(ModeOf(dst + "/sgid") & 07777, 0755u);
  EXPECT_EQ(ModeOf(dst + "/sgid/tool") & 07777, 0711u);
  EXPECT_EQ(ReadFileToString(dst + "/sgid/tool").value_or(""), "sgid");
  EXPECT_EQ(Entries(dir_), std::set<std::string>{"tree"});
}

// Issue 41.10: a guest's 0666 file and 1777 directory once landed writable by every user of
// the host, in a destination root owns.
TEST_F(GetPathTest, NothingFromAGuestLandsGroupOrWorldWritable) {
  std::string tar = Tar()
                        .Dir("./", 01777)
                        .File("./open", 0666, "open")
                        .File("./tool", 0777, "tool")
                        .Dir("./shared", 0777)
                        .Dir("./group", 02775)
                        .File("./group/g", 0664, "g")
                        .Finish();
  auto file = ServeGet("file", 0666, "open");
  auto tree = ServeGet("tar", 01777, tar);
  Serve([=](std::shared_ptr<channel::Stream> s, const Json& req) {
    (req.value("path", "") == "/root/f" ? file : tree)(std::move(s), req);
  });
  ASSERT_TRUE(Get("/root/f", dir_ + "/f").ok());
  EXPECT_EQ(ModeOf(dir_ + "/f") & 07777, 0644u);
  std::string dst = dir_ + "/tree";
  ASSERT_TRUE(Get("/root/tree", dst).ok());
  EXPECT_EQ(ModeOf(dst) & 07777, 0755u);
  EXPECT_EQ(ModeOf(dst + "/open") & 07777, 0644u);
  EXPECT_EQ(ModeOf(dst + "/tool") & 07777, 0755u);
  EXPECT_EQ(ModeOf(dst + "/shared") & 07777, 0755u);
  EXPECT_EQ(ModeOf(dst + "/group") & 07777, 0755u);
  EXPECT_EQ(ModeOf(dst + "/group/g") & 07777, 0644u);
}

// A stricter umask takes more away, as cp(1) and tar(1) do for a user.
TEST_F(GetPathTest, TheUsersUmaskTakesAwayMore) {
  ::umask(077);
  auto file = ServeGet("file", 0755, "x");
  auto tree = ServeGet("tar", 0755, Tar().File("./a", 0644, "a").Finish());
  Serve([=](std::shared_ptr<channel::Stream> s, const Json& req) {
    (req.value("path", "") == "/root/f" ? file : tree)(std::move(s), req);
  });
  ASSERT_TRUE(Get("/root/f", dir_ + "/f").ok());
  EXPECT_EQ(ModeOf(dir_ + "/f") & 07777, 0700u);
  ASSERT_TRUE(Get("/root/tree", dir_ + "/tree").ok());
  EXPECT_EQ(ModeOf(dir_ + "/tree") & 07777, 0700u);
  EXPECT_EQ(ModeOf(dir_ + "/tree/a") & 07777, 0600u);
}

TEST(GuestPermissionMaskTest, NeverGroupOrOtherWriteAndTheUmaskOnTop) {
  EXPECT_EQ(GuestPermissionMask(0), 0755u);
  EXPECT_EQ(GuestPermissionMask(002), 0755u);
  EXPECT_EQ(GuestPermissionMask(027), 0750u);
  EXPECT_EQ(GuestPermissionMask(077), 0700u);
}

TEST_F(GetPathTest, TreeIntoAnExistingDirectoryLandsUnderItsOwnName) {
  Serve(ServeGet("tar", 0755, Tar().File("./a", 0644, "a").Finish()));
  ASSERT_TRUE(Get("/srv/project/", dir_).ok());
  EXPECT_EQ(ReadFileToString(dir_ + "/project/a").value_or(""), "a");
  // Again: project exists now, and a tree never merges into it.
  Status st = Get("/srv/project", dir_);
  EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.ToString();
  EXPECT_EQ(Entries(dir_), std::set<std::string>{"project"});
}

// Symlinks in the tree never make the CLI write outside it: through a link to a directory,
// over a link to a file, or by a hard link through a link that then carries data.
TEST_F(GetPathTest, LinksInATreeNeverWriteOutsideIt) {
  std::string outside = tmp_->path();
  std::string tar = Tar()
                        .File("./ok", 0644, "fine")
                        .Symlink("./out", outside)
                        .File("./out/escaped", 0644, "evil")
                        .Symlink("./vic", victim_)
                        .File("./vic", 0644, "evil")
                        .HardLinkWithData("./hard", "out/victim", "evil")
                        .Finish();
  Serve(ServeGet("tar", 0755, tar));
  std::string dst = dir_ + "/tree";
  Status st = Get("/root/tree", dst);
  EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.ToString();
  EXPECT_NE(st.message().find("refusing tar entry"), std::string::npos) << st.message();
  ExpectVictimUntouched();
  EXPECT_FALSE(S_ISREG(ModeOf(outside + "/escaped")));
  EXPECT_EQ(Entries(dir_), std::set<std::string>{}) << "a refused tree left something behind";
}

TEST_F(GetPathTest, AnAbortedTreeLeavesNothing) {
  Tar tar;
  for (int i = 0; i < 200; ++i) tar.File("./f" + std::to_string(i), 0644, std::string(1024, 'x'));
  std::string data = tar.Finish();
  Serve([data](std::shared_ptr<channel::Stream> s, const Json&) {
    (void)s->SendEvent({{"type", "meta"}, {"kind", "tar"}, {"mode", 0755}, {"mtime_ns", 0}});
    (void)s->Write(channel::kChanOut, std::string_view(data).substr(0, data.size() / 2));
    (void)s->Reset("the guest went away");
  });
  Status st = Get("/root/tree", dir_ + "/tree");
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(Entries(dir_), std::set<std::string>{}) << "an aborted copy left something behind";
}

// Killed with SIGKILL half-way through a 200-file tree, the copy once left 27 files at the
// destination. Now the destination never exists until complete, and the temporary
// directory is removed by the helper the CLI started, which outlives it. The "CLI" here is
// a child of a subreaper, so that the helper, orphaned, is reaped where the test can wait.
TEST_F(GetPathTest, ATreeKilledMidwayLeavesNothing) {
  Tar tar;
  for (int i = 0; i < 200; ++i) tar.File("./f" + std::to_string(i), 0644, std::string(4096, 'x'));
  std::string data = tar.Finish();
  Serve(ServeGet("tar", 0755, data, data.size() / 2));
  client_.reset();  // the child makes its own connection
  std::string dst = dir_ + "/tree";
  auto cli = testing::Subreaper::Start([&] {
    auto c = Client::Connect(home_.paths, false);
    if (c.ok()) (void)GetPath(**c, "vm1", "/root/tree", dst);
  });
  ASSERT_TRUE(cli.ok()) << cli.status().ToString();
  ASSERT_TRUE(testing::WaitForADirectoryWith(dir_, 27, std::chrono::seconds(60)))
      << "the copy never started writing: " << ::testing::PrintToString(Entries(dir_));
  ASSERT_EQ(::kill((*cli)->child(), SIGKILL), 0);
  ASSERT_TRUE((*cli)->WaitForAll().ok());  // the CLI and its helper are gone
  EXPECT_EQ(Entries(dir_), std::set<std::string>{}) << "a killed copy left something behind";
}

// `trybox cp DIR ID:/path`: the tree goes as a tar its entries relative to it, made by
// trybox-tar; symbolic links travel as links, never followed.
TEST(PutPathTest, ATreeTravelsAsATarOfItsEntries) {
  Home home;
  auto t = TempDir::Make("/tmp", "cp-in-");
  ASSERT_TRUE(t.ok());
  const std::string tree = t->path() + "/tree";
  ASSERT_EQ(::mkdir(tree.c_str(), 0750), 0);
  ASSERT_EQ(::mkdir((tree + "/sub").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFileAtomic(tree + "/a", "alpha", 0644).ok());
  ASSERT_TRUE(WriteFileAtomic(tree + "/sub/b", std::string(300000, 'b'), 0755).ok());
  ASSERT_EQ(::symlink("/etc/passwd", (tree + "/link").c_str()), 0);

  auto received = std::make_shared<std::string>();
  auto d = testing::ScriptedDaemon::Start(
      home.paths, [received](std::shared_ptr<channel::Stream> s, const Json&) {
        std::string data;
        for (;;) {
          auto m = s->Next();
          if (!m.ok()) return;
          if (m->kind == channel::Stream::Message::Kind::kData) data += m->data;
          if (m->kind == channel::Stream::Message::Kind::kEof) break;
        }
        *received = data;
        (void)s->End({{"ok", true}, {"bytes", data.size()}});
      });
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto c = Client::Connect(home.paths, false);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  char before[4096], after[4096];
  ASSERT_NE(::getcwd(before, sizeof before), nullptr);

  auto r = PutPath(**c, "vm1", tree, "/root/tree");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_NE(::getcwd(after, sizeof after), nullptr);
  EXPECT_STREQ(before, after) << "the CLI's working directory changed";
  EXPECT_EQ(r->kind, "tar");
  EXPECT_EQ(r->bytes, received->size());
  auto requests = (*d)->requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].value("kind", ""), "tar");
  EXPECT_EQ(requests[0].value("mode", 0), 0750);

  // What the guest would unpack, read back with libarchive.
  std::map<std::string, std::string> entries;  // path -> "TYPE PERM CONTENT-OR-TARGET"
  archive* a = archive_read_new();
  archive_read_support_format_tar(a);
  ASSERT_EQ(archive_read_open_memory(a, received->data(), received->size()), ARCHIVE_OK);
  archive_entry* e;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    std::string content(static_cast<size_t>(archive_entry_size(e)), '\0');
    if (!content.empty()) archive_read_data(a, content.data(), content.size());
    const char* target = archive_entry_symlink(e);
    char perm[8];
    std::snprintf(perm, sizeof perm, "%o", archive_entry_perm(e));
    entries[archive_entry_pathname(e)] = std::to_string(archive_entry_filetype(e) >> 12) + " " +
                                         perm + " " + (target ? target : content.substr(0, 10));
  }
  archive_read_free(a);
  const std::string reg = std::to_string(AE_IFREG >> 12), dir = std::to_string(AE_IFDIR >> 12),
                    lnk = std::to_string(AE_IFLNK >> 12);
  const std::map<std::string, std::string> want = {{"./", dir + " 750 "},
                                                   {"./a", reg + " 644 alpha"},
                                                   {"./sub/", dir + " 755 "},
                                                   {"./sub/b", reg + " 755 bbbbbbbbbb"},
                                                   {"./link", lnk + " 777 /etc/passwd"}};
  EXPECT_EQ(entries, want);
}

// The helper's verdict keeps its code across the process boundary: a tree that went away
// between the CLI's stat and the helper's start is kNotFound, named.
TEST(TreeTarTest, AVerdictKeepsItsCode) {
  auto t = TempDir::Make("/tmp", "cp-in-");
  ASSERT_TRUE(t.ok());
  auto tar = StartTreeTar("pack", t->path() + "/gone");
  ASSERT_TRUE(tar.ok()) << tar.status().ToString();
  Status st = FinishTreeTar(*tar);
  EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find(t->path() + "/gone"), std::string::npos) << st.message();
  // A status that is not the helper's (a usage error) is named with its exit.
  tar = StartTreeTar("neither", t->path());
  ASSERT_TRUE(tar.ok());
  st = FinishTreeTar(*tar);
  EXPECT_EQ(st.code(), Code::kInternal) << st.ToString();
  EXPECT_NE(st.message().find("exit code 2"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("usage"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace trybox::cli
