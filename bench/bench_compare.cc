// bench_compare: prints benchmark figures beside the recorded baseline (scripts/bench.sh).
//
//   bench_compare --baseline bench/baseline.json FIGURES.json...
//   bench_compare --baseline bench/baseline.json --record --reason "why" FIGURES.json...
//
// Marks figures more than 1.5x worse than the baseline; never fails because of them (timings
// are not tests). --record replaces the baseline with these figures, and needs a reason.
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "bench/baseline.h"

int main(int argc, char** argv) {
  std::string baseline_path, reason;
  bool record = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--baseline" && i + 1 < argc) {
      baseline_path = argv[++i];
    } else if (a == "--reason" && i + 1 < argc) {
      reason = argv[++i];
    } else if (a == "--record") {
      record = true;
    } else {
      files.push_back(a);
    }
  }
  if (baseline_path.empty() || files.empty()) {
    std::fprintf(stderr,
                 "usage: bench_compare --baseline FILE [--record --reason TEXT] FIGURES...\n");
    return 2;
  }
  auto now = trybox::bench::ReadFigures(files);
  if (!now.ok()) {
    std::fprintf(stderr, "bench_compare: %s\n", now.status().message().c_str());
    return 2;
  }
  auto base = trybox::bench::ReadBaseline(baseline_path);
  if (!base.ok()) {
    std::fprintf(stderr, "bench_compare: %s\n", base.status().message().c_str());
    return 2;
  }
  std::string load = trybox::bench::LoadAverage();
  std::printf("load now: %s\n", load.c_str());
  if (base->recorded.empty()) {
    std::printf("baseline: none recorded yet (%s)\n", baseline_path.c_str());
  } else {
    std::printf("baseline: recorded %s at load %s: %s\n", base->recorded.c_str(),
                base->load.c_str(), base->reason.c_str());
  }
  int worse = 0;
  std::fputs(trybox::bench::CompareTable(*now, *base, &worse).c_str(), stdout);
  if (worse > 0) {
    std::printf("%d figure%s more than %.1fx worse than the baseline (marked WORSE)\n", worse,
                worse == 1 ? "" : "s", trybox::bench::kWorseFactor);
  }
  if (record) {
    char date[32];
    std::time_t t = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    trybox::Status st = trybox::bench::Record(baseline_path, *now, reason, load, date);
    if (!st.ok()) {
      std::fprintf(stderr, "bench_compare: %s\n", st.message().c_str());
      return 2;
    }
    std::printf("recorded %zu figures as the baseline in %s\n", now->size(), baseline_path.c_str());
  }
  return 0;
}
