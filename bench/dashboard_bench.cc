// The dashboard's live output (docs/dashboard.md): per line a guest prints, the time until it
// shows on the VM page in headless Chromium (tests/ui/bench.mjs, puppeteer-core), beside the
// time until a plain client of the same server-sent events route gets it. The guest stamps
// each line with its own clock (`date +%s%N`). A guest's clock is set from the host's, but
// under TCG it was seen tens of ms behind, so the offset is bounded before and after each
// round (a `date` run through the exec verb must fall between the host's readings around
// the call) and the middle of the bounds is subtracted; the bounds are printed. Prints
// figures; asserts nothing.
//
// With --load: the dashboard's cost instead (tests/ui/load.mjs): VMS VMs, STREAMING of them
// printing a line every 100 ms, and tryboxd's CPU and memory without a browser and with
// headless Chromium on the overview and each printing VM's page; Chromium's own beside it.
//
// Usage: dashboard_bench [--rounds R] [--lines N] [--interval-ms MS] [--figures FILE]
//        dashboard_bench --load [--vms N] [--streaming N] [--seconds S]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "bench/baseline.h"
#include "bench/bench_util.h"
#include "tests/e2e/harness.h"
#include "util/process.h"

using Json = nlohmann::json;
using trybox::bench::Fail;
using trybox::bench::Pct;

namespace {

void Print(const char* what, const std::vector<double>& v) {
  std::printf("  %-44s n=%-3zu p50 %7.1f ms  p99 %7.1f ms  max %7.1f ms\n", what, v.size(),
              Pct(v, 50), Pct(v, 99), Pct(v, 100));
}

double WallMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Guest clock minus host clock, in ms: at least `lo`, at most `hi`.
struct ClockBounds {
  double lo = -1e18;
  double hi = 1e18;
};

// Narrows `b` with `n` readings of the guest's clock. Each `date` runs inside one exec verb
// call (no CLI process in the timed span); its output is read afterwards.
void Narrow(const trybox::e2e::Harness& h, const std::string& vm, int n, ClockBounds* b) {
  for (int i = 0; i < n; ++i) {
    const double t0 = WallMs();
    auto r = h.Call(
        {{"verb", "exec"}, {"vm", vm}, {"argv", {"sh", "-c", "date +%s%N > /tmp/bench-clock"}}});
    const double t1 = WallMs();
    if (!r.ok()) Fail("exec date", r.status());
    auto c = h.Cli({"exec", vm, "--", "cat", "/tmp/bench-clock"});
    if (c.code != 0) Fail("cat the reading", trybox::Internal(c.err));
    const double guest = std::stod(c.out) / 1e6;
    b->lo = std::max(b->lo, guest - t1);
    b->hi = std::min(b->hi, guest - t0);
  }
}

// Host-clock latencies of `seen` ({seen: host ms, printed: guest ns}) given the offset.
// Lines over a second late are named ("round R line N: MS").
void AddLatencies(const Json& seen, double offset_ms, int round, std::vector<double>* out,
                  std::string* late) {
  for (const Json& x : seen) {
    const double printed = std::stod(x["printed"].get<std::string>()) / 1e6 - offset_ms;
    const double ms = x["seen"].get<double>() - printed;
    out->push_back(ms);
    if (ms > 1000) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " round %d line %d: %.0f ms;", round, x["n"].get<int>(), ms);
      *late += buf;
    }
  }
}

// The load figures of load.mjs's JSON.
void PrintLoad(const Json& j) {
  std::printf("%d VMs, %d printing a line every 100 ms; %d s per measurement\n", j.value("vms", 0),
              j.value("streaming", 0), j.value("seconds", 0));
  auto row = [](const char* what, const Json& m) {
    std::printf("  %-52s CPU %6.1f%% of a core  RSS mean %7.1f MiB  peak %7.1f MiB\n", what,
                m.value("cpu_percent_of_a_core", 0.0), m.value("rss_mean_mib", 0.0),
                m.value("rss_peak_mib", 0.0));
  };
  row("tryboxd, no browser", j["without"]);
  row("tryboxd, the overview and each printing VM's page open", j["with"]);
  row("Chromium (all its processes), those pages", j["chromium"]);
  std::printf("  lines shown on the VM pages at the end: %d\n", j.value("lines_shown", 0));
}

}  // namespace

int Run(int argc, char** argv) {
  int rounds = 1, lines = 30, interval_ms = 200;
  bool load = false;
  int vms = 20, streaming = 5, seconds = 20;
  std::string figures_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--lines" && i + 1 < argc) {
      lines = std::atoi(argv[++i]);
    } else if (a == "--interval-ms" && i + 1 < argc) {
      interval_ms = std::atoi(argv[++i]);
    } else if (a == "--figures" && i + 1 < argc) {
      figures_path = argv[++i];
    } else if (a == "--load") {
      load = true;
    } else if (a == "--vms" && i + 1 < argc) {
      vms = std::atoi(argv[++i]);
    } else if (a == "--streaming" && i + 1 < argc) {
      streaming = std::atoi(argv[++i]);
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: dashboard_bench [--rounds R] [--lines N] [--interval-ms MS] "
                   "[--figures FILE]\n"
                   "       dashboard_bench --load [--vms N] [--streaming N] [--seconds S]\n");
      return 2;
    }
  }
  const std::string script = std::string(TRYBOX_SOURCE_DIR) + "/tests/ui/bench.mjs";
  if (::access((std::string(TRYBOX_SOURCE_DIR) + "/tests/ui/node_modules/puppeteer-core").c_str(),
               F_OK)) {
    std::fprintf(stderr, "bench: run npm ci --prefix tests/ui first\n");
    return 1;
  }
  auto h = trybox::e2e::Harness::Start();
  if (!h.ok()) Fail("start tryboxd", h.status());
  auto serve = (*h)->Cli({"serve"});
  std::smatch m;
  if (serve.code != 0 ||
      !std::regex_search(serve.out, m, std::regex("http://127\\.0\\.0\\.1:[0-9]+"))) {
    Fail("serve", trybox::Internal(serve.err));
  }
  auto k = (*h)->Cli({"api-key", "create", "bench", "--operator"});
  if (k.code != 0) Fail("api-key create", trybox::Internal(k.err));
  std::vector<std::string> env = (*h)->Env();
  env.push_back("TRYBOX_URL=" + m[0].str());
  env.push_back("TRYBOX_OPERATOR_KEY=" + k.out.substr(0, k.out.find('\n')));
  env.push_back("TRYBOX_CLI=" + trybox::e2e::BinDir() + "/trybox");
  if (load) {
    auto status = (*h)->Call({{"verb", "daemon_status"}});
    if (!status.ok()) Fail("daemon_status", status.status());
    env.push_back("TRYBOX_DAEMON_PID=" + std::to_string(status->value("pid", 0)));
    auto run = trybox::e2e::RunProgram(
        {trybox::FindInPath("node").value_or("node"),
         std::string(TRYBOX_SOURCE_DIR) + "/tests/ui/load.mjs", std::to_string(vms),
         std::to_string(streaming), std::to_string(seconds)},
        env);
    Json j = Json::parse(run.out, nullptr, false);
    if (run.code != 0 || !j.is_object()) Fail("load.mjs", trybox::Internal(run.err + run.out));
    PrintLoad(j);
    return 0;
  }
  auto c = (*h)->Cli({"create", "--quiet"});
  if (c.code != 0) Fail("trybox create", trybox::Internal(c.err));
  const std::string vm = c.out.substr(0, c.out.find('\n'));

  std::vector<double> page, sse;
  std::string late_page, late_sse;
  std::vector<ClockBounds> clocks;
  for (int r = 0; r < rounds; ++r) {
    ClockBounds clock;
    Narrow(**h, vm, 10, &clock);
    auto run = trybox::e2e::RunProgram({trybox::FindInPath("node").value_or("node"), script, vm,
                                        std::to_string(lines), std::to_string(interval_ms)},
                                       env);
    Json j = Json::parse(run.out, nullptr, false);
    if (run.code != 0 || !j.is_object()) Fail("bench.mjs", trybox::Internal(run.err + run.out));
    Narrow(**h, vm, 10, &clock);
    if (clock.lo > clock.hi) {
      std::fprintf(stderr,
                   "bench: the guest's clock moved against the host's during round %d "
                   "(bounds %.2f > %.2f ms); its figures use the middle\n",
                   r, clock.lo, clock.hi);
    }
    const double offset = (clock.lo + clock.hi) / 2;
    AddLatencies(j["page"], offset, r, &page, &late_page);
    AddLatencies(j["sse"], offset, r, &sse, &late_sse);
    clocks.push_back(clock);
  }
  (void)(*h)->Cli({"rm", vm});

  std::printf("a guest line until it is shown, %d round(s) of %d lines %d ms apart\n", rounds,
              lines, interval_ms);
  Print("on the VM page (MutationObserver)", page);
  Print("to a plain reader of the SSE route", sse);
  if (!late_page.empty()) std::printf("over a second on the page:%s\n", late_page.c_str());
  if (!late_sse.empty()) std::printf("over a second to the SSE reader:%s\n", late_sse.c_str());
  for (size_t i = 0; i < clocks.size(); ++i) {
    std::printf(
        "round %zu: guest clock minus host clock in [%.2f, %.2f] ms; figures use %.2f "
        "(each +/- %.2f)\n",
        i, clocks[i].lo, clocks[i].hi, (clocks[i].lo + clocks[i].hi) / 2,
        std::abs(clocks[i].hi - clocks[i].lo) / 2);
  }
  trybox::bench::FiguresFile figures(figures_path);
  figures.Lower("dashboard.output_page_p50_ms", Pct(page, 50), "ms",
                "a guest line until shown on the VM page, p50");
  figures.Lower("dashboard.output_page_p99_ms", Pct(page, 99), "ms",
                "a guest line until shown on the VM page, p99");
  figures.Lower("dashboard.output_sse_p50_ms", Pct(sse, 50), "ms",
                "a guest line until a plain SSE reader has it, p50");
  (void)figures.Write();
  return 0;
}

int main(int argc, char** argv) {
  return trybox::bench::Guarded([&] { return Run(argc, argv); });
}
