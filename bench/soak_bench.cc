// Soak (issue 19, "Benchmarks"): N cycles of create / mixed execs / destroy against a
// private daemon, optionally from K clients at once. Every `--sample-every` cycles it samples
// the daemon's open descriptors (/proc/PID/fd), threads, RSS, the number of entries under
// the state directory, the store's size (database + WAL) and the QEMUs left, and at the end
// prints the growth of each per 1,000 cycles (from the first sample after the warm-up to the
// last). Run on demand, not in CI. Prints figures; asserts nothing. A failed verb stops every
// client after its cycle in flight, prints the figures so far with the failure, exits 1.
//
// Usage: soak_bench [--cycles N] [--clients K] [--sample-every S] [--warmup W]
//                   [--retention-vms V] [--prune-interval SECONDS]
// SIGINT or SIGTERM stops it after the cycles in flight, with the figures so far (and the
// private daemon stopped as usual).
// Defaults: 1000 cycles, 1 client, a sample every 100, the warm-up 200 cycles, the daemon
// keeping 100 ended VMs and pruning every 60 s (so that the state reaches its plateau
// within a short run; the defaults of tryboxd are 1000 and 600 s).
#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench/baseline.h"
#include "bench/bench_util.h"
#include "cli/client.h"
#include "tests/e2e/harness.h"

using Json = nlohmann::json;
using trybox::bench::Clock;
using trybox::bench::Die;
using trybox::bench::Ms;
using trybox::bench::Pct;
using Kind = trybox::channel::Stream::Message::Kind;

namespace {

struct Sample {
  int64_t cycles = 0;
  int64_t fds = 0;
  int64_t threads = 0;
  int64_t rss_kib = 0;
  int64_t entries = 0;
  int64_t store_bytes = 0;
  int64_t qemus = 0;
};

int64_t CountDir(const std::string& dir) {
  int64_t n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") ++n;
    }
    ::closedir(d);
  }
  return n;
}

thread_local int64_t entries;
int64_t CountTree(const std::string& dir) {
  entries = 0;
  (void)::nftw(
      dir.c_str(), [](const char*, const struct stat*, int, struct FTW*) { return ++entries, 0; },
      16, FTW_PHYS);
  return entries - 1;  // not the directory itself
}

int64_t StatusField(pid_t pid, const std::string& field) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atoll(line.c_str() + field.size() + 1);
  }
  return -1;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

Sample Take(const trybox::e2e::Harness& h, int64_t cycles) {
  Sample s;
  s.cycles = cycles;
  pid_t pid = h.daemon_pid();
  s.fds = CountDir("/proc/" + std::to_string(pid) + "/fd");
  s.threads = StatusField(pid, "Threads");
  s.rss_kib = StatusField(pid, "VmRSS");
  const std::string state = h.home() + "/state";
  s.entries = CountTree(state);
  s.store_bytes = FileSize(state + "/trybox.db") + FileSize(state + "/trybox.db-wal");
  s.qemus = static_cast<int64_t>(h.QemuPids().size());
  return s;
}

void Print(const Sample& s) {
  std::printf("%8lld %6lld %8lld %9lld %9lld %12lld %6lld\n", static_cast<long long>(s.cycles),
              static_cast<long long>(s.fds), static_cast<long long>(s.threads),
              static_cast<long long>(s.rss_kib), static_cast<long long>(s.entries),
              static_cast<long long>(s.store_bytes), static_cast<long long>(s.qemus));
  std::fflush(stdout);
}

// Runs argv; the result object of the END.
trybox::Result<Json> Exec(trybox::cli::Client& c, const std::string& vm,
                          const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(auto s, c.Open({{"verb", "exec"}, {"vm", vm}, {"argv", argv}}));
  for (;;) {
    ASSIGN_OR_RETURN(auto m, s->Next());
    if (m.kind == Kind::kEnd) {
      if (!m.body.value("ok", false)) return trybox::Internal(m.body.dump());
      return m.body["result"];
    }
  }
}

std::atomic<bool> g_stop{false};

// The first failed verb: it stops every client after its cycle in flight, and the figures
// so far are printed (never an exit with clients still running, nor a daemon left behind).
std::mutex g_failure_mu;
std::string g_failure;
void Fail(const std::string& what, const trybox::Status& st) {
  {
    std::lock_guard<std::mutex> lock(g_failure_mu);
    if (g_failure.empty()) g_failure = what + ": " + st.ToString();
  }
  g_stop = true;
}

struct Latencies {
  std::mutex mu;
  std::vector<double> create, exec, destroy;
};

// One client's share, for fairness: every client takes its next cycle from the same counter,
// so a client the daemon serves worse ends with fewer cycles and higher latencies.
struct ClientShare {
  int64_t cycles = 0;
  std::vector<double> create, exec;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t cycles = 1000, clients = 1, every = 100, warmup = 200, keep_vms = 100, prune_s = 60;
  static const char* kUsage =
      "usage: soak_bench [--cycles N] [--clients K] [--sample-every S] [--warmup W]\n"
      "                  [--retention-vms V] [--prune-interval SECONDS]\n"
      "N cycles of create / mixed execs / destroy against a private daemon (defaults: 1000\n"
      "cycles, 1 client, a sample every 100, warm-up 200, 100 ended VMs kept, a prune every\n"
      "60 s; the interval is 0 or at least 60). Prints the growth of fds, threads, RSS, state\n"
      "entries and the store per 1,000 cycles. SIGINT stops it with the figures so far.\n";
  static const std::set<std::string> kFlags = {"--cycles", "--clients",       "--sample-every",
                                               "--warmup", "--retention-vms", "--prune-interval"};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!kFlags.count(a)) {
      std::fprintf(stderr, "soak_bench: unknown argument %s\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "soak_bench: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
    char* end = nullptr;
    const long long n = std::strtoll(argv[i + 1], &end, 10);
    if (end == argv[i + 1] || *end != '\0' || n < 0) {
      std::fprintf(stderr, "soak_bench: %s needs a number, not '%s'\n", a.c_str(), argv[i + 1]);
      return 2;
    }
    ++i;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int64_t v = std::atoll(argv[i + 1]);
    if (a == "--cycles") cycles = v;
    if (a == "--clients") clients = v;
    if (a == "--sample-every") every = v;
    if (a == "--warmup") warmup = v;
    if (a == "--retention-vms") keep_vms = v;
    if (a == "--prune-interval") prune_s = v;
  }
  if (prune_s > 0 && prune_s < 60) {
    std::fprintf(stderr,
                 "soak_bench: --prune-interval must be 0 or at least 60 seconds (tryboxd "
                 "refuses less), not %lld\n",
                 static_cast<long long>(prune_s));
    return 2;
  }
  std::printf("load: %s\n", trybox::bench::LoadAverage().c_str());
  auto h = trybox::e2e::Harness::Start({"TRYBOX_RETENTION_VMS=" + std::to_string(keep_vms),
                                        "TRYBOX_PRUNE_INTERVAL_S=" + std::to_string(prune_s)});
  if (!h.ok()) Die("start tryboxd", h.status());
  ::setenv("TRYBOX_HOME", (*h)->home().c_str(), 1);
  std::printf("soak: %lld cycles, %lld client(s), retention %lld ended VMs, prune every %lld s\n",
              static_cast<long long>(cycles), static_cast<long long>(clients),
              static_cast<long long>(keep_vms), static_cast<long long>(prune_s));
  std::printf("%8s %6s %8s %9s %9s %12s %6s\n", "cycles", "fds", "threads", "rss_kib", "entries",
              "store_bytes", "qemus");

  ::signal(SIGINT, [](int) { g_stop = true; });
  ::signal(SIGTERM, [](int) { g_stop = true; });
  std::vector<Sample> samples;
  std::mutex samples_mu;
  samples.push_back(Take(**h, 0));
  Print(samples.back());
  std::atomic<int64_t> next{0}, done{0};
  Latencies lat;
  std::vector<ClientShare> shares(static_cast<size_t>(clients));
  const auto start = Clock::now();
  auto worker = [&](ClientShare& share) {
    auto client = trybox::cli::Client::Connect(trybox::Paths::FromEnvironment(), false);
    if (!client.ok()) return Fail("connect", client.status());
    auto& c = **client;
    for (;;) {
      int64_t i = next.fetch_add(1);
      if (i >= cycles || g_stop.load()) return;
      auto t0 = Clock::now();
      auto r = c.Call({{"verb", "create"}, {"image", "debian-12"}});
      if (!r.ok()) return Fail("create", r.status());
      const std::string vm = (*r)["vm"]["id"];
      auto t1 = Clock::now();
      // The mixed workload: a command, output on both streams, a failing one, some bulk.
      std::vector<double> execs;
      for (const auto& cmd : std::vector<std::vector<std::string>>{
               {"true"},
               {"sh", "-c", "echo out; echo err >&2"},
               {"sh", "-c", i % 2 ? "exit 3" : "head -c 65536 /dev/zero"}}) {
        auto e0 = Clock::now();
        auto e = Exec(c, vm, cmd);
        if (!e.ok()) {
          (void)c.Call({{"verb", "destroy"}, {"vm", vm}});
          return Fail("exec", e.status());
        }
        execs.push_back(Ms(e0, Clock::now()));
      }
      auto t2 = Clock::now();
      auto d = c.Call({{"verb", "destroy"}, {"vm", vm}});
      if (!d.ok()) return Fail("destroy", d.status());
      auto t3 = Clock::now();
      {
        std::lock_guard<std::mutex> lock(lat.mu);
        lat.create.push_back(Ms(t0, t1));
        lat.exec.insert(lat.exec.end(), execs.begin(), execs.end());
        lat.destroy.push_back(Ms(t2, t3));
      }
      ++share.cycles;
      share.create.push_back(Ms(t0, t1));
      share.exec.insert(share.exec.end(), execs.begin(), execs.end());
      int64_t n = done.fetch_add(1) + 1;
      if (n % every == 0) {
        std::lock_guard<std::mutex> lock(samples_mu);
        samples.push_back(Take(**h, n));
        Print(samples.back());
      }
    }
  };
  std::vector<std::thread> threads;
  for (auto& share : shares) threads.emplace_back(worker, std::ref(share));
  for (auto& t : threads) t.join();
  const double secs = Ms(start, Clock::now()) / 1000;

  const int64_t ran = done.load();
  std::printf("\n%lld cycles in %.0f s (%.2f cycles/s)%s\n", static_cast<long long>(ran), secs,
              static_cast<double>(ran) / secs,
              !g_failure.empty() ? ", stopped by a failure"
              : g_stop           ? ", stopped by a signal"
                                 : "");
  if (!g_failure.empty()) std::printf("failure: %s\n", g_failure.c_str());
  std::printf(
      "latency ms  create p50 %.0f p99 %.0f | exec p50 %.0f p99 %.0f | destroy p50 %.0f "
      "p99 %.0f\n",
      Pct(lat.create, 50), Pct(lat.create, 99), Pct(lat.exec, 50), Pct(lat.exec, 99),
      Pct(lat.destroy, 50), Pct(lat.destroy, 99));
  if (clients > 1) {
    // Fairness: each client's cycles and latencies, and the spread between the best- and
    // worst-served client.
    std::printf("per client: cycles, create p50/p99 ms, exec p50/p99 ms\n");
    double lo = 0, hi = 0;
    for (size_t k = 0; k < shares.size(); ++k) {
      const auto& s = shares[k];
      std::printf("  client %2zu %6lld   %6.0f %6.0f   %6.0f %6.0f\n", k + 1,
                  static_cast<long long>(s.cycles), Pct(s.create, 50), Pct(s.create, 99),
                  Pct(s.exec, 50), Pct(s.exec, 99));
      double p = Pct(s.exec, 50);
      if (k == 0 || p < lo) lo = p;
      if (k == 0 || p > hi) hi = p;
    }
    std::printf("exec p50 across clients: best %.0f ms, worst %.0f ms (%.2fx)\n", lo, hi,
                lo > 0 ? hi / lo : 0.0);
  }
  // Growth from the first sample at or after the warm-up to the last.
  const Sample* base = nullptr;
  for (const auto& s : samples) {
    if (s.cycles >= warmup) {
      base = &s;
      break;
    }
  }
  const Sample& last = samples.back();
  if (!base || last.cycles <= base->cycles) {
    std::printf("too few samples after the warm-up (%lld cycles) for growth figures\n",
                static_cast<long long>(warmup));
    return g_failure.empty() ? 0 : 1;
  }
  const double per = 1000.0 / static_cast<double>(last.cycles - base->cycles);
  auto g = [&](int64_t a, int64_t b) { return static_cast<double>(b - a) * per; };
  std::printf(
      "growth per 1,000 cycles (cycles %lld -> %lld): fds %+.1f, threads %+.1f, RSS %+.0f "
      "KiB, state entries %+.1f, store %+.0f bytes, qemus %+.1f\n",
      static_cast<long long>(base->cycles), static_cast<long long>(last.cycles),
      g(base->fds, last.fds), g(base->threads, last.threads), g(base->rss_kib, last.rss_kib),
      g(base->entries, last.entries), g(base->store_bytes, last.store_bytes),
      g(base->qemus, last.qemus));
  return g_failure.empty() ? 0 : 1;
}
