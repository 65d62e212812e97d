#include "cli/client.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "cli/testing.h"
#include "util/private_dir.h"

namespace trybox::cli {
namespace {

using testing::Home;

using testing::Trap;

void ExpectRefusedBeforeConnecting(const Home& home, const Trap& trap, const std::string& why) {
  for (bool autostart : {false, true}) {
    auto c = Client::Connect(home.paths, autostart);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Code::kPermissionDenied) << c.status().ToString();
    EXPECT_NE(c.status().message().find(home.paths.runtime), std::string::npos)
        << c.status().message();
    EXPECT_NE(c.status().message().find(why), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("XDG_RUNTIME_DIR"), std::string::npos)
        << c.status().message();
    EXPECT_FALSE(trap.connected()) << "the client connected into a directory it refused";
  }
}

TEST(ClientTest, RuntimeDirThatIsASymlinkIsRefusedBeforeConnecting) {
  Home home;
  std::string elsewhere = home.dir.path() + "/elsewhere";
  ASSERT_TRUE(MakePrivateDir(elsewhere).ok());  // private, but not where it should be
  ASSERT_EQ(::symlink(elsewhere.c_str(), home.paths.runtime.c_str()), 0);
  Trap trap(elsewhere + "/tryboxd.sock");
  ExpectRefusedBeforeConnecting(home, trap, "symbolic link");
}

TEST(ClientTest, RuntimeDirOpenToOthersIsRefusedBeforeConnecting) {
  Home home;
  ASSERT_EQ(::mkdir(home.paths.runtime.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(home.paths.runtime.c_str(), 0777), 0);
  Trap trap(home.paths.socket());
  ExpectRefusedBeforeConnecting(home, trap, "its mode is 0777");
}

TEST(ClientTest, RuntimeDirOfAnotherUserIsRefusedBeforeConnecting) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  Home home;
  ASSERT_EQ(::mkdir(home.paths.runtime.c_str(), 0700), 0);
  Trap trap(home.paths.socket());
  ASSERT_EQ(::chown(home.paths.runtime.c_str(), 65534, 65534), 0);
  ExpectRefusedBeforeConnecting(home, trap, "owned by uid 65534");
}

TEST(ClientTest, MissingRuntimeDirWithoutAutostartIsUnreachable) {
  Home home;
  auto c = Client::Connect(home.paths, /*autostart=*/false);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kUnavailable);
  EXPECT_NE(c.status().message().find("cannot reach tryboxd at " + home.paths.socket()),
            std::string::npos)
      << c.status().message();
}

TEST(ClientTest, ADaemonThatDiesMidRequestHasTheSameNameAsOneThatIsNotThere) {
  // It used to be "channel lost: ..." here, "cannot reach tryboxd" before connecting, and
  // "started tryboxd but it did not answer" after an autostart.
  Home home;
  auto d = testing::ScriptedDaemon::Start(
      home.paths, [](std::shared_ptr<channel::Stream> s, const Json&) { (void)s->Next(); });
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto c = Client::Connect(home.paths, false);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto call = std::async(std::launch::async, [&] { return (*c)->Call({{"verb", "list"}}); });
  while ((*d)->requests().empty()) std::this_thread::yield();
  d->reset();  // the daemon goes away with the request unanswered
  auto r = call.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("cannot reach tryboxd at " + home.paths.socket()),
            std::string::npos)
      << r.status().message();
  auto again = (*c)->Call({{"verb", "list"}});
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("cannot reach tryboxd at "), std::string::npos)
      << again.status().message();
}

TEST(ClientTest, OwnDaemonIsServed) {
  Home home;
  auto d = testing::ScriptedDaemon::Start(home.paths,
                                          [](std::shared_ptr<channel::Stream> s, const Json&) {
                                            (void)s->End({{"ok", true}, {"pid", 1}});
                                          });
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto c = Client::Connect(home.paths, false);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto r = (*c)->Call({{"verb", "ping"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["pid"], 1);
}

// Another local user answering on the socket (a squatted directory, a stolen socket) would
// receive the request, model API key and all. A child that drops to uid 65534 before
// listen(2) plays that user: SO_PEERCRED reports the listener's credentials as of listen.
TEST(ClientTest, DaemonRunningAsAnotherUserIsRefusedAndHearsNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to play another user";
  Home home;
  ASSERT_TRUE(MakePrivateDir(home.paths.runtime).ok());
  auto impostor = testing::ForeignListener::Start(home.paths.socket(), 65534);
  ASSERT_TRUE(impostor.ok()) << impostor.status().ToString();
  auto c = Client::Connect(home.paths, /*autostart=*/false);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kPermissionDenied);
  EXPECT_NE(c.status().message().find("runs as uid 65534"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find(home.paths.socket()), std::string::npos);
  auto heard = (*impostor)->BytesHeard();
  ASSERT_TRUE(heard.ok()) << heard.status().ToString();
  EXPECT_EQ(*heard, 0) << "the impostor received bytes";
}

TEST(DaemonEnvironmentTest, KeepsPathsAndTryboxSettingsAndDropsSecrets) {
  const char* env[] = {"PATH=/usr/bin",
                       "HOME=/home/u",
                       "TRYBOX_MAX_VMS=4",
                       "TRYBOX_MEMORY_RESERVE_MIB=64",
                       "XDG_RUNTIME_DIR=/run/user/1",
                       "LC_ALL=C.UTF-8",
                       "ANTHROPIC_API_KEY=sk-ant-secret",
                       "OPENAI_API_KEY=sk-secret",
                       "GITHUB_TOKEN=ghp_secret",
                       "AWS_SECRET_ACCESS_KEY=x",
                       "PATHOLOGICAL=1",
                       "=odd",
                       "noequals",
                       nullptr};
  auto kept = DaemonEnvironment(env);
  EXPECT_EQ(kept, (std::vector<std::string>{"PATH=/usr/bin", "HOME=/home/u", "TRYBOX_MAX_VMS=4",
                                            "TRYBOX_MEMORY_RESERVE_MIB=64",
                                            "XDG_RUNTIME_DIR=/run/user/1", "LC_ALL=C.UTF-8"}));
}

}  // namespace
}  // namespace trybox::cli
