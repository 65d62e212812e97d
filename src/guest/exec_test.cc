// The exec request served for real over a Mux on a socketpair: a Reaper, real processes and
// the real credential changes, with accounts from files of the test's own. The reaper calls
// waitpid(-1), which would steal other tests' children, so each case runs in a re-executed
// copy of this binary (a threadsafe death test), as in spawn_test.cc. Needs root (the unit
// tests run as root here and in CI); skipped otherwise.
#include "guest/exec.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>

#include "util/fd.h"

namespace trybox::guest {
namespace {

using channel::Json;
using channel::Mux;
using channel::Stream;

struct Reply {
  bool started = false;
  std::string out, err;
  Json end;
};

// /proc/self/status of the command, or of this process.
std::string StatusField(const std::string& status, const std::string& key) {
  size_t at = status.find("\n" + key + ":");
  if (at == std::string::npos) return "";
  at = status.find_first_not_of(" \t", at + key.size() + 2);
  return status.substr(at, status.find('\n', at) - at);
}

class Guest {
 public:
  explicit Guest(const std::string& dir) : dir_(dir) {
    ::mkdir((dir + "/home").c_str(), 0755);
    char* real = ::realpath((dir + "/home").c_str(), nullptr);  // as pwd prints it
    home_ = real ? real : "";
    std::free(real);
    options_.accounts = {dir + "/passwd", dir + "/group"};
    options_.cgroups = false;
    (void)WriteFileAtomic(options_.accounts.passwd,
                          "root:x:0:0:root:/root:/bin/bash\n"
                          "tester:x:4321:4321:Test:" +
                              home_ + ":/bin/sh\n");
    (void)WriteFileAtomic(options_.accounts.group, "tester:x:4321:\nextra:x:4400:root,tester\n");
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
    host_ = std::make_unique<Mux>(UniqueFd(sv[0]), channel::Role::kHost);
    guest_ = std::make_unique<Mux>(UniqueFd(sv[1]), channel::Role::kGuest);
    guest_->OnOpen([this](std::shared_ptr<Stream> s, Json req) {
      ServeExec(reaper_, *s, req, options_);
      std::lock_guard<std::mutex> lock(mu_);
      served_wakeups_ = s->wakeups();
      served_cv_.notify_all();
    });
    reaper_.Start();
    guest_->Start();
    host_->Start();
  }

  Reply Exec(Json req) {
    req["op"] = "exec";
    Reply r;
    auto s = host_->Open(req);
    if (!s.ok()) return r;
    for (;;) {
      auto m = (*s)->Next(std::chrono::steady_clock::now() + std::chrono::seconds(30));
      if (!m.ok()) return r;
      if (m->kind == Stream::Message::Kind::kEvent) r.started |= m->body["type"] == "started";
      if (m->kind == Stream::Message::Kind::kData) {
        (m->channel == channel::kChanOut ? r.out : r.err) += m->data;
      }
      if (m->kind == Stream::Message::Kind::kEnd || m->kind == Stream::Message::Kind::kReset) {
        r.end = m->body;
        return r;
      }
    }
  }

  // Once the last ServeExec has returned: how often its stream's reader went to sleep.
  uint64_t ServedWakeups() {
    std::unique_lock<std::mutex> lock(mu_);
    served_cv_.wait(lock, [&] { return served_wakeups_.has_value(); });
    return *std::exchange(served_wakeups_, std::nullopt);
  }

  // An exec stream the test drives itself (input, events).
  std::shared_ptr<Stream> Open(Json req) {
    req["op"] = "exec";
    auto s = host_->Open(req);
    return s.ok() ? *s : nullptr;
  }

  const std::string& home() const { return home_; }
  ExecOptions& options() { return options_; }

 private:
  std::mutex mu_;
  std::condition_variable served_cv_;
  std::optional<uint64_t> served_wakeups_;
  std::string dir_, home_;
  ExecOptions options_;
  Reaper reaper_;
  std::unique_ptr<Mux> host_, guest_;
};

// /proc/self/status of this process before InChild changed anything.
std::string g_own_status;

// Runs `body` in a death-test child with a fresh Guest; the child exits 0 iff no check in
// it failed. `like_init`: the child first prepares its capabilities as trybox-init's main()
// does (LimitBoundingSetForChildren).
void InChild(const std::function<void(Guest&, int& failures)>& body, bool like_init = true) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (setuid to a test account)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // Before any thread starts: the reaper takes SIGCHLD with sigwaitinfo.
        BlockChildSignal();
        g_own_status = ReadFileToString("/proc/self/status").value_or("");
        if (like_init && LimitBoundingSetForChildren() != 0) std::_Exit(4);
        int code = 3;
        {
          // Removed when this scope ends: _Exit below runs no destructor.
          auto dir = TempDir::Make(::testing::TempDir(), "exec_test");
          if (dir.ok() && ::chmod(dir->path().c_str(), 0755) == 0) {
            int failures = 0;
            {
              Guest g(dir->path());
              body(g, failures);
            }
            code = failures == 0 ? 0 : 1;
          }
        }
        std::fflush(stderr);
        std::_Exit(code);
      },
      ::testing::ExitedWithCode(0), "");
}

#define CHECK_IN_CHILD(cond, what)                                                \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "FAILED: %s: %s\n", #cond, std::string(what).c_str()); \
      ++failures;                                                                 \
    }                                                                             \
  } while (0)

std::string Dump(const Reply& r) { return r.end.dump() + "\nout: " + r.out + "\nerr: " + r.err; }

TEST(ExecTest, AnAccountRunsWithItsIdsNoCapabilitiesAndNoNewPrivs) {
  InChild([](Guest& g, int& failures) {
    Reply r =
        g.Exec({{"argv", {"sh", "-c", "cat /proc/self/status; echo \"$HOME $USER $LOGNAME\"; pwd"}},
                {"user", "tester"}});
    CHECK_IN_CHILD(r.end.value("outcome", "") == "exited" && r.end.value("exit_code", -1) == 0,
                   Dump(r));
    const std::string& s = r.out;
    CHECK_IN_CHILD(StatusField(s, "Uid") == "4321\t4321\t4321\t4321", Dump(r));
    CHECK_IN_CHILD(StatusField(s, "Gid") == "4321\t4321\t4321\t4321", Dump(r));
    CHECK_IN_CHILD(StatusField(s, "Groups").rfind("4321 4400", 0) == 0, Dump(r));
    CHECK_IN_CHILD(StatusField(s, "NoNewPrivs") == "1", Dump(r));
    for (const char* set : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}) {
      CHECK_IN_CHILD(StatusField(s, set) == "0000000000000000", std::string(set) + ": " + Dump(r));
    }
    // HOME, USER, LOGNAME from passwd; the default working directory is the home.
    CHECK_IN_CHILD(
        s.find("\n" + g.home() + " tester tester\n" + g.home() + "\n") != std::string::npos,
        Dump(r));
    // The request's env wins over the account's.
    Reply env = g.Exec({{"argv", {"sh", "-c", "echo $HOME"}},
                        {"user", "tester"},
                        {"env", {{"HOME", "/tmp"}}},
                        {"cwd", "/"}});
    CHECK_IN_CHILD(env.out == "/tmp\n", Dump(env));
  });
}

void ExpectRootCommandSet(Guest& g, int& failures) {
  const uint64_t mine = std::stoull(StatusField(g_own_status, "CapBnd"), nullptr, 16);
  Reply r = g.Exec({{"argv", {"cat", "/proc/self/status"}}, {"cwd", "/"}});
  CHECK_IN_CHILD(r.end.value("exit_code", -1) == 0, Dump(r));
  const uint64_t bnd = std::stoull(StatusField(r.out, "CapBnd"), nullptr, 16);
  const uint64_t eff = std::stoull(StatusField(r.out, "CapEff"), nullptr, 16);
  CHECK_IN_CHILD(bnd == (mine & kCommandCapabilities), Dump(r));
  CHECK_IN_CHILD(eff == bnd, Dump(r));
  CHECK_IN_CHILD(StatusField(r.out, "CapPrm") == StatusField(r.out, "CapBnd"), Dump(r));
  CHECK_IN_CHILD(StatusField(r.out, "CapInh") == "0000000000000000", Dump(r));
  CHECK_IN_CHILD(StatusField(r.out, "CapAmb") == "0000000000000000", Dump(r));
  CHECK_IN_CHILD(StatusField(r.out, "Uid") == "0\t0\t0\t0", Dump(r));
  CHECK_IN_CHILD(StatusField(r.out, "NoNewPrivs") == "0", Dump(r));  // root keeps setuid
  for (int cap : {16, 17, 19, 21, 22, 27, 38, 39}) {  // module rawio ptrace admin boot mknod...
    CHECK_IN_CHILD((bnd & CapBit(cap)) == 0, "capability " + std::to_string(cap));
  }
}

TEST(ExecTest, DefaultRootCommandLacksEveryDroppedCapability) { InChild(ExpectRootCommandSet); }

// The same set when the parent has not prepared its bounding set (the child then drops
// every capability itself): correctness never rests on the start-up step.
TEST(ExecTest, DefaultRootCommandLacksThemWithoutTheStartUpStepToo) {
  InChild(ExpectRootCommandSet, /*like_init=*/false);
}

TEST(ExecTest, PrivilegedRootCommandKeepsTheFullSet) {
  for (bool like_init : {true, false}) {
    InChild(
        [](Guest& g, int& failures) {
          Reply r = g.Exec({{"argv", {"cat", "/proc/self/status"}}, {"privileged", true}});
          CHECK_IN_CHILD(r.end.value("exit_code", -1) == 0, Dump(r));
          // Every capability this process had, dropped ones included.
          CHECK_IN_CHILD(StatusField(r.out, "CapPrm") == StatusField(g_own_status, "CapPrm"),
                         Dump(r));
          CHECK_IN_CHILD(StatusField(r.out, "CapEff") == StatusField(g_own_status, "CapPrm"),
                         Dump(r));
        },
        like_init);
  }
}

TEST(ExecTest, UnknownUserEndsWithItsOwnErrorAndRunsNothing) {
  InChild([](Guest& g, int& failures) {
    const std::string mark = g.home() + "/ran";
    Reply r = g.Exec({{"argv", {"touch", mark}}, {"user", "no-such-user"}});
    CHECK_IN_CHILD(r.end.value("outcome", "") == "error", Dump(r));
    CHECK_IN_CHILD(r.end.value("error", "") == "unknown_user", Dump(r));
    CHECK_IN_CHILD(r.end.value("message", "").find("no-such-user") != std::string::npos, Dump(r));
    CHECK_IN_CHILD(!r.started, Dump(r));
    CHECK_IN_CHILD(::access(mark.c_str(), F_OK) != 0, "the command ran");
    // Account files that cannot be read are a different failure, not an unknown user.
    g.options().accounts.passwd = g.home() + "/missing-passwd";
    Reply gone = g.Exec({{"argv", {"touch", mark}}, {"user", "tester"}});
    CHECK_IN_CHILD(gone.end.value("error", "") == "user_lookup_failed", Dump(gone));
    CHECK_IN_CHILD(::access(mark.c_str(), F_OK) != 0, "the command ran");
  });
}

TEST(ExecTest, PrivilegedWithAnAccountIsABadRequestAndRunsNothing) {
  InChild([](Guest& g, int& failures) {
    const std::string mark = g.home() + "/ran";
    Reply r = g.Exec({{"argv", {"touch", mark}}, {"user", "tester"}, {"privileged", true}});
    CHECK_IN_CHILD(r.end.value("error", "") == "bad_request", Dump(r));
    CHECK_IN_CHILD(r.end.value("message", "").find("privileged") != std::string::npos, Dump(r));
    CHECK_IN_CHILD(!r.started && ::access(mark.c_str(), F_OK) != 0, Dump(r));
  });
}

TEST(ExecTest, FloatOrHugeTimeoutIsABadRequest) {
  InChild([](Guest& g, int& failures) {
    for (const char* t : {"4294967.297", "1e20", "18446744073709551616"}) {
      Reply r = g.Exec(Json::parse(std::string(R"({"argv": ["true"], "timeout_ms": )") + t + "}"));
      CHECK_IN_CHILD(r.end.value("error", "") == "bad_request", Dump(r));
      CHECK_IN_CHILD(r.end.value("message", "").find("timeout_ms") != std::string::npos, Dump(r));
      CHECK_IN_CHILD(!r.started, Dump(r));
    }
  });
}

// The thread that takes the host's input and cancellation sleeps until there is some, or
// until the exec is over: it never wakes on a timer while the command runs.
TEST(ExecTest, ControlThreadHasNoPeriodicWakeUp) {
  InChild([](Guest& g, int& failures) {
    Reply r = g.Exec({{"argv", {"sleep", "0.45"}}, {"timeout_ms", 60000}});
    CHECK_IN_CHILD(r.end.value("outcome", "") == "exited", Dump(r));
    // One sleep for the whole run (the deadline is far away), woken by the exec's end.
    uint64_t wakeups = g.ServedWakeups();
    CHECK_IN_CHILD(wakeups <= 2, "the control thread woke " + std::to_string(wakeups) + " times");
  });
}

// Reads `s` into `r` until `done(r)` holds or the stream ends; false on its end.
bool ReadUntil(Stream& s, Reply& r, const std::function<bool(const Reply&)>& done) {
  while (!done(r)) {
    auto m = s.Next(std::chrono::steady_clock::now() + std::chrono::seconds(30));
    if (!m.ok()) return false;
    if (m->kind == Stream::Message::Kind::kEvent) r.started |= m->body["type"] == "started";
    if (m->kind == Stream::Message::Kind::kData) {
      (m->channel == channel::kChanOut ? r.out : r.err) += m->data;
    }
    if (m->kind == Stream::Message::Kind::kEnd || m->kind == Stream::Message::Kind::kReset) {
      r.end = m->body;
      if (m->kind == Stream::Message::Kind::kReset) r.end["reset"] = true;
      return done(r);
    }
  }
  return true;
}

bool Has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

auto Printed(const std::string& text) {
  return [text](const Reply& r) { return Has(r.out, text); };
}
const auto kEnded = [](const Reply& r) { return !r.end.is_null(); };

// Dead: no such process, or a zombie (an orphan is reaped by whoever is PID 1 here).
bool Gone(pid_t pid) {
  for (int i = 0; i < 500; ++i) {  // up to 5 s for the kill to land
    auto stat = ReadFileToString("/proc/" + std::to_string(pid) + "/stat");
    if (!stat.ok()) return true;
    size_t paren = stat->rfind(')');
    if (paren != std::string::npos && stat->compare(paren + 1, 3, " Z ") == 0) return true;
    ::usleep(10000);
  }
  return false;
}

TEST(ExecTest, TtyExecRunsOnItsOwnControllingTerminalOfTheGivenSize) {
  InChild([](Guest& g, int& failures) {
    Reply r = g.Exec({{"argv",
                       {"sh", "-c",
                        "tty; stty size; test -t 0 && test -t 1 && test -t 2 && echo three-ttys; "
                        "exec 3</dev/tty && echo has-ctty; echo to-err >&2; exit 4"}},
                      {"tty", {{"rows", 33}, {"cols", 101}}}});
    CHECK_IN_CHILD(r.end.value("outcome", "") == "exited" && r.end.value("exit_code", -1) == 4,
                   Dump(r));
    CHECK_IN_CHILD(Has(r.out, "/dev/pts/"), Dump(r));
    CHECK_IN_CHILD(Has(r.out, "33 101\r\n"), Dump(r));
    CHECK_IN_CHILD(Has(r.out, "three-ttys") && Has(r.out, "has-ctty"), Dump(r));
    // stderr is the terminal too: one stream, on channel 1.
    CHECK_IN_CHILD(Has(r.out, "to-err") && r.err.empty(), Dump(r));
  });
}

TEST(ExecTest, TtyInputGoesThroughTheLineDisciplineAndResizesReachTheCommand) {
  InChild([](Guest& g, int& failures) {
    auto s = g.Open({{"argv", {"sh", "-c", "echo ready; read line; echo \"got $line\"; stty size"}},
                     {"tty", {{"rows", 24}, {"cols", 80}}}});
    Reply r;
    CHECK_IN_CHILD(s && ReadUntil(*s, r, Printed("ready")), Dump(r));
    if (!s) return;
    (void)s->SendEvent({{"type", "resize"}, {"rows", 50}, {"cols", 120}});
    // Typed, a mistake erased with DEL (the terminal's erase character), then enter.
    (void)s->Write(channel::kChanIn, "hellp\x7fo\r");
    CHECK_IN_CHILD(ReadUntil(*s, r, kEnded), Dump(r));
    CHECK_IN_CHILD(Has(r.out, "got hello\r\n"), Dump(r));
    CHECK_IN_CHILD(Has(r.out, "50 120\r\n"), Dump(r));
    CHECK_IN_CHILD(r.end.value("exit_code", -1) == 0, Dump(r));
  });
}

TEST(ExecTest, CtrlCInterruptsTheForegroundCommandNotTheShell) {
  InChild([](Guest& g, int& failures) {
    auto s =
        g.Open({{"argv",
                 {"sh", "-c",
                  "trap 'echo caught' INT; sh -c 'echo ready; exec sleep 100'; echo \"after $?\""}},
                {"tty", {{"rows", 24}, {"cols", 80}}}});
    Reply r;
    CHECK_IN_CHILD(s && ReadUntil(*s, r, Printed("ready")), Dump(r));
    if (!s) return;
    (void)s->Write(channel::kChanIn, "\x03");
    CHECK_IN_CHILD(ReadUntil(*s, r, kEnded), Dump(r));
    CHECK_IN_CHILD(Has(r.out, "caught") && Has(r.out, "after 130"), Dump(r));
    CHECK_IN_CHILD(r.end.value("exit_code", -1) == 0, Dump(r));
  });
}

TEST(ExecTest, ASignalEventEndsTheCommandAndTakesItsLeftoversWithIt) {
  InChild([](Guest& g, int& failures) {
    // The background child ignores SIGTERM; only the rule that a signalled exec's tree goes
    // when it ends can stop it (after a normal end it would be left running).
    auto s = g.Open(
        {{"argv", {"sh", "-c", "sh -c 'trap \"\" TERM; echo child $$; exec sleep 300' & wait"}}});
    Reply r;
    auto child_line = [](const Reply& r) {
      size_t at = r.out.find("child ");
      return at != std::string::npos && r.out.find('\n', at) != std::string::npos;
    };
    CHECK_IN_CHILD(s && ReadUntil(*s, r, child_line), Dump(r));
    if (!s) return;
    size_t at = r.out.find("child ");
    pid_t child = at == std::string::npos ? 0 : std::atoi(r.out.c_str() + at + 6);
    CHECK_IN_CHILD(child > 0, Dump(r));
    (void)s->SendEvent({{"type", "signal"}, {"signal", SIGTERM}});
    CHECK_IN_CHILD(ReadUntil(*s, r, kEnded), Dump(r));
    CHECK_IN_CHILD(r.end.value("outcome", "") == "signaled" && r.end.value("signal", 0) == SIGTERM,
                   Dump(r));
    CHECK_IN_CHILD(child > 0 && Gone(child), "the TERM-proof child survived: " + Dump(r));
  });
}

TEST(ExecTest, ABadEventResetsTheStreamAndKillsTheCommand) {
  InChild([](Guest& g, int& failures) {
    auto s = g.Open(
        {{"argv", {"sh", "-c", "echo $$; exec sleep 300"}}, {"tty", {{"rows", 24}, {"cols", 80}}}});
    Reply r;
    CHECK_IN_CHILD(s && ReadUntil(*s, r, [](const Reply& r) { return Has(r.out, "\n"); }), Dump(r));
    if (!s) return;
    pid_t pid = std::atoi(r.out.c_str());
    // An unknown type is a newer host's and ignored; a known one with a bad field is not.
    (void)s->SendEvent({{"type", "from-the-future"}});
    (void)s->SendEvent({{"type", "resize"}, {"rows", 0}, {"cols", 80}});
    CHECK_IN_CHILD(ReadUntil(*s, r, kEnded), Dump(r));
    CHECK_IN_CHILD(r.end.value("reset", false), Dump(r));
    CHECK_IN_CHILD(Has(r.end.value("reason", ""), "resize.rows"), Dump(r));
    CHECK_IN_CHILD(pid > 0 && Gone(pid), "the command survived a reset: " + Dump(r));
  });
}

}  // namespace
}  // namespace trybox::guest
