// Reaper: PID 1's single waitpid(-1) loop.
//
// As PID 1, trybox-init inherits every orphan in the guest, and only one thread may call
// waitpid(-1): a second waiter would steal statuses. So every child trybox-init starts is
// forked through Reaper::Fork, which registers it; the reaper thread hands a registered
// child's status to its ChildWatch and silently reaps everything else (orphans).
//
// Threads: SIGCHLD must be blocked in every thread (block it in main() before any thread
// starts); the reaper thread collects it with sigwaitinfo. Fork and the ChildWatch getters
// are thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "guest/wakeup.h"
#include "util/mutex.h"
#include "util/process.h"
#include "util/status.h"
#include "util/thread_annotations.h"

namespace trybox::guest {

// How one child ended, delivered by the reaper.
class ChildWatch {
 public:
  pid_t pid() const { return pid_; }
  // An eventfd that becomes readable once the child has been reaped (it is never drained):
  // for poll(2) alongside pipes.
  int exit_fd_for_poll() const { return reaped_.fd_for_poll(); }
  bool exited() const;
  // Blocks until the child has been reaped; returns the raw waitpid(2) status.
  int Wait() const;
  // When the reaper collected it (only meaningful once exited()).
  std::chrono::steady_clock::time_point exit_time() const;

 private:
  friend class Reaper;
  explicit ChildWatch(Wakeup reaped) : reaped_(std::move(reaped)) {}
  void Complete(int status);

  pid_t pid_ = -1;
  Wakeup reaped_;
  mutable Mutex mu_;
  bool done_ GUARDED_BY(mu_) = false;
  int status_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point exit_time_ GUARDED_BY(mu_);
};

// Blocks SIGCHLD in the calling thread, which every thread started after it inherits: the
// reaper takes SIGCHLD with sigwaitinfo, so a process that starts one calls this first,
// before any thread exists (trybox-init's main, and tests that run a reaper in a child).
void BlockChildSignal();

class Reaper {
 public:
  Reaper() = default;
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;
  // The reaper thread runs for the life of the process; there is no orderly stop.
  ~Reaper();

  void Start();

  // Forks. The child runs `in_child`, which must only make async-signal-safe calls and must
  // not return (it ends in execve or _exit; a return is turned into _exit(127)). The table
  // is locked across fork and registration, so a child that exits at once is still
  // delivered to its watch.
  Result<std::shared_ptr<ChildWatch>> Fork(const std::function<void()>& in_child);
  // Like Fork, but the child starts life inside the cgroup `cgroup_dir_fd` (clone3 with
  // CLONE_INTO_CGROUP), which is far cheaper than joining it afterwards. kUnimplemented-ish
  // failures (old kernel) come back as kFailedPrecondition so the caller can fall back.
  Result<std::shared_ptr<ChildWatch>> ForkIntoCgroup(const std::function<void()>& in_child,
                                                     int cgroup_dir_fd);

 private:
  void Loop();
  void Deliver(pid_t pid, int status);

  Mutex mu_;
  std::map<pid_t, std::shared_ptr<ChildWatch>> children_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace trybox::guest
