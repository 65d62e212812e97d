#include "cli/client.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "cli/testing.h"
#include "util/private_dir.h"

namespace trybox::cli {
namespace {

using testing::Home;

// A bound, listening socket at `path` that nobody serves: a connection attempt shows up as a
// pending connection, which tells whether a client got that far.
class Trap {
 public:
  explicit Trap(const std::string& path) : fd_(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << path;
    EXPECT_EQ(::listen(fd_.get(), 8), 0);
  }
  bool Connected() {
    pollfd p{fd_.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }

 private:
  UniqueFd fd_;
};

void ExpectRefusedBeforeConnecting(const Home& home, Trap& trap, const std::string& why) {
  for (bool autostart : {false, true}) {
    auto c = Client::Connect(home.paths, autostart);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Code::kPermissionDenied) << c.status().ToString();
    EXPECT_NE(c.status().message().find(home.paths.runtime), std::string::npos)
        << c.status().message();
    EXPECT_NE(c.status().message().find(why), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("XDG_RUNTIME_DIR"), std::string::npos)
        << c.status().message();
    EXPECT_FALSE(trap.Connected()) << "the client connected into a directory it refused";
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
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, home.paths.socket().c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  int ready[2], heard[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(heard, O_CLOEXEC), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls: the test process has threads.
    if (::syscall(SYS_setgroups, 0, nullptr) != 0 || ::syscall(SYS_setgid, 65534) != 0 ||
        ::syscall(SYS_setuid, 65534) != 0 || ::listen(sock.get(), 8) != 0) {
      ::_exit(1);
    }
    char one = 1;
    if (::write(ready[1], &one, 1) != 1) ::_exit(1);
    int c = ::accept(sock.get(), nullptr, nullptr);
    long total = 0;
    char buf[4096];
    for (ssize_t n; c >= 0 && (n = ::read(c, buf, sizeof buf)) > 0;) total += n;
    if (::write(heard[1], &total, sizeof total) != sizeof total) ::_exit(1);
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(heard[1]);
  char one = 0;
  ASSERT_EQ(::read(ready[0], &one, 1), 1) << "the child could not become uid 65534";
  auto c = Client::Connect(home.paths, /*autostart=*/false);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kPermissionDenied);
  EXPECT_NE(c.status().message().find("runs as uid 65534"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find(home.paths.socket()), std::string::npos);
  long total = -1;
  ASSERT_EQ(::read(heard[0], &total, sizeof total), static_cast<ssize_t>(sizeof total));
  EXPECT_EQ(total, 0) << "the impostor received bytes";
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ::close(ready[0]);
  ::close(heard[0]);
}

}  // namespace
}  // namespace trybox::cli
