// ChildProcess::Spawn's isolation options (egress layer 1 for QEMU): a fresh network
// namespace, inherited fds at 3.., and a uid drop. Run as root these test the root path; run
// as another user (setpriv --reuid) new_netns goes through a user namespace.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "util/fd.h"
#include "util/process.h"

namespace trybox {
namespace {

std::string SelfNetNs() {
  char buf[64] = {};
  ssize_t n = ::readlink("/proc/self/ns/net", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// Runs `script` with `opts` and returns what it wrote to stdout.
std::string Output(SpawnOptions opts, const std::string& script) {
  int p[2];
  EXPECT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd r(p[0]), w(p[1]);
  opts.argv = {"/bin/sh", "-c", script};
  opts.stdout_fd = w.get();
  auto child = ChildProcess::Spawn(opts);
  EXPECT_TRUE(child.ok()) << child.status().ToString();
  w.Reset();
  std::string out;
  char buf[4096];
  for (;;) {
    auto n = ReadSome(r.get(), buf, sizeof buf);
    if (!n.ok() || *n == 0) break;
    out.append(buf, *n);
  }
  if (child.ok()) (void)child->Wait();
  return out;
}

TEST(SpawnIsolation, NewNetnsHasOnlyLoopback) {
  SpawnOptions o;
  o.new_netns = true;
  std::string out = Output(o, "readlink /proc/self/ns/net; tail -n +3 /proc/net/dev | cut -d: -f1");
  ASSERT_FALSE(out.empty());
  std::string ns = out.substr(0, out.find('\n'));
  EXPECT_NE(ns, SelfNetNs());
  EXPECT_EQ(out.substr(out.find('\n') + 1), "    lo\n");
}

TEST(SpawnIsolation, KeptFdsArriveAsThreeAndFourAndNothingElse) {
  int a[2], b[2];
  ASSERT_EQ(::pipe2(a, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(b, O_CLOEXEC), 0);
  UniqueFd ar(a[0]), aw(a[1]), br(b[0]), bw(b[1]);
  SpawnOptions o;
  o.keep_fds = {aw.get(), bw.get()};
  std::string out = Output(o, "echo three >&3; echo four >&4; ls /proc/self/fd");
  aw.Reset();
  bw.Reset();
  char buf[16] = {};
  ASSERT_TRUE(ReadSome(ar.get(), buf, sizeof buf).ok());
  EXPECT_STREQ(buf, "three\n");
  char buf2[16] = {};
  ASSERT_TRUE(ReadSome(br.get(), buf2, sizeof buf2).ok());
  EXPECT_STREQ(buf2, "four\n");
  // 0-2, 3, 4, and the fd ls itself opens for the directory.
  EXPECT_EQ(out, "0\n1\n2\n3\n4\n5\n");
}

TEST(SpawnIsolation, RootDropsToTheGivenUidWithNoGroups) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  SpawnOptions o;
  o.uid = 2000065000;
  o.gid = 2000065000;
  EXPECT_EQ(Output(o, "id -u; id -g; id -G"), "2000065000\n2000065000\n2000065000\n");
}

}  // namespace
}  // namespace trybox
