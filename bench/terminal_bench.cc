// Terminal and kept-output benchmarks (issue 14). Prints figures; asserts nothing.
//
//   keystroke echo in `trybox shell`   p50/p99: a byte written to the pty the real CLI runs
//                                      on, until bash's echo of it comes back on that pty
//   `logs --follow` lag                p50/p99: per line, the follower's arrival minus the
//                                      attached exec stream's arrival of the same line
//   exec stream throughput             MB/s with output kept (default cap) and with nothing
//                                      kept (cap 0): two daemons, rounds alternated in one
//                                      run, the ratio of medians
//
// Usage: terminal_bench [--keys N] [--lines N] [--rounds N] [--stream-mib N]
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "cli/client.h"
#include "daemon/exec_logs.h"
#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/process.h"

using Json = nlohmann::json;
using Clock = trybox::bench::Clock;
using Kind = trybox::channel::Stream::Message::Kind;
using trybox::bench::Die;
using trybox::bench::Ms;
using trybox::bench::Pct;

namespace {

struct Daemon {
  std::unique_ptr<trybox::e2e::Harness> h;
  std::unique_ptr<trybox::cli::Client> c;
  std::string vm;
};

Daemon Start(std::vector<std::string> env) {
  Daemon d;
  auto h = trybox::e2e::Harness::Start(std::move(env));
  if (!h.ok()) Die("start tryboxd", h.status());
  d.h = std::move(*h);
  ::setenv("TRYBOX_HOME", d.h->home().c_str(), 1);
  auto c = trybox::cli::Client::Connect(trybox::Paths::FromEnvironment(), false);
  if (!c.ok()) Die("connect", c.status());
  d.c = std::move(*c);
  auto r = d.c->Call({{"verb", "create"}});
  if (!r.ok()) Die("create", r.status());
  d.vm = (*r)["vm"]["id"];
  return d;
}

// Streams `mib` MiB of stdout; MB/s.
double Stream(Daemon& d, int mib) {
  auto t0 = Clock::now();
  auto s = d.c->Open({{"verb", "exec"},
                      {"vm", d.vm},
                      {"argv", {"head", "-c", std::to_string(mib) + "M", "/dev/zero"}}});
  if (!s.ok()) Die("exec", s.status());
  uint64_t bytes = 0;
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) Die("exec", m.status());
    if (m->kind == Kind::kData) bytes += m->data.size();
    if (m->kind == Kind::kEnd) break;
  }
  return static_cast<double>(bytes) / 1e6 / (Ms(t0, Clock::now()) / 1000);
}

// Reads the pty master until `want` has appeared in what was read since `from`.
bool ReadUntil(int fd, std::string& seen, size_t from, const std::string& want, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (seen.find(want, from) == std::string::npos) {
    int left = static_cast<int>(Ms(Clock::now(), deadline));
    if (left <= 0) return false;
    pollfd p = {fd, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) return false;
    char buf[4096];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    seen.append(buf, static_cast<size_t>(n));
  }
  return true;
}

// `trybox shell` on a pty of ours; the echo of each typed byte, in ms.
std::vector<double> Keystrokes(Daemon& d, int keys) {
  int master = -1, slave = -1;
  winsize ws = {50, 400, 0, 0};  // wide: the typed line never wraps
  if (::openpty(&master, &slave, nullptr, nullptr, &ws) != 0) Die("openpty", trybox::Status());
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    ::ioctl(slave, TIOCSCTTY, 0);
    ::dup2(slave, 0);
    ::dup2(slave, 1);
    ::dup2(slave, 2);
    ::close(master);
    std::string cli = trybox::e2e::BinDir() + "/trybox";
    ::execl(cli.c_str(), cli.c_str(), "shell", d.vm.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(slave);
  trybox::UniqueFd m(master);
  std::string seen;
  if (!ReadUntil(m.get(), seen, 0, "# ", 60000)) {
    std::fprintf(stderr, "bench: no prompt from trybox shell: %s\n", seen.c_str());
    std::exit(1);
  }
  std::vector<double> out;
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyz";
  for (int i = 0; i < keys + 5; ++i) {
    const char k = alphabet[static_cast<size_t>(i) % alphabet.size()];
    size_t from = seen.size();
    auto t0 = Clock::now();
    (void)!::write(m.get(), &k, 1);
    if (!ReadUntil(m.get(), seen, from, std::string(1, k), 10000)) Die("echo", trybox::Status());
    if (i >= 5) out.push_back(Ms(t0, Clock::now()));
  }
  (void)!::write(m.get(),
                 "\x15"
                 "exit\r",
                 6);  // Ctrl-U (no signal, no race with the line), exit
  int status;
  ::waitpid(pid, &status, 0);
  return out;
}

// The follower's lag behind the attached stream, per line, in ms.
std::vector<double> FollowLag(Daemon& d, int lines) {
  const std::string script =
      "echo start; while [ ! -e /tmp/go ]; do sleep 0.05; done; i=0; while [ $i -lt " +
      std::to_string(lines) + " ]; do i=$((i+1)); echo line-$i; sleep 0.05; done";
  auto s = d.c->Open({{"verb", "exec"}, {"vm", d.vm}, {"argv", {"sh", "-c", script}}});
  if (!s.ok()) Die("exec", s.status());
  std::mutex mu;
  std::map<std::string, Clock::time_point> attached, followed;
  std::atomic<bool> started{false};
  std::thread reader([&] {
    std::string buf;
    for (;;) {
      auto m = (*s)->Next();
      if (!m.ok() || m->kind == Kind::kEnd) return;
      if (m->kind != Kind::kData) continue;
      auto now = Clock::now();
      buf += m->data;
      for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
        std::lock_guard<std::mutex> l(mu);
        attached[buf.substr(0, nl)] = now;
        if (buf.compare(0, nl, "start") == 0) started = true;
      }
    }
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // The running exec's id, from the record.
  auto ps = d.c->Call({{"verb", "ps"}, {"vm", d.vm}});
  if (!ps.ok()) Die("ps", ps.status());
  int64_t id = 0;
  for (const auto& e : (*ps)["execs"]) {
    if (e["state"] == "running") id = e["id"];
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) Die("pipe", trybox::Status());
  trybox::UniqueFd rd(p[0]), wr(p[1]);
  trybox::SpawnOptions o;
  o.argv = {trybox::e2e::BinDir() + "/trybox", "logs", "--follow", std::to_string(id)};
  o.env = d.h->Env();
  o.stdout_fd = wr.get();
  auto child = trybox::ChildProcess::Spawn(o);
  if (!child.ok()) Die("logs", child.status());
  wr.Reset();
  std::string buf;
  bool touched = false;
  for (;;) {
    char tmp[4096];
    auto n = trybox::ReadSome(rd.get(), tmp, sizeof tmp);
    if (!n.ok() || *n == 0) break;
    auto now = Clock::now();
    buf.append(tmp, *n);
    for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
      std::string line = buf.substr(0, nl);
      {
        std::lock_guard<std::mutex> l(mu);
        followed[line] = now;
      }
      if (line == "start" && !touched) {
        touched = true;
        auto go = d.c->Call({{"verb", "exec"}, {"vm", d.vm}, {"argv", {"touch", "/tmp/go"}}});
        if (!go.ok()) Die("touch", go.status());
      }
    }
  }
  (void)child->Wait();
  reader.join();
  std::vector<double> lag;
  for (const auto& [line, t] : followed) {
    if (line == "start" || !attached.count(line)) continue;
    lag.push_back(Ms(attached[line], t));
  }
  (void)d.c->Call({{"verb", "exec"}, {"vm", d.vm}, {"argv", {"rm", "-f", "/tmp/go"}}});
  return lag;
}

// The log's own cost on the exec path: ExecLog::Append of 256 KiB chunks (a full DATA
// frame), in-process, into the default cap. Microseconds per chunk.
std::vector<double> AppendCost(const std::string& dir) {
  trybox::daemon::ExecLogs logs(dir, trybox::daemon::kDefaultExecLogCap);
  auto log = logs.Start("bench", 1);
  const std::string chunk(256 * 1024, 'x');
  std::vector<double> us;
  for (int i = 0; i < 400; ++i) {  // 100 MiB: the ring wraps many times
    auto t0 = Clock::now();
    log->Append(trybox::channel::kChanOut, chunk);
    us.push_back(Ms(t0, Clock::now()) * 1000);
  }
  logs.Finish(1);
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  int keys = 200, lines = 100, rounds = 5, stream_mib = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (a == "--keys") keys = std::min(v, 340);  // one line of the 400-column terminal
    if (a == "--lines") lines = v;
    if (a == "--rounds") rounds = v;
    if (a == "--stream-mib") stream_mib = v;
  }
  ::signal(SIGPIPE, SIG_IGN);
  // Start() points TRYBOX_HOME at each daemon's home in turn; the images stay where they are.
  ::setenv("TRYBOX_IMAGES", trybox::Paths::FromEnvironment().images.c_str(), 1);
  Daemon kept = Start({});
  Daemon bare = Start({"TRYBOX_EXEC_LOG_CAP=0"});
  ::setenv("TRYBOX_HOME", kept.h->home().c_str(), 1);

  std::vector<double> with, without;
  Stream(kept, 8);  // warm both paths up
  Stream(bare, 8);
  for (int r = 0; r < rounds; ++r) {
    with.push_back(Stream(kept, stream_mib));
    without.push_back(Stream(bare, stream_mib));
  }
  auto tmp = trybox::TempDir::Make("/tmp", "tbx-bench-logs-");
  if (!tmp.ok()) Die("temp dir", tmp.status());
  std::vector<double> append = AppendCost(tmp->path());
  std::vector<double> echo = Keystrokes(kept, keys);
  std::vector<double> lag = FollowLag(kept, lines);

  std::printf("keystroke echo in trybox shell (n=%zu): p50 %.2f ms  p99 %.2f ms\n", echo.size(),
              Pct(echo, 50), Pct(echo, 99));
  std::printf(
      "logs --follow lag behind the attached stream (n=%zu lines): p50 %.2f ms  p99 %.2f ms\n",
      lag.size(), Pct(lag, 50), Pct(lag, 99));
  std::printf(
      "exec stream throughput (%d MiB, %d rounds alternated): output kept %.1f MB/s, not kept "
      "%.1f MB/s (medians); ratio %.2f\n",
      stream_mib, rounds, Pct(with, 50), Pct(without, 50), Pct(with, 50) / Pct(without, 50));
  std::printf(
      "  the log's own cost: ExecLog::Append of a 256 KiB chunk p50 %.0f us p99 %.0f us "
      "(%.0f MB/s)\n",
      Pct(append, 50), Pct(append, 99), 0.262144 / (Pct(append, 50) / 1e6));
  std::printf("  rounds kept:");
  for (double v : with) std::printf(" %.1f", v);
  std::printf("\n  rounds not kept:");
  for (double v : without) std::printf(" %.1f", v);
  std::printf("\n");
  (void)kept.c->Call({{"verb", "destroy"}, {"vm", kept.vm}});
  (void)bare.c->Call({{"verb", "destroy"}, {"vm", bare.vm}});
  return 0;
}
