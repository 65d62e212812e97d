// What every benchmark here needs: elapsed milliseconds, percentiles, and a loud exit.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "util/status.h"

namespace trybox::bench {

using Clock = std::chrono::steady_clock;

inline double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The p-th percentile (0..100) by nearest rank; 0 for no samples.
inline double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

[[noreturn]] inline void Die(const std::string& what, const Status& st) {
  std::fprintf(stderr, "bench: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

// A failed step, thrown by Fail instead of exit()ing, so that what the bench set up (a
// harness's daemon and VMs, temporary directories) is cleaned up on the way out; main runs
// the bench through Guarded, which prints it and returns 1.
struct BenchFailure {
  std::string message;
};

[[noreturn]] inline void Fail(const std::string& what, const Status& st) {
  throw BenchFailure{what + ": " + st.ToString()};
}

template <typename Body>
int Guarded(Body&& body) {
  try {
    return body();
  } catch (const BenchFailure& f) {
    std::fprintf(stderr, "bench: %s\n", f.message.c_str());
    return 1;
  }
}

}  // namespace trybox::bench
