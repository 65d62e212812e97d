// PortRelay over socketpairs: one stands in for the virtio port (non-blocking, as trybox-init
// opens it), the other is the Mux's socket. The driver's own rules (32 KiB writes, pages
// queued per splice) are only met in a real guest: the e2e suites and the benchmark.
#include "guest/port.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <set>
#include <string>
#include <thread>

namespace trybox::guest {
namespace {

struct Session {
  UniqueFd host;  // the host's end of the "port"
  UniqueFd port;  // the guest's end, O_NONBLOCK
  UniqueFd mux;   // the Mux's end of the relay's socket
  std::unique_ptr<PortRelay> relay;
};

Session Start() {
  Session s;
  int p[2], m[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p), 0);
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, m), 0);
  s.host.Reset(p[0]);
  s.port.Reset(p[1]);
  ::fcntl(s.port.get(), F_SETFL, O_NONBLOCK);
  s.mux.Reset(m[0]);
  auto relay = PortRelay::Start(s.port.get(), UniqueFd(m[1]));
  EXPECT_TRUE(relay.ok());
  s.relay = std::move(relay).value();
  return s;
}

// A pipe's read and write ends.
std::pair<UniqueFd, UniqueFd> Pipe() {
  int p[2];
  EXPECT_EQ(::pipe2(p, O_CLOEXEC), 0);
  return {UniqueFd(p[0]), UniqueFd(p[1])};
}

std::string Pattern(size_t size) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>((i * 2654435761u) >> 9);
  return out;
}

std::string ReadExactly(int fd, size_t size) {
  std::string got(size, '\0');
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, got.data() + done, size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  got.resize(done);
  return got;
}

TEST(PortRelayTest, WriterSplicesPipeContentsToThePortByteExact) {
  Session s = Start();
  auto writer = s.relay->Writer();
  // More than one splice's worth (256 KiB), from a pipe holding all of it.
  const std::string payload = Pattern(600 * 1024 + 5);
  auto [r, w] = Pipe();
  ASSERT_GE(::fcntl(w.get(), F_SETPIPE_SZ, 1 << 20), static_cast<int>(payload.size()));
  ASSERT_TRUE(WriteFull(w.get(), payload).ok());
  std::string got;
  std::thread host([&] { got = ReadExactly(s.host.get(), payload.size()); });
  Status st = writer->Splice(r.get(), payload.size());
  host.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(got == payload) << got.size() << " of " << payload.size() << " bytes";
}

std::set<std::string> OpenFds() {
  std::set<std::string> fds;
  DIR* d = ::opendir("/proc/self/fd");
  while (struct dirent* e = d ? ::readdir(d) : nullptr) {
    if (e->d_name[0] != '.') fds.insert(e->d_name);
  }
  if (d != nullptr) ::closedir(d);
  return fds;
}

TEST(PortRelayTest, WriterKeepsNoStagingPipeBetweenFrames) {
  // Any process that can take init's descriptors (pidfd_getfd in a privileged VM) could write
  // into a staging pipe kept between frames; the next frame then left pages behind in it,
  // which the 6.1 driver turns into empty buffers that break the port for good (a hang in
  // HostileE2E). No descriptor of the writer's may outlive the frame it writes.
  Session s = Start();
  auto writer = s.relay->Writer();
  auto [r, w] = Pipe();
  ASSERT_GE(::fcntl(w.get(), F_SETPIPE_SZ, 1 << 20), 70 * 1024);
  const std::set<std::string> before = OpenFds();
  for (const std::string& part : {std::string("first frame"), Pattern(70 * 1024)}) {
    ASSERT_TRUE(WriteFull(w.get(), part).ok());
    std::string got;
    std::thread host([&] { got = ReadExactly(s.host.get(), part.size()); });
    Status st = writer->Splice(r.get(), part.size());
    host.join();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(got == part);
    EXPECT_EQ(OpenFds(), before);
  }
}

TEST(PortRelayTest, AFailedFrameEndsTheSession) {
  // A frame cut short leaves the port's framing broken: the session must stop (and the Mux
  // with it) rather than go on writing after half a frame.
  Session s = Start();
  auto writer = s.relay->Writer();
  auto [r, w] = Pipe();
  ASSERT_TRUE(WriteFull(w.get(), "short").ok());
  w.Reset();
  // The pipe holds 5 bytes, not the 100 announced.
  EXPECT_FALSE(writer->Splice(r.get(), 100).ok());
  EXPECT_NE(s.relay->Wait().find("port writer"), std::string::npos);
}

TEST(PortRelayTest, WriterWritesWholeIovecsPastTheSegmentSize) {
  Session s = Start();
  auto writer = s.relay->Writer();
  std::string header = "0123456789ab", body = Pattern(100 * 1024 + 3);
  struct iovec iov[3] = {{header.data(), header.size()}, {nullptr, 0}, {body.data(), body.size()}};
  std::string got;
  std::thread host([&] { got = ReadExactly(s.host.get(), header.size() + body.size()); });
  Status st = writer->Write(iov, 3);
  host.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(got == header + body);
}

TEST(PortRelayTest, HostBytesReachTheMuxSocket) {
  Session s = Start();
  const std::string payload = Pattern(300 * 1024);
  std::thread host([&] { ASSERT_TRUE(WriteFull(s.host.get(), payload).ok()); });
  std::string got = ReadExactly(s.mux.get(), payload.size());
  host.join();
  EXPECT_TRUE(got == payload);
}

TEST(PortRelayTest, WriterWritesNothingOnceTheSessionStopped) {
  Session s = Start();
  auto writer = s.relay->Writer();
  s.relay->Stop("test");
  char byte = 'x';
  struct iovec iov[1] = {{&byte, 1}};
  EXPECT_EQ(writer->Write(iov, 1).code(), Code::kUnavailable);
  // Nothing reached the host: its end reads nothing before the port's end closes.
  s.port.Reset();
  char got;
  EXPECT_EQ(::read(s.host.get(), &got, 1), 0);
}

}  // namespace
}  // namespace trybox::guest
