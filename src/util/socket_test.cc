#include "util/socket.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>

#include <string>
#include <thread>

namespace trybox {
namespace {

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
