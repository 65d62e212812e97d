// RunningExecs: the execs running now, by exec id, each with its guest stream, so that
// `trybox kill EXEC_ID` can signal one from any connection; and the threads of detached
// execs (`trybox exec -d`), which run with no client and are waited for at shutdown.
//
// Thread-safe: one lock guards the map and the count of detached threads. Never held
// while anything is sent to a guest.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "channel/mux.h"
#include "util/mutex.h"
#include "util/status.h"

namespace trybox::daemon {

class RunningExecs {
 public:
  RunningExecs() = default;
  // Waits for every detached exec (the VMs must be destroyed first, which ends them).
  ~RunningExecs();
  RunningExecs(const RunningExecs&) = delete;
  RunningExecs& operator=(const RunningExecs&) = delete;

  void Add(int64_t exec_id, std::weak_ptr<channel::Stream> guest) EXCLUDES(mu_);
  void Remove(int64_t exec_id) EXCLUDES(mu_);
  bool Running(int64_t exec_id) const EXCLUDES(mu_);
  // Sends the guest the signal EVENT for `exec_id` (docs/protocol/guest.md): the signal goes
  // to the command's whole tree, and the tree goes when the command ends.
  // kFailedPrecondition if it is not running (any more).
  Status Signal(int64_t exec_id, int sig) EXCLUDES(mu_);

  // Runs `work` on a thread of its own.
  void Detach(std::function<void()> work) EXCLUDES(mu_);
  // Blocks until every detached thread has finished.
  void WaitDetached() EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  CondVar idle_;
  std::map<int64_t, std::weak_ptr<channel::Stream>> running_ GUARDED_BY(mu_);
  int detached_ GUARDED_BY(mu_) = 0;
};

}  // namespace trybox::daemon
