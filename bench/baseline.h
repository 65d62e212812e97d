// Benchmark figures and the recorded baseline they are compared with (scripts/bench.sh).
//
// A bench run writes its headline figures to a JSON file (FiguresFile); bench_compare reads
// every such file, prints each figure beside the one recorded in bench/baseline.json, and
// marks those more than kWorseFactor worse. Timings are not tests: nothing here fails a
// build. The baseline changes only through Record(), which needs a reason and stores it
// with the date and the machine's load.
//
// Files (docs/performance.md, "Regression guard"):
//   figures:  {"figures": [{"name", "value", "unit", "better": "lower"|"higher", "what"}],
//              "load": "1.2 0.9 0.8"}
//   baseline: {"recorded": ISO date, "reason": text, "load": text,
//              "figures": {name: {"value", "unit", "better", "what"}}}
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace trybox::bench {

inline constexpr double kWorseFactor = 1.5;

struct Figure {
  std::string name;  // stable key, e.g. "exec.round_trip_p50_ms"
  double value = 0;
  std::string unit;  // "ms", "MB/s", "x"
  bool lower_is_better = true;
  std::string what;  // words for the table
};

// Collects one bench run's figures; Write() saves them (a no-op without a path).
class FiguresFile {
 public:
  explicit FiguresFile(std::string path = "") : path_(std::move(path)) {}
  void Lower(const std::string& name, double value, const std::string& unit,
             const std::string& what) {
    figures_.push_back({name, value, unit, true, what});
  }
  void Higher(const std::string& name, double value, const std::string& unit,
              const std::string& what) {
    figures_.push_back({name, value, unit, false, what});
  }
  Status Write() const;
  const std::vector<Figure>& figures() const { return figures_; }

 private:
  std::string path_;
  std::vector<Figure> figures_;
};

// How much worse `now` is than `base` (1.0 = same; 2.0 = twice as bad), whichever way the
// figure is better. 0 when either is missing or not positive.
double WorseBy(const Figure& now, double base);

// Figures from files written by FiguresFile (later files win on a repeated name).
Result<std::vector<Figure>> ReadFigures(const std::vector<std::string>& paths);

struct Baseline {
  std::string recorded;  // ISO-8601 UTC date
  std::string reason;
  std::string load;
  std::map<std::string, Figure> figures;
};
// A missing file is an empty baseline (the first run records one).
Result<Baseline> ReadBaseline(const std::string& path);

// A peer's figure (named "peer.*": a program trybox's code is not on the path of, measured
// in the same guest and run) says how fast the machine is, not how fast trybox is.
inline constexpr char kPeerPrefix[] = "peer.";
inline constexpr char kQgaRoundTrip[] = "peer.qga_round_trip_p50_ms";

// How much slower this machine runs guests than the one the baseline was recorded on:
// qemu-guest-agent's exec round trip now over then (then: the figure, or from a baseline
// older than it, exec.qga_ratio x exec.round_trip_p50_ms). nullopt when either is missing.
std::optional<double> MachineFactor(const std::vector<Figure>& now, const Baseline& base);

// The table: each figure, the baseline's, the factor, and "WORSE" past kWorseFactor (never
// a peer's figure), then the machine's factor when it is known.
// *worse receives how many were marked.
std::string CompareTable(const std::vector<Figure>& now, const Baseline& base, int* worse);

// Writes `now` as the new baseline. A reason is required: the baseline moves only on purpose.
Status Record(const std::string& path, const std::vector<Figure>& now, const std::string& reason,
              const std::string& load, const std::string& date);

// "1.2 0.9 0.8" from /proc/loadavg.
std::string LoadAverage();

}  // namespace trybox::bench
