#include "daemon/running_execs.h"

#include <thread>

namespace trybox::daemon {

RunningExecs::~RunningExecs() { WaitDetached(); }

void RunningExecs::Add(int64_t exec_id, std::weak_ptr<channel::Stream> guest) {
  MutexLock l(mu_);
  running_[exec_id] = std::move(guest);
}

void RunningExecs::Remove(int64_t exec_id) {
  MutexLock l(mu_);
  running_.erase(exec_id);
}

bool RunningExecs::Running(int64_t exec_id) const {
  MutexLock l(mu_);
  return running_.count(exec_id) > 0;
}

Status RunningExecs::Signal(int64_t exec_id, int sig) {
  std::shared_ptr<channel::Stream> s;
  {
    MutexLock l(mu_);
    auto it = running_.find(exec_id);
    if (it != running_.end()) s = it->second.lock();
  }
  const std::string what = "exec " + std::to_string(exec_id);
  if (!s || s->finished()) return FailedPrecondition(what + " is not running");
  Status st = s->SendEvent({{"type", "signal"}, {"signal", sig}});
  if (!st.ok()) return FailedPrecondition(what + " is not running: " + st.message());
  return Status::Ok();
}

void RunningExecs::Detach(std::function<void()> work) {
  {
    MutexLock l(mu_);
    ++detached_;
  }
  std::thread([this, work = std::move(work)]() mutable {
    work();
    work = nullptr;  // what it holds (a VM) goes before the count says this thread is done
    MutexLock l(mu_);
    if (--detached_ == 0) idle_.SignalAll();
  }).detach();
}

void RunningExecs::WaitDetached() {
  MutexLock l(mu_);
  while (detached_ > 0) idle_.Wait(mu_);
}

}  // namespace trybox::daemon
