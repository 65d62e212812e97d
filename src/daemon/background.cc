#include "daemon/background.h"

#include <algorithm>

namespace trybox::daemon {

BackgroundQueue::BackgroundQueue(int workers) {
  for (int i = 0; i < std::max(workers, 1); ++i) workers_.emplace_back([this] { Run(); });
}

BackgroundQueue::~BackgroundQueue() {
  Stop();
  for (auto& w : workers_) {
    if (w.joinable()) w.join();
  }
}

void BackgroundQueue::Enqueue(const std::string& key, std::function<void()> fn) {
  MutexLock lock(mu_);
  if (stopping_ || !queued_.insert(key).second) return;
  tasks_.emplace_back(key, std::move(fn));
  cv_.SignalAll();
}

bool BackgroundQueue::SleepUntil(std::chrono::steady_clock::time_point t) {
  MutexLock lock(mu_);
  while (!stopping_ && cv_.WaitUntil(mu_, t)) {
  }
  return !stopping_;
}

bool BackgroundQueue::stopping() const {
  MutexLock lock(mu_);
  return stopping_;
}

void BackgroundQueue::Stop() {
  MutexLock lock(mu_);
  stopping_ = true;
  cv_.SignalAll();
}

void BackgroundQueue::Run() {
  for (;;) {
    std::pair<std::string, std::function<void()>> task;
    {
      MutexLock lock(mu_);
      while (!stopping_ && tasks_.empty()) cv_.Wait(mu_);
      if (stopping_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      // Asked for again while it runs, it runs again: the running one may have looked
      // before what prompted the new request.
      queued_.erase(task.first);
    }
    task.second();
  }
}

}  // namespace trybox::daemon
