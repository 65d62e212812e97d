// The watch request served over a real Mux on a socketpair, against a temp dir and the
// kernel's inotify (the e2e tests watch through a booted guest and the E2B SDK).
#include "guest/watch.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <optional>

#include "util/fd.h"

namespace trybox::guest {
namespace {

using channel::Json;
using channel::Mux;
using channel::Stream;
namespace fs = std::filesystem;

class WatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    host_ = std::make_unique<Mux>(UniqueFd(sv[0]), channel::Role::kHost);
    guest_ = std::make_unique<Mux>(UniqueFd(sv[1]), channel::Role::kGuest);
    guest_->OnOpen([](std::shared_ptr<Stream> s, Json req) { ServeWatch(*s, req); });
    guest_->Start();
    host_->Start();
    auto dir = TempDir::Make(::testing::TempDir(), "watch_test");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir).value());
  }

  // The next message, or a failure after 10 s.
  Result<Stream::Message> Next(Stream& s) {
    return s.Next(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  }
  // Events until one with op and name, or the stream's end; the ops seen on the way.
  bool SawEvent(Stream& s, const std::string& op, const std::string& name,
                std::vector<std::string>* seen) {
    for (;;) {
      auto m = Next(s);
      if (!m.ok() || m->kind != Stream::Message::Kind::kEvent) return false;
      seen->push_back(m->body.value("op", "?") + ":" + m->body.value("name", "?"));
      if (m->body.value("op", "") == op && m->body.value("name", "") == name) return true;
    }
  }

  std::unique_ptr<Mux> host_;
  std::unique_ptr<Mux> guest_;
  std::optional<TempDir> dir_;
};

TEST_F(WatchTest, ReportsChangesByRelativeNameUntilTheHostResets) {
  const std::string root = dir_->path();
  auto s = host_->Open({{"op", "watch"}, {"path", root + "/"}, {"recursive", false}});
  ASSERT_TRUE(s.ok());
  auto started = Next(**s);
  ASSERT_TRUE(started.ok());
  EXPECT_EQ(started->body, Json({{"type", "started"}, {"dirs", 1}}));

  std::vector<std::string> seen;
  ASSERT_TRUE(WriteFileAtomic(root + "/a.txt", "one", 0644).ok());
  // WriteFileAtomic makes a temporary and renames it into place: a.txt arrives as a create.
  EXPECT_TRUE(SawEvent(**s, "create", "a.txt", &seen)) << ::testing::PrintToString(seen);
  ASSERT_EQ(::chmod((root + "/a.txt").c_str(), 0600), 0);
  EXPECT_TRUE(SawEvent(**s, "chmod", "a.txt", &seen)) << ::testing::PrintToString(seen);
  fs::rename(root + "/a.txt", root + "/b.txt");
  EXPECT_TRUE(SawEvent(**s, "rename", "a.txt", &seen)) << ::testing::PrintToString(seen);
  EXPECT_TRUE(SawEvent(**s, "create", "b.txt", &seen)) << ::testing::PrintToString(seen);
  fs::remove(root + "/b.txt");
  EXPECT_TRUE(SawEvent(**s, "remove", "b.txt", &seen)) << ::testing::PrintToString(seen);
  // Not recursive: a change inside a subdirectory is not reported, its creation is.
  fs::create_directory(root + "/sub");
  EXPECT_TRUE(SawEvent(**s, "create", "sub", &seen)) << ::testing::PrintToString(seen);
  ASSERT_TRUE(WriteFileAtomic(root + "/sub/deep.txt", "x", 0644).ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/top.txt", "x", 0644).ok());
  seen.clear();
  EXPECT_TRUE(SawEvent(**s, "create", "top.txt", &seen));
  for (const auto& e : seen) EXPECT_EQ(e.find("deep"), std::string::npos) << e;

  ASSERT_TRUE((*s)->Reset("done watching").ok());
}

TEST_F(WatchTest, RecursiveFollowsNewAndMovedDirectories) {
  const std::string root = dir_->path();
  fs::create_directories(root + "/x/y");
  auto s = host_->Open({{"op", "watch"}, {"path", root}, {"recursive", true}});
  ASSERT_TRUE(s.ok());
  auto started = Next(**s);
  ASSERT_TRUE(started.ok());
  EXPECT_EQ(started->body["dirs"], 3);

  std::vector<std::string> seen;
  ASSERT_TRUE(WriteFileAtomic(root + "/x/y/f", "1", 0644).ok());
  EXPECT_TRUE(SawEvent(**s, "create", "x/y/f", &seen)) << ::testing::PrintToString(seen);
  fs::create_directory(root + "/new");
  EXPECT_TRUE(SawEvent(**s, "create", "new", &seen)) << ::testing::PrintToString(seen);
  ASSERT_TRUE(WriteFileAtomic(root + "/new/g", "2", 0644).ok());
  EXPECT_TRUE(SawEvent(**s, "create", "new/g", &seen)) << ::testing::PrintToString(seen);
  // A directory moved within the tree is reported under its new name from then on.
  fs::rename(root + "/x", root + "/z");
  EXPECT_TRUE(SawEvent(**s, "create", "z", &seen)) << ::testing::PrintToString(seen);
  ASSERT_TRUE(WriteFileAtomic(root + "/z/y/h", "3", 0644).ok());
  EXPECT_TRUE(SawEvent(**s, "create", "z/y/h", &seen)) << ::testing::PrintToString(seen);
  ASSERT_TRUE((*s)->Reset("done").ok());
}

TEST_F(WatchTest, RefusesWhatItCannotWatchAndEndsWhenTheDirectoryGoes) {
  const std::string root = dir_->path();
  auto call = [&](const Json& req) {
    auto s = host_->Open(req);
    EXPECT_TRUE(s.ok());
    auto m = Next(**s);
    EXPECT_TRUE(m.ok());
    return m.ok() ? m->body : Json();
  };
  EXPECT_EQ(call({{"op", "watch"}, {"path", root + "/none"}})["error"], "not_found");
  ASSERT_TRUE(WriteFileAtomic(root + "/file", "x", 0644).ok());
  EXPECT_EQ(call({{"op", "watch"}, {"path", root + "/file"}})["error"], "not_a_directory");
  EXPECT_EQ(call({{"op", "watch"}, {"path", "relative"}})["error"], "bad_request");
  EXPECT_EQ(call({{"op", "watch"}, {"path", root}, {"recursive", "yes"}})["error"], "bad_request");

  fs::create_directory(root + "/d");
  auto s = host_->Open({{"op", "watch"}, {"path", root + "/d"}});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(Next(**s).ok());  // started
  fs::remove(root + "/d");
  for (;;) {
    auto m = Next(**s);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    if (m->kind != Stream::Message::Kind::kEnd) continue;
    EXPECT_EQ(m->body["error"], "gone") << m->body.dump();
    break;
  }
}

}  // namespace
}  // namespace trybox::guest
