#include "util/socket.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <string>
#include <thread>

namespace trybox {
namespace {

// QEMU's control and monitor sockets are made this way while other threads create VM
// directories: the umask (the whole process's) must not change, even for a moment, or a
// directory made meanwhile lost its owner's search bit and QEMU could not use it.
TEST(ListenUnixInPrivateDirTest, ListensAt0600LeavesTheUmaskAndKeepsThePath) {
  auto dir = TempDir::Make("/tmp", "listen");
  ASSERT_TRUE(dir.ok());
  const std::string path = dir->path() + "/ctl.sock";
  ASSERT_TRUE(WriteFileAtomic(path, "stale", 0600).ok());  // not a socket: refused, kept
  EXPECT_FALSE(ListenUnixInPrivateDir(path).ok());
  ASSERT_EQ(::unlink(path.c_str()), 0);
  const mode_t before = ::umask(0022);
  {
    auto first = ListenUnixInPrivateDir(path);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
  }
  // The path outlives the fd; a stale socket file is replaced.
  auto l = ListenUnixInPrivateDir(path);
  const mode_t during = ::umask(before);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(during, 0022u);
  struct stat st;
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto c = ConnectUnix(path);  // queued until accepted: no one needs to accept first
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  UniqueFd accepted(::accept4(l->get(), nullptr, nullptr, SOCK_CLOEXEC));
  EXPECT_TRUE(accepted.valid());
}

TEST(SendFullTest, SendsAllOfItAndAGonePeerIsAnErrorNotASignal) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  const std::string data(300000, 'x');  // more than one socket buffer: several sends
  std::string got;
  std::thread reader([&] {
    char buf[65536];
    for (;;) {
      auto n = ReadSome(b.get(), buf, sizeof buf);
      if (!n.ok() || *n == 0) return;
      got.append(buf, *n);
    }
  });
  Status st = SendFull(a.get(), data);
  ::shutdown(a.get(), SHUT_WR);
  reader.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(got, data);

  // The peer is gone, SIGPIPE left at its default (which would end this process).
  struct sigaction old;
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  ASSERT_EQ(::sigaction(SIGPIPE, &dfl, &old), 0);
  b.Reset();
  st = SendFull(a.get(), "after the peer left");
  ::sigaction(SIGPIPE, &old, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("send"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace trybox
