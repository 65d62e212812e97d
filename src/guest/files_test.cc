// put/get served over a real Mux on a socketpair, against a temp dir. Only the file paths
// are exercised here (the tar paths fork through the reaper; the e2e tests boot a guest).
#include "guest/files.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <thread>

#include "util/fd.h"

namespace trybox::guest {
namespace {

using channel::Json;
using channel::Mux;
using channel::Stream;

struct Reply {
  std::vector<Json> events;
  std::string out;
  bool eof = false;
  Json end;
};

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    host_ = std::make_unique<Mux>(UniqueFd(sv[0]), channel::Role::kHost);
    guest_ = std::make_unique<Mux>(UniqueFd(sv[1]), channel::Role::kGuest);
    guest_->OnOpen([this](std::shared_ptr<Stream> s, Json req) {
      if (req["op"] == "put") ServePut(reaper_, *s, req);
      if (req["op"] == "get") ServeGet(reaper_, *s, req);
    });
    guest_->Start();
    host_->Start();
    auto dir = TempDir::Make(::testing::TempDir(), "files_test");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir).value());
  }

  Reply Call(const Json& req, const std::string* upload = nullptr) {
    Reply r;
    auto s = host_->Open(req);
    EXPECT_TRUE(s.ok());
    if (!s.ok()) return r;
    std::thread writer;
    if (upload) {
      writer = std::thread([st = *s, upload] {
        if (st->Write(channel::kChanIn, *upload).ok()) (void)st->CloseWrite(channel::kChanIn);
      });
    }
    for (;;) {
      auto m = (*s)->Next(std::chrono::steady_clock::now() + std::chrono::seconds(20));
      if (!m.ok()) {
        ADD_FAILURE() << m.status().ToString();
        break;
      }
      if (m->kind == Stream::Message::Kind::kData) r.out += m->data;
      if (m->kind == Stream::Message::Kind::kEof) r.eof = true;
      if (m->kind == Stream::Message::Kind::kEvent) r.events.push_back(m->body);
      if (m->kind == Stream::Message::Kind::kEnd || m->kind == Stream::Message::Kind::kReset) {
        r.end = m->body;
        break;
      }
    }
    if (writer.joinable()) writer.join();
    return r;
  }

  std::string Path(const std::string& rel) const { return dir_->path() + "/" + rel; }

  Reaper reaper_;  // never started: the file paths do not fork
  std::optional<TempDir> dir_;
  std::unique_ptr<Mux> host_, guest_;
};

TEST_F(FilesTest, PutThenGetRoundTripsBytesModeAndMtime) {
  std::string data(5 << 20, '\0');  // larger than one credit window
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + i / 4096);
  Reply put = Call({{"op", "put"},
                    {"path", Path("d/e/f.bin")},
                    {"mode", 0600},
                    {"mtime_ns", 1234567890123456789LL},
                    {"mkdirs", true}},
                   &data);
  EXPECT_EQ(put.end, (Json{{"ok", true}, {"bytes", data.size()}}));
  struct stat st;
  ASSERT_EQ(::stat(Path("d/e/f.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_mtim.tv_sec, 1234567890);
  EXPECT_EQ(st.st_mtim.tv_nsec, 123456789);

  Reply get = Call({{"op", "get"}, {"path", Path("d/e/f.bin")}});
  EXPECT_EQ(get.end, (Json{{"ok", true}, {"bytes", data.size()}}));
  EXPECT_TRUE(get.eof);
  EXPECT_TRUE(get.out == data);
  ASSERT_EQ(get.events.size(), 1u);
  EXPECT_EQ(get.events[0], (Json{{"type", "meta"},
                                 {"kind", "file"},
                                 {"mode", 0600},
                                 {"mtime_ns", 1234567890123456789LL},
                                 {"size", data.size()}}));
}

TEST_F(FilesTest, PutReplacesAnExistingFileAtomically) {
  ASSERT_TRUE(WriteFileAtomic(Path("f"), "old").ok());
  std::string data = "new contents";
  EXPECT_EQ(Call({{"op", "put"}, {"path", Path("f")}}, &data).end["ok"], true);
  EXPECT_EQ(*ReadFileToString(Path("f")), data);
}

TEST_F(FilesTest, PutIntoMissingDirectoryDrainsAndLeavesNothing) {
  std::string data(9 << 20, 'x');  // beyond the window: the guest must keep reading
  Reply r = Call({{"op", "put"}, {"path", Path("missing/f")}}, &data);
  EXPECT_EQ(r.end["ok"], false);
  EXPECT_EQ(r.end["error"], "not_found");
  EXPECT_EQ(r.end["message"], Path("missing") + ": no such file or directory");
}

TEST_F(FilesTest, PutUnderAFileIsNotADirectory) {
  ASSERT_TRUE(WriteFileAtomic(Path("plain"), "x").ok());
  std::string data = "y";
  Reply r = Call({{"op", "put"}, {"path", Path("plain/f")}, {"mkdirs", true}}, &data);
  EXPECT_EQ(r.end["error"], "not_a_directory");
}

TEST_F(FilesTest, PutBadRequestStillConsumesTheUpload) {
  std::string data(6 << 20, 'z');
  Reply r = Call({{"op", "put"}, {"path", "relative"}}, &data);
  EXPECT_EQ(r.end["error"], "bad_request");
}

TEST_F(FilesTest, PutLeavesNoTempFileBehind) {
  std::string data = "abc";
  ASSERT_EQ(Call({{"op", "put"}, {"path", Path("only")}}, &data).end["ok"], true);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir_->path())) {
    names.push_back(e.path().filename());
  }
  EXPECT_EQ(names, std::vector<std::string>{"only"});
}

TEST_F(FilesTest, GetMissingPathIsNotFoundNeverEmpty) {
  Reply r = Call({{"op", "get"}, {"path", Path("nope")}});
  EXPECT_EQ(r.end, (Json{{"ok", false},
                         {"error", "not_found"},
                         {"message", Path("nope") + ": no such file or directory"}}));
  EXPECT_TRUE(r.events.empty());
  EXPECT_TRUE(r.out.empty());
  EXPECT_FALSE(r.eof);
}

TEST_F(FilesTest, GetThroughAFileIsNotFound) {
  ASSERT_TRUE(WriteFileAtomic(Path("plain"), "x").ok());
  EXPECT_EQ(Call({{"op", "get"}, {"path", Path("plain/sub")}}).end["error"], "not_found");
}

TEST_F(FilesTest, GetOfFifoOrDanglingSymlinkIsUnsupported) {
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  ASSERT_EQ(::symlink(Path("nowhere").c_str(), Path("dangling").c_str()), 0);
  Reply fifo = Call({{"op", "get"}, {"path", Path("fifo")}});
  EXPECT_EQ(fifo.end["error"], "unsupported");
  EXPECT_NE(fifo.end["message"].get<std::string>().find("fifo"), std::string::npos);
  Reply link = Call({{"op", "get"}, {"path", Path("dangling")}});
  EXPECT_EQ(link.end["error"], "unsupported");
  EXPECT_NE(link.end["message"].get<std::string>().find("symbolic link"), std::string::npos);
}

TEST_F(FilesTest, GetFollowsASymlinkToAFile) {
  ASSERT_TRUE(WriteFileAtomic(Path("target"), "hello").ok());
  ASSERT_EQ(::symlink(Path("target").c_str(), Path("link").c_str()), 0);
  Reply r = Call({{"op", "get"}, {"path", Path("link")}});
  EXPECT_EQ(r.out, "hello");
  EXPECT_EQ(r.end["ok"], true);
}

}  // namespace
}  // namespace trybox::guest
