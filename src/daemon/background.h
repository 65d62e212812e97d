// BackgroundQueue: worker threads that run tasks in order of arrival, each key queued at
// most once (a rebuild or refill asked for twice before it starts runs once). A task asked
// for again while it runs is queued again and may run beside itself on another worker, so a
// task must be safe to run concurrently with itself (VmLauncher's refills and rebuilds are:
// the spare pool and the template store decide under their own locks). Tasks may wait,
// but only through SleepUntil, which Stop() cuts short. Thread-safe.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "util/mutex.h"

namespace trybox::daemon {

class BackgroundQueue {
 public:
  // `workers` threads (at least one).
  explicit BackgroundQueue(int workers = 1);
  // Stop()s and joins the workers; tasks not started are dropped.
  ~BackgroundQueue();

  // Queues `fn` unless a task with `key` is already queued (or the queue is stopping).
  void Enqueue(const std::string& key, std::function<void()> fn) EXCLUDES(mu_);
  // For a running task: waits until `t`; false if the queue stopped meanwhile.
  bool SleepUntil(std::chrono::steady_clock::time_point t) EXCLUDES(mu_);
  bool stopping() const EXCLUDES(mu_);
  // How many tasks run at once.
  int workers() const { return static_cast<int>(workers_.size()); }
  void Stop() EXCLUDES(mu_);

 private:
  void Run() EXCLUDES(mu_);

  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::deque<std::pair<std::string, std::function<void()>>> tasks_ GUARDED_BY(mu_);
  std::set<std::string> queued_ GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

}  // namespace trybox::daemon
