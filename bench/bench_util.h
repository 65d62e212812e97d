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

}  // namespace trybox::bench
