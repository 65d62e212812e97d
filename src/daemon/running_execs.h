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
#include <string_view>

#include "channel/mux.h"
#include "util/mutex.h"
#include "util/status.h"

namespace trybox::daemon {

// What callers other than an exec's own client may send it. Set for detached execs started
// with input (the HTTP API's processes with `stdin: true` or a PTY); an exec with a client
// of its own takes input from that client alone, so none is set for it.
struct ExecInput {
  bool stdin = false;  // its stdin is a pipe: Input() writes to it, CloseInput() ends it
  bool tty = false;    // it runs on a terminal: Input() types on it, Resize() sizes it
};

class RunningExecs {
 public:
  RunningExecs() = default;
  // Waits for every detached exec (the VMs must be destroyed first, which ends them).
  ~RunningExecs();
  RunningExecs(const RunningExecs&) = delete;
  RunningExecs& operator=(const RunningExecs&) = delete;

  void Add(int64_t exec_id, std::weak_ptr<channel::Stream> guest, ExecInput input = {})
      EXCLUDES(mu_);
  void Remove(int64_t exec_id) EXCLUDES(mu_);
  bool Running(int64_t exec_id) const EXCLUDES(mu_);
  // Sends the guest the signal EVENT for `exec_id` (docs/protocol/guest.md): the signal goes
  // to the command's whole tree, and the tree goes when the command ends.
  // kFailedPrecondition if it is not running (any more).
  Status Signal(int64_t exec_id, int sig) EXCLUDES(mu_);
  // The input a running exec takes from callers other than its client; kFailedPrecondition
  // if it is not running.
  Result<ExecInput> InputOf(int64_t exec_id) const EXCLUDES(mu_);
  // Writes `data` to a running exec's stdin or terminal, in the order of the calls that
  // returned; it may wait while the command does not read (the guest's window is full).
  // kFailedPrecondition, naming why, if it is not running, takes no input, or its stdin was
  // closed.
  Status Input(int64_t exec_id, std::string_view data) EXCLUDES(mu_);
  // Ends a running exec's stdin (the command reads EOF). Not for a terminal, where EOF is a
  // typed Ctrl-D. kFailedPrecondition as for Input.
  Status CloseInput(int64_t exec_id) EXCLUDES(mu_);
  // Sets a running exec's terminal size. kFailedPrecondition if it has no terminal.
  Status Resize(int64_t exec_id, int rows, int cols) EXCLUDES(mu_);

  // Runs `work` on a thread of its own.
  void Detach(std::function<void()> work) EXCLUDES(mu_);
  // Blocks until every detached thread has finished.
  void WaitDetached() EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  CondVar idle_;
  struct Entry {
    std::weak_ptr<channel::Stream> guest;
    ExecInput input;
    bool input_closed = false;
    // Serialises Input and CloseInput on one exec (so input is delivered in call order and
    // never after its close); held while writing to the guest, never with mu_.
    std::shared_ptr<Mutex> input_mu = std::make_shared<Mutex>();
  };
  // A running exec's entry (its stream locked), or kFailedPrecondition: not running.
  Result<Entry> Find(int64_t exec_id) const EXCLUDES(mu_);
  bool InputClosed(int64_t exec_id) const EXCLUDES(mu_);

  std::map<int64_t, Entry> running_ GUARDED_BY(mu_);
  int detached_ GUARDED_BY(mu_) = 0;
};

}  // namespace trybox::daemon
