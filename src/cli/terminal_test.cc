// The CLI's terminal side without a VM: parsing of the new commands and flags, signal names,
// --host addresses, and raw mode on a real pseudo-terminal, restored by the destructor and
// by a signal that ends the process.
#include "cli/terminal.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/fd.h"

namespace trybox::cli {
namespace {

Result<Invocation> P(std::vector<std::string> a) {
  a.insert(a.begin(), "trybox");
  return Parse(a);
}

TEST(TerminalParseTest, ExecTakesCombinedInteractiveAndTtyFlags) {
  auto inv = P({"exec", "-it", "abc", "bash"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->command, "exec");
  EXPECT_TRUE(inv->exec.tty);
  EXPECT_TRUE(inv->exec.interactive);
  EXPECT_EQ(inv->argv, std::vector<std::string>{"bash"});
  inv = P({"run", "-t", "--", "top"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_TRUE(inv->exec.tty);
}

TEST(TerminalParseTest, DetachIsForExecAndHasNoInput) {
  auto inv = P({"exec", "-d", "abc", "--", "sleep", "100"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_TRUE(inv->exec.detach);
  for (const char* flag : {"-i", "-t"}) {
    auto bad = P({"exec", "-d", flag, "abc", "--", "cat"});
    ASSERT_FALSE(bad.ok()) << flag;
    EXPECT_NE(bad.status().message().find("-d"), std::string::npos);
  }
}

TEST(TerminalParseTest, ShellLogsPsKillPort) {
  auto shell = P({"shell", "abc", "-e", "A=1"});
  ASSERT_TRUE(shell.ok()) << shell.status().ToString();
  EXPECT_EQ(shell->command, "shell");
  EXPECT_EQ(shell->id, "abc");
  EXPECT_EQ(shell->exec.env, std::vector<std::string>{"A=1"});

  auto logs = P({"logs", "12", "--follow", "--offset", "4096", "--stderr"});
  ASSERT_TRUE(logs.ok()) << logs.status().ToString();
  EXPECT_EQ(logs->command, "logs");
  EXPECT_EQ(logs->term.exec_id, 12);
  EXPECT_TRUE(logs->term.follow);
  EXPECT_EQ(logs->term.offset, 4096);
  EXPECT_TRUE(logs->term.stderr);
  EXPECT_FALSE(P({"logs", "0"}).ok());
  EXPECT_FALSE(P({"logs", "x"}).ok());
  EXPECT_FALSE(P({"logs", "3", "--offset", "-1"}).ok());

  auto ps = P({"ps", "abc", "--json"});
  ASSERT_TRUE(ps.ok());
  EXPECT_EQ(ps->command, "ps");
  EXPECT_TRUE(ps->json);
  EXPECT_FALSE(P({"ps", "../x"}).ok());

  auto kill = P({"kill", "7", "--signal", "TERM"});
  ASSERT_TRUE(kill.ok());
  EXPECT_EQ(kill->command, "kill");
  EXPECT_EQ(kill->term.signal, "TERM");
  EXPECT_EQ(P({"kill", "7"})->term.signal, "KILL");
  auto bad_sig = P({"kill", "7", "-s", "NOPE"});
  ASSERT_FALSE(bad_sig.ok());
  EXPECT_NE(bad_sig.status().message().find("NOPE"), std::string::npos);

  auto port = P({"port", "abc", "8000"});
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  EXPECT_EQ(port->command, "port");
  EXPECT_EQ(port->term.guest_port, 8000);
  EXPECT_TRUE(P({"port", "abc", "8000", "--host", "127.0.0.1:0"}).ok());
  EXPECT_FALSE(P({"port", "abc", "0"}).ok());
  EXPECT_FALSE(P({"port", "abc", "70000"}).ok());
}

TEST(TerminalParseTest, ANonLoopbackListenerNeedsItsFlagAndSaysWhy) {
  auto open = P({"port", "abc", "8000", "--host", "0.0.0.0:8080"});
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("not a loopback address"), std::string::npos);
  EXPECT_NE(open.status().message().find("--allow-remote"), std::string::npos);
  EXPECT_TRUE(P({"port", "abc", "8000", "--host", "0.0.0.0:8080", "--allow-remote"}).ok());
}

TEST(TerminalParseTest, SignalsByNameOrNumber) {
  EXPECT_EQ(*ParseSignal("KILL"), SIGKILL);
  EXPECT_EQ(*ParseSignal("sigterm"), SIGTERM);
  EXPECT_EQ(*ParseSignal("SIGINT"), SIGINT);
  EXPECT_EQ(*ParseSignal("15"), 15);
  EXPECT_EQ(*ParseSignal("64"), 64);
  for (const char* bad : {"", "0", "65", "999", "-9", "9x", "SIGNOPE", "TERM "}) {
    EXPECT_FALSE(ParseSignal(bad).ok()) << bad;
  }
}

TEST(TerminalParseTest, HostAddresses) {
  auto a = ParseHostAddress("127.0.0.1:8000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8000);
  EXPECT_TRUE(a->loopback);
  EXPECT_TRUE(ParseHostAddress("127.9.9.9:0")->loopback);
  EXPECT_TRUE(ParseHostAddress("[::1]:80")->loopback);
  EXPECT_TRUE(ParseHostAddress("localhost:80")->loopback);
  EXPECT_FALSE(ParseHostAddress("0.0.0.0:80")->loopback);
  EXPECT_FALSE(ParseHostAddress("[::]:80")->loopback);
  EXPECT_FALSE(ParseHostAddress("192.168.1.2:80")->loopback);
  for (const char* bad : {"8000", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "host.test:80",
                          "[::1]80", "127.0.0.1:8x", "::1:80"}) {
    EXPECT_FALSE(ParseHostAddress(bad).ok()) << bad;
  }
}

TEST(TerminalTest, WithoutATerminalOnStdinDashTIsRefusedByName) {
  UniqueFd saved(::dup(0));
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(saved.valid() && null.valid());
  ASSERT_EQ(::dup2(null.get(), 0), 0);
  Status st = CheckTtyOnStdin();
  ::dup2(saved.get(), 0);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("-t"), std::string::npos);
  EXPECT_NE(st.message().find("standard input is not"), std::string::npos);
}

struct PtyPair {
  UniqueFd master, slave;
};

PtyPair OpenTestPty() {
  int m = -1, s = -1;
  winsize ws = {30, 100, 0, 0};
  EXPECT_EQ(::openpty(&m, &s, nullptr, nullptr, &ws), 0);
  return {UniqueFd(m), UniqueFd(s)};
}

bool Canonical(int fd) {
  termios t;
  return ::tcgetattr(fd, &t) == 0 && (t.c_lflag & ICANON) && (t.c_lflag & ECHO) &&
         (t.c_lflag & ISIG);
}

TEST(TerminalTest, RawModeIsEnteredAndRestored) {
  PtyPair p = OpenTestPty();
  ASSERT_TRUE(Canonical(p.slave.get()));
  EXPECT_EQ(WindowSize(p.slave.get()), std::make_pair(30, 100));
  {
    auto raw = RawTerminal::Enter(p.slave.get());
    ASSERT_TRUE(raw.ok()) << raw.status().ToString();
    termios t;
    ASSERT_EQ(::tcgetattr(p.slave.get(), &t), 0);
    EXPECT_FALSE(t.c_lflag & (ICANON | ECHO | ISIG));  // Ctrl-C is a byte for the guest
  }
  EXPECT_TRUE(Canonical(p.slave.get()));
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  EXPECT_FALSE(RawTerminal::Enter(null.get()).ok());
}

TEST(TerminalTest, ASignalThatEndsTheProcessRestoresTheTerminalFirst) {
  for (int sig : {SIGTERM, SIGHUP, SIGINT, SIGQUIT}) {
    PtyPair p = OpenTestPty();
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto raw = RawTerminal::Enter(p.slave.get());
      if (!raw.ok()) ::_exit(3);
      (void)!::write(ready[1], "r", 1);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    char c;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    EXPECT_FALSE(Canonical(p.slave.get()));
    ::kill(pid, sig);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << status;
    EXPECT_TRUE(Canonical(p.slave.get())) << "signal " << sig << " left the terminal raw";
  }
}

}  // namespace
}  // namespace trybox::cli
