// The steering (guest/steer.h) in a network namespace of its own, on the host's kernel: the
// same route and BPF program trybox-init installs, without a VM. Needs CAP_SYS_ADMIN (to
// make the namespace) and CAP_BPF; skipped, saying so, without them.
#include "guest/steer.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "util/tcp.h"

namespace trybox::guest {
namespace {

sockaddr_in Addr(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

std::string Format(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(a.sin_port));
}

// Runs in a thread whose network namespace is new (unshare applies to the calling thread).
void SteerInANewNamespace(std::string* skip) {
  if (::unshare(CLONE_NEWNET) != 0) {
    *skip = "cannot make a network namespace: " + std::string(std::strerror(errno));
    return;
  }
  UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  ASSERT_EQ(::ioctl(s.get(), SIOCGIFFLAGS, &ifr), 0);
  ifr.ifr_flags |= IFF_UP;
  ASSERT_EQ(::ioctl(s.get(), SIOCSIFFLAGS, &ifr), 0);

  // Before the steering: no route anywhere but loopback.
  UniqueFd before(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in pool = Addr("198.18.0.5", 443);
  ASSERT_NE(::connect(before.get(), reinterpret_cast<sockaddr*>(&pool), sizeof pool), 0);
  EXPECT_EQ(errno, ENETUNREACH);

  TcpListener tcp = ListenTcpLoopback(0).value();
  UniqueFd sink(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in sink_addr = Addr("127.0.0.1", 0);
  ASSERT_EQ(::bind(sink.get(), reinterpret_cast<sockaddr*>(&sink_addr), sizeof sink_addr), 0);
  ASSERT_TRUE(AskForDestinations(sink.get()).ok());
  auto steering = Steering::Install(tcp.fd.get(), sink.get());
  if (!steering.ok() && steering.status().code() == Code::kPermissionDenied) {
    *skip = steering.status().message();
    return;
  }
  ASSERT_TRUE(steering.ok()) << steering.status().ToString();

  // TCP to any non-loopback address lands on the listener, which sees the address dialled.
  for (const char* ip : {"198.18.0.5", "10.0.2.2", "1.2.3.4"}) {
    UniqueFd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in to = Addr(ip, 8443);
    ASSERT_EQ(::connect(c.get(), reinterpret_cast<sockaddr*>(&to), sizeof to), 0) << ip;
    auto accepted = AcceptTcp(tcp.fd.get());
    ASSERT_TRUE(accepted.ok());
    sockaddr_in local{};
    socklen_t len = sizeof local;
    ASSERT_EQ(::getsockname(accepted->get(), reinterpret_cast<sockaddr*>(&local), &len), 0);
    EXPECT_EQ(Format(local), std::string(ip) + ":8443");
  }
  // UDP to any non-loopback address lands on the sink, with where it was sent.
  UniqueFd u(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in dns = Addr("10.0.2.3", 53);
  ASSERT_EQ(::sendto(u.get(), "x", 1, 0, reinterpret_cast<sockaddr*>(&dns), sizeof dns), 1);
  auto to = ReceiveSteered(sink.get());
  ASSERT_TRUE(to.ok()) << to.status().ToString();
  EXPECT_EQ(*to, "10.0.2.3:53");
  // Loopback is untouched: a loopback listener gets its own connections, the steering's
  // listener none of them.
  TcpListener other = ListenTcpLoopback(0).value();
  auto c = ConnectTcpLoopback(other.port);
  ASSERT_TRUE(c.ok());
  auto accepted = AcceptTcp(other.fd.get());
  ASSERT_TRUE(accepted.ok());
  UniqueFd lo_udp(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in lo_addr = Addr("127.0.0.1", 0);
  ASSERT_EQ(::bind(lo_udp.get(), reinterpret_cast<sockaddr*>(&lo_addr), sizeof lo_addr), 0);
  socklen_t len = sizeof lo_addr;
  ::getsockname(lo_udp.get(), reinterpret_cast<sockaddr*>(&lo_addr), &len);
  ASSERT_EQ(::sendto(u.get(), "y", 1, 0, reinterpret_cast<sockaddr*>(&lo_addr), sizeof lo_addr), 1);
  char data[16];
  EXPECT_EQ(::recv(lo_udp.get(), data, sizeof data, 0), 1);
  EXPECT_FALSE(ReceiveSteered(sink.get(), MSG_DONTWAIT).ok());  // nothing more steered
}

TEST(Steering, TcpAndUdpToNonLoopbackAddressesReachTryboxInitWithTheirDestination) {
  std::string skip;
  std::thread t(SteerInANewNamespace, &skip);
  t.join();
  if (!skip.empty()) GTEST_SKIP() << skip;
}

}  // namespace
}  // namespace trybox::guest
