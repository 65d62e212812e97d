// SparePool: the warmed spare clones kept per template (a machine shape), how many each
// shape should have, and which idle ones to let go (docs/templates.md, "Spare clones").
//
// Sizing. A shape's target is the number of VMs of that shape created in the last
// `demand_window` (a burst of ten creates asks for ten spares), and at least `min_spares`
// once the shape has been used, all within one memory budget shared by every shape (a
// spare counts at its whole memory size). A create asks for refills at once. A create
// that finds no spare ready while one is being prepared claims that one and waits for it,
// rather than restoring a clone of its own beside it. A spare left idle for `idle_release`
// while its shape holds more than its target is released; NextRelease() says when the next
// one could be, so nothing polls.
//
// The pool keeps state and decides; its owner (VmLauncher) restores, warms and destroys. T
// is the owner's spare (a VM and its uid lease; an int in tests). Time is passed in, so
// tests drive it. Thread-safe: one mutex, never held while a spare is made or destroyed.
#pragma once

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "util/mutex.h"

namespace trybox::daemon {

struct SparePoolOptions {
  int min_spares = 1;                // kept per shape in use; 0 turns spares off
  int64_t memory_budget_mib = 2048;  // all spares of all shapes together
  std::chrono::seconds demand_window{60};
  std::chrono::seconds idle_release{60};
};

template <typename T>
class SparePool {
 public:
  using Clock = std::chrono::steady_clock;
  using Time = Clock::time_point;

  explicit SparePool(SparePoolOptions o) : opts_(o) {}

  bool enabled() const { return opts_.min_spares > 0 && opts_.memory_budget_mib > 0; }

  // A create of `shape` (`memory_mib` each) at `now`, counted as demand. Returns a ready
  // spare for which `fits` holds, newest first; the ready ones that do not fit (an older
  // template) are moved to *stale for the caller to destroy. With none ready but a refill
  // under way that no other create has claimed, waits for that one until `deadline`.
  std::optional<T> Take(const std::string& shape, int memory_mib, Time now, Time deadline,
                        const std::function<bool(const T&)>& fits, std::vector<T>* stale)
      EXCLUDES(mu_) {
    MutexLock lock(mu_);
    Shape& s = shapes_[shape];
    s.memory_mib = memory_mib;
    s.used = true;
    s.demand.push_back(now);
    Prune(s, now);
    while (!s.ready.empty()) {
      Ready r = std::move(s.ready.back());
      s.ready.pop_back();
      if (fits(r.spare)) return std::move(r.spare);
      stale->push_back(std::move(r.spare));
    }
    if (stopping_ || s.refilling <= s.claimed) return std::nullopt;
    ++s.claimed;
    for (;;) {
      if (!s.handoff.empty()) {
        std::optional<T> got = std::move(s.handoff.front());
        s.handoff.pop_front();
        if (got && !fits(*got)) {
          stale->push_back(std::move(*got));
          return std::nullopt;
        }
        return got;
      }
      if (stopping_ || !cv_.WaitUntil(mu_, deadline)) break;
    }
    // Gave up: the refill, when it ends, goes to the ready list instead.
    if (!s.handoff.empty()) {
      std::optional<T> got = std::move(s.handoff.front());
      s.handoff.pop_front();
      if (got && fits(*got)) return got;
      if (got) stale->push_back(std::move(*got));
      return std::nullopt;
    }
    --s.claimed;
    return std::nullopt;
  }

  // How many more spares `shape` should have now: its target less those ready and being
  // prepared, within the budget. A refill starts with BeginRefill (or RefillStarted).
  int Wanted(const std::string& shape, int memory_mib, Time now) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    Shape& s = shapes_[shape];
    s.memory_mib = memory_mib;
    Prune(s, now);
    return WantedOf(s, now);
  }

  // Starts one refill of `shape` if it wants one (Wanted > 0), in one step: refills run on
  // several threads at once, and two of them must not both take the last one wanted.
  bool BeginRefill(const std::string& shape, int memory_mib, Time now) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    Shape& s = shapes_[shape];
    s.memory_mib = memory_mib;
    Prune(s, now);
    if (WantedOf(s, now) <= 0) return false;
    ++s.refilling;
    return true;
  }

  void RefillStarted(const std::string& shape) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ++shapes_[shape].refilling;
  }

  // True while a create waits for a refill of `shape` (the refill may then hurry).
  bool Claimed(const std::string& shape) const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto it = shapes_.find(shape);
    return it != shapes_.end() && it->second.claimed > 0;
  }

  // A refill ended, with a spare or without one (it failed). The spare goes to a create
  // waiting for it, else to the ready list (`to_ready` runs on it first, under the pool's
  // lock, so no create takes it meanwhile); when the pool is stopping it is given back for
  // the caller to destroy.
  std::optional<T> RefillDone(const std::string& shape, std::optional<T> spare, Time now,
                              const std::function<void(T&)>& to_ready = nullptr) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    Shape& s = shapes_[shape];
    --s.refilling;
    if (s.claimed > 0) {
      --s.claimed;
      s.handoff.push_back(std::move(spare));
      cv_.SignalAll();
      return std::nullopt;
    }
    if (!spare) return std::nullopt;
    if (stopping_) return spare;
    if (to_ready) to_ready(*spare);
    s.ready.push_back({std::move(*spare), now});
    return std::nullopt;
  }

  // The idle spares to release at `now`: beyond their shape's target and idle at least
  // `idle_release`, oldest first.
  std::vector<T> Release(Time now) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    std::vector<T> out;
    for (auto& [name, s] : shapes_) {
      Prune(s, now);
      int excess = static_cast<int>(s.ready.size()) - TargetAt(s, now);
      // ready is in order of arrival: the front has been idle longest.
      while (excess > 0 && !s.ready.empty() && now - s.ready.front().since >= opts_.idle_release) {
        out.push_back(std::move(s.ready.front().spare));
        s.ready.pop_front();
        --excess;
      }
    }
    return out;
  }

  // When Release() could next return something (nullopt: not without new events).
  std::optional<Time> NextRelease(Time now) const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    std::optional<Time> next;
    auto consider = [&](Time t) {
      if (!next || t < *next) next = t;
    };
    for (const auto& [name, s] : shapes_) {
      const size_t ready = s.ready.size();
      if (ready == 0 || static_cast<int>(ready) <= Floor(s)) continue;
      std::vector<Time> recent;  // the creates still in the window, oldest first
      for (Time d : s.demand) {
        if (d > now - opts_.demand_window) recent.push_back(d);
      }
      // The oldest spare goes once idle long enough and once the target is below the
      // number ready: ready - 1 recent creates may stay, the older ones must age out.
      Time t = s.ready.front().since + opts_.idle_release;
      const size_t keep = ready - 1;
      if (recent.size() > keep) {
        t = std::max(t, recent[recent.size() - keep - 1] + opts_.demand_window);
      }
      consider(std::max(t, now));
    }
    return next;
  }

  // {"enabled", "budget_mib", "used_mib", "min_spares", "demand_window_s",
  //  "idle_release_s", "shapes": {NAME: {"ready", "refilling", "target", "recent_creates",
  //  "wanted", "memory_mib"}}}, for doctor (docs/protocol/daemon.md).
  nlohmann::json Describe(Time now) const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    nlohmann::json shapes = nlohmann::json::object();
    for (const auto& [name, s] : shapes_) {
      shapes[name] = {{"ready", s.ready.size()},    {"refilling", s.refilling},
                      {"target", TargetAt(s, now)}, {"recent_creates", Recent(s, now)},
                      {"wanted", WantedOf(s, now)}, {"memory_mib", s.memory_mib}};
    }
    return {{"enabled", enabled()},
            {"budget_mib", opts_.memory_budget_mib},
            {"used_mib", UsedMib()},
            {"min_spares", opts_.min_spares},
            {"demand_window_s", opts_.demand_window.count()},
            {"idle_release_s", opts_.idle_release.count()},
            {"shapes", shapes}};
  }

  // Ready spares per shape.
  std::map<std::string, size_t> ReadyCounts() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    std::map<std::string, size_t> out;
    for (const auto& [name, s] : shapes_) out[name] = s.ready.size();
    return out;
  }

  // Wants nothing more, wakes every waiting create, and gives back every ready spare.
  std::vector<T> Stop() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    stopping_ = true;
    cv_.SignalAll();
    std::vector<T> out;
    for (auto& [name, s] : shapes_) {
      for (auto& r : s.ready) out.push_back(std::move(r.spare));
      s.ready.clear();
    }
    return out;
  }

 private:
  struct Ready {
    T spare;
    Time since;  // when it became ready
  };
  struct Shape {
    int memory_mib = 0;
    bool used = false;
    std::deque<Time> demand;  // creates within the window, oldest first
    std::deque<Ready> ready;  // oldest first
    int refilling = 0;
    int claimed = 0;                       // creates waiting for a refill
    std::deque<std::optional<T>> handoff;  // refills ended while claimed
  };

  void Prune(Shape& s, Time now) const {
    while (!s.demand.empty() && s.demand.front() <= now - opts_.demand_window) {
      s.demand.pop_front();
    }
  }
  int Floor(const Shape& s) const { return s.used && enabled() ? opts_.min_spares : 0; }
  // Creates of the shape within the window ending at `now`.
  int Recent(const Shape& s, Time now) const {
    return static_cast<int>(std::count_if(s.demand.begin(), s.demand.end(),
                                          [&](Time d) { return d > now - opts_.demand_window; }));
  }
  int TargetAt(const Shape& s, Time now) const {
    if (!enabled()) return 0;
    return std::max(Floor(s), Recent(s, now));
  }
  int WantedOf(const Shape& s, Time now) const REQUIRES(mu_) {
    if (!enabled() || stopping_) return 0;
    int missing = TargetAt(s, now) - static_cast<int>(s.ready.size()) - s.refilling;
    int64_t room = (opts_.memory_budget_mib - UsedMib()) / std::max(s.memory_mib, 1);
    return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(missing, room)));
  }
  int64_t UsedMib() const REQUIRES(mu_) {
    int64_t used = 0;
    for (const auto& [name, s] : shapes_) {
      used += static_cast<int64_t>(s.ready.size() + s.refilling) * s.memory_mib;
    }
    return used;
  }

  const SparePoolOptions opts_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<std::string, Shape> shapes_ GUARDED_BY(mu_);
};

}  // namespace trybox::daemon
