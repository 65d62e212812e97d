// Template benchmarks (issue 3). Prints figures; asserts nothing.
//
//   create -> first exec reply: cold boot, restore from the template, and a warmed spare
//   `trybox run -- true` end to end through the CLI, daemon already running
//   host memory (PSS) per idle restored VM with N running, beside a cold-booted VM's
//   where the restore's time goes (phases reported by the daemon)
//
//   ten `trybox run -- true` back to back (no wait for a spare), beside Anthropic's `srt`
//   process sandbox doing `true` when it is installed
//
// Usage: template_bench [--restores N] [--cold N] [--runs N] [--idle N] [--memory MIB]
//                       [--on-demand 0|1] [--back-to-back N] [--quick] [--figures FILE]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/baseline.h"
#include "bench/bench_util.h"
#include "cli/client.h"
#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/paths.h"
#include "util/process.h"

using trybox::Status;
using Json = nlohmann::json;
using Clock = trybox::bench::Clock;
using Kind = trybox::channel::Stream::Message::Kind;

namespace {

int g_memory = 256;

using trybox::bench::Die;
using trybox::bench::Ms;
using trybox::bench::Pct;

struct Bench {
  std::unique_ptr<trybox::e2e::Harness> h;
  std::unique_ptr<trybox::cli::Client> c;
};

Bench Start(int spares) {
  Bench b;
  auto h = trybox::e2e::Harness::Start({"TRYBOX_SPARES=" + std::to_string(spares)});
  if (!h.ok()) Die("start tryboxd", h.status());
  b.h = std::move(*h);
  ::setenv("TRYBOX_HOME", b.h->home().c_str(), 1);
  auto c = trybox::cli::Client::Connect(trybox::Paths::FromEnvironment(), false);
  if (!c.ok()) Die("connect", c.status());
  b.c = std::move(*c);
  return b;
}

Json Create(trybox::cli::Client& c, bool cold) {
  auto r = c.Call({{"verb", "create"}, {"memory_mib", g_memory}, {"cold", cold}});
  if (!r.ok()) Die("create", r.status());
  return (*r)["vm"];
}

void ExecTrue(trybox::cli::Client& c, const std::string& vm) {
  auto s = c.Open({{"verb", "exec"}, {"vm", vm}, {"argv", {"true"}}});
  if (!s.ok()) Die("exec", s.status());
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) Die("exec", m.status());
    if (m->kind == Kind::kEnd) {
      if (m->body["result"].value("exit_code", -1) != 0) {
        Die("exec", trybox::Internal("true did not exit 0: " + m->body.dump()));
      }
      return;
    }
  }
}

void Destroy(trybox::cli::Client& c, const std::string& vm) {
  (void)c.Call({{"verb", "destroy"}, {"vm", vm}});
}

// Polls doctor until a spare clone is ready (up to a minute).
void WaitForSpare(Bench& b) {
  for (int k = 0; k < 3000; ++k) {
    auto d = b.c->Call({{"verb", "doctor"}});
    int ready = 0;
    if (d.ok()) {
      for (const auto& [shape, count] : (*d)["spares"].items()) ready += count.get<int>();
    }
    if (ready > 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Ready spares and the pool's target summed over shapes, as doctor reports them.
std::pair<int, int> PoolReadyAndTarget(Bench& b) {
  auto d = b.c->Call({{"verb", "doctor"}});
  int ready = 0, target = 0;
  if (d.ok() && (*d)["spare_pool"].contains("shapes")) {
    for (const auto& [shape, v] : (*d)["spare_pool"]["shapes"].items()) {
      ready += v.value("ready", 0);
      target += v.value("target", 0);
    }
  }
  return {ready, target};
}

// Polls doctor until the pool holds its target (up to `limit`); returns the ready count.
int WaitForPool(Bench& b, std::chrono::seconds limit) {
  auto until = Clock::now() + limit;
  auto [ready, target] = PoolReadyAndTarget(b);
  while (ready < target && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::tie(ready, target) = PoolReadyAndTarget(b);
  }
  return ready;
}

// create -> first exec reply, n times. Fills `phases` with the daemon's per-phase times.
std::vector<double> CreateToFirstExec(Bench& b, int n, bool cold, bool wait_for_spare,
                                      std::map<std::string, std::vector<double>>* phases,
                                      int* spare_hits) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    if (wait_for_spare) WaitForSpare(b);
    auto t0 = Clock::now();
    Json vm = Create(*b.c, cold);
    const double created = Ms(t0, Clock::now());
    ExecTrue(*b.c, vm["id"]);
    out.push_back(Ms(t0, Clock::now()));
    if (phases) {
      (*phases)["create_reply"].push_back(created);
      for (const auto& [k, v] : vm["phases_ms"].items()) {
        if (v.is_number()) (*phases)[k].push_back(v.get<double>());
        if (v.is_object()) {
          for (const auto& [k2, v2] : v.items())
            (*phases)[k + "." + k2].push_back(v2.get<double>());
        }
      }
    }
    if (spare_hits && vm["start"].value("spare", false)) ++*spare_hits;
    Destroy(*b.c, vm["id"]);
  }
  return out;
}

// `trybox run --memory M -- true` through the real CLI binary.
std::vector<double> RunTrue(Bench& b, int n, bool wait_for_spare) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    if (wait_for_spare) WaitForSpare(b);
    auto t0 = Clock::now();
    auto r = b.h->Cli({"run", "--memory", std::to_string(g_memory), "--", "true"});
    if (r.code != 0) Die("run", trybox::Internal("exit " + std::to_string(r.code) + ": " + r.err));
    out.push_back(Ms(t0, Clock::now()));
  }
  return out;
}

// Proportional and resident set size of a VM's QEMU, in MiB.
std::pair<double, double> PssRss(Bench& b, const std::string& vm) {
  auto pid = trybox::ReadFileToString(b.h->vms_dir() + "/" + vm + "/qemu.pid");
  if (!pid.ok()) Die("qemu.pid", pid.status());
  auto rollup = trybox::ReadFileToString("/proc/" + *pid + "/smaps_rollup");
  if (!rollup.ok()) Die("smaps_rollup", rollup.status());
  auto field = [&](const char* name) {
    size_t at = rollup->find(std::string("\n") + name + ":");
    return at == std::string::npos ? 0.0
                                   : std::atof(rollup->c_str() + at + strlen(name) + 2) / 1024;
  };
  return {field("Pss"), field("Rss")};
}

void PrintPct(const char* what, const std::vector<double>& v) {
  std::printf("%-44s n=%-3zu p50 %7.0f ms  p99 %7.0f ms\n", what, v.size(), Pct(v, 50), Pct(v, 99));
}

}  // namespace

// `srt true` (Anthropic's sandbox-runtime), n times, if `srt` is on PATH; empty otherwise.
std::vector<double> SrtTrue(Bench& b, int n) {
  std::vector<double> out;
  auto srt = trybox::FindInPath("srt");
  if (!srt) return out;
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    auto r = trybox::e2e::RunProgram({*srt, "true"}, b.h->Env());
    if (r.code != 0) return {};
    out.push_back(Ms(t0, Clock::now()));
  }
  return out;
}

int main(int argc, char** argv) {
  int restores = 30, colds = 5, runs = 20, idle = 10, ondemand = 1, back_to_back = 10;
  std::string figures_path;
  // Each section starts a daemon of its own and points TRYBOX_HOME at it; the images stay
  // where they were before the first (the harness would look under the last one's home).
  ::setenv("TRYBOX_IMAGES", trybox::Paths::FromEnvironment().images.c_str(), 0);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      ondemand = 0;
      restores = 10;
      runs = 10;
      continue;
    }
    if (i + 1 >= argc) break;
    const char* next = argv[++i];
    int v = std::atoi(next);
    if (a == "--restores") restores = v;
    if (a == "--cold") colds = v;
    if (a == "--runs") runs = v;
    if (a == "--idle") idle = v;
    if (a == "--memory") g_memory = v;
    if (a == "--on-demand") ondemand = v;  // 0: only the spare section
    if (a == "--back-to-back") back_to_back = v;
    if (a == "--figures") figures_path = next;
  }
  trybox::bench::FiguresFile figures(figures_path);
  std::printf("guest memory %d MiB, 1 vCPU; load %s\n", g_memory,
              trybox::bench::LoadAverage().c_str());

  // On demand: no spare clones, every create restores.
  if (ondemand) {
    Bench b = Start(0);
    auto doc = b.c->Call({{"verb", "doctor"}});
    std::printf("accel: %s\n", (*doc)["accel"]["accel"].dump().c_str());
    auto t0 = Clock::now();
    Json first = Create(*b.c, false);
    std::printf("template build (cold boot + save), first create: %.0f ms\n", Ms(t0, Clock::now()));
    Destroy(*b.c, first["id"]);

    auto cold = CreateToFirstExec(b, colds, true, false, nullptr, nullptr);
    std::map<std::string, std::vector<double>> phases;
    auto restored = CreateToFirstExec(b, restores, false, false, &phases, nullptr);
    auto run = RunTrue(b, runs, false);
    PrintPct("cold boot: create -> first exec reply", cold);
    PrintPct("restore: create -> first exec reply", restored);
    std::printf("  ratio cold/restore (p50): %.1fx\n", Pct(cold, 50) / Pct(restored, 50));
    std::printf("  restore phases, p50 ms from start:");
    for (const char* k : {"spawned", "monitor_ready", "incoming_started", "hello", "identified"}) {
      std::printf(" %s %.0f", k, Pct(phases[k], 50));
    }
    std::printf(" (identity alone %.0f)\n", Pct(phases["identity_ms"], 50));
    PrintPct("trybox run -- true (restore on demand)", run);

    // Memory: N idle restored clones, and a cold-booted VM for comparison.
    std::vector<std::string> ids;
    for (int i = 0; i < idle; ++i) ids.push_back(Create(*b.c, false)["id"]);
    Json cold_vm = Create(*b.c, true);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    double pss = 0, rss = 0;
    for (const auto& id : ids) {
      auto [p, r] = PssRss(b, id);
      pss += p;
      rss += r;
    }
    auto [cold_pss, cold_rss] = PssRss(b, cold_vm["id"]);
    std::printf("idle restored VM, %d running: PSS %.1f MiB, RSS %.1f MiB (mean per VM)\n", idle,
                pss / idle, rss / idle);
    std::printf("idle cold-booted VM: PSS %.1f MiB, RSS %.1f MiB\n", cold_pss, cold_rss);
    for (const auto& id : ids) Destroy(*b.c, id);
    Destroy(*b.c, cold_vm["id"]);
  }

  // A warmed spare clone ready for each create (the default).
  {
    Bench b = Start(1);
    Destroy(*b.c, Create(*b.c, false)["id"]);  // builds the template
    int hits = 0;
    std::map<std::string, std::vector<double>> phases;
    auto pooled = CreateToFirstExec(b, restores, false, true, &phases, &hits);
    auto run = RunTrue(b, runs, true);
    PrintPct("spare: create -> first exec reply", pooled);
    std::printf(
        "  %d of %zu creates took a spare; create reply p50 %.1f ms, of which setting the clock "
        "p50 %.1f ms (it was off by p50 %.2f ms)\n",
        hits, pooled.size(), Pct(phases["create_reply"], 50), Pct(phases["clock_ms"], 50),
        Pct(phases["clock_offset_ms"], 50));
    std::printf(
        "  identity when the spare was made, p50 %.0f ms (in the guest: reseed %.1f ms, clock "
        "%.1f ms, names %.1f ms)\n",
        Pct(phases["identity_ms"], 50), Pct(phases["identity_guest_us.reseed"], 50) / 1000,
        Pct(phases["identity_guest_us.clock"], 50) / 1000,
        Pct(phases["identity_guest_us.names"], 50) / 1000);
    // CPU, not wall time: on two cores the refills share them with each other and with the
    // runs they feed, so what one spare costs in CPU bounds how fast a burst can go.
    std::printf(
        "  CPU of making one spare, its QEMU's, p50: %.0f ms (at the guest's hello %.0f, "
        "identified %.0f, then warmed)\n",
        Pct(phases["cpu_at_ready_ms"], 50), Pct(phases["cpu_at_hello_ms"], 50),
        Pct(phases["cpu_at_identified_ms"], 50));
    figures.Lower("start.spare_cpu_p50_ms", Pct(phases["cpu_at_ready_ms"], 50), "ms",
                  "CPU of making one spare (its QEMU), p50");
    PrintPct("trybox run -- true (spare ready)", run);
    // Back to back: each run starts as soon as the last one ended, spare or not; first
    // right after the runs above, then once the pool has grown to what they asked for.
    auto burst = RunTrue(b, back_to_back, false);
    PrintPct("trybox run -- true, back to back", burst);
    auto [ready, target] = PoolReadyAndTarget(b);
    if (auto d = b.c->Call({{"verb", "doctor"}}); d.ok() && (*d)["spare_pool"].is_object()) {
      std::printf("  refills at a time: %d\n", (*d)["spare_pool"].value("refill_workers", 1));
    }
    int grown = WaitForPool(b, std::chrono::seconds(60));
    auto burst_grown = RunTrue(b, back_to_back, false);
    std::printf(
        "  pool after the burst: %d ready of a target of %d; filled to %d before the next\n", ready,
        target, grown);
    PrintPct("trybox run -- true, back to back, pool grown", burst_grown);
    auto srt = SrtTrue(b, back_to_back);
    if (srt.empty()) {
      std::printf("srt (Anthropic sandbox-runtime): not installed here, no comparison\n");
    } else {
      PrintPct("srt true, back to back", srt);
      figures.Lower("peer.srt_true_back_to_back_p50_ms", Pct(srt, 50), "ms",
                    "peer: srt true, back to back, p50");
    }
    figures.Lower("start.spare_create_first_exec_p50_ms", Pct(pooled, 50), "ms",
                  "spare: create -> first exec reply, p50");
    figures.Lower("start.run_true_spare_p50_ms", Pct(run, 50), "ms",
                  "trybox run -- true, spare ready, p50");
    figures.Lower("start.run_true_back_to_back_p50_ms", Pct(burst, 50), "ms",
                  "trybox run -- true, back to back, p50");
    figures.Lower("start.run_true_back_to_back_grown_p50_ms", Pct(burst_grown, 50), "ms",
                  "  the same once the pool has grown, p50");
  }
  std::printf("load %s\n", trybox::bench::LoadAverage().c_str());
  Status st = figures.Write();
  if (!st.ok()) Die("write figures", st);
  return 0;
}
