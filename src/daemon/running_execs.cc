#include "daemon/running_execs.h"

#include <thread>

namespace trybox::daemon {
namespace {

std::string ExecName(int64_t exec_id) { return "exec " + std::to_string(exec_id); }

}  // namespace

RunningExecs::~RunningExecs() { WaitDetached(); }

void RunningExecs::Add(int64_t exec_id, std::weak_ptr<channel::Stream> guest, ExecInput input) {
  MutexLock l(mu_);
  Entry& e = running_[exec_id];
  e.guest = std::move(guest);
  e.input = input;
}

void RunningExecs::Remove(int64_t exec_id) {
  MutexLock l(mu_);
  running_.erase(exec_id);
}

bool RunningExecs::Running(int64_t exec_id) const {
  MutexLock l(mu_);
  return running_.count(exec_id) > 0;
}

Result<RunningExecs::Entry> RunningExecs::Find(int64_t exec_id) const {
  Entry e;
  {
    MutexLock l(mu_);
    auto it = running_.find(exec_id);
    if (it != running_.end()) e = it->second;
  }
  auto s = e.guest.lock();
  if (!s || s->finished()) return FailedPrecondition(ExecName(exec_id) + " is not running");
  return e;
}

bool RunningExecs::InputClosed(int64_t exec_id) const {
  MutexLock l(mu_);
  auto it = running_.find(exec_id);
  return it == running_.end() || it->second.input_closed;
}

Status RunningExecs::Signal(int64_t exec_id, int sig) {
  ASSIGN_OR_RETURN(Entry e, Find(exec_id));
  auto s = e.guest.lock();
  if (!s) return FailedPrecondition(ExecName(exec_id) + " is not running");
  Status st = s->SendEvent({{"type", "signal"}, {"signal", sig}});
  if (!st.ok()) return FailedPrecondition(ExecName(exec_id) + " is not running: " + st.message());
  return Status::Ok();
}

Result<ExecInput> RunningExecs::InputOf(int64_t exec_id) const {
  ASSIGN_OR_RETURN(Entry e, Find(exec_id));
  return e.input;
}

Status RunningExecs::Input(int64_t exec_id, std::string_view data) {
  ASSIGN_OR_RETURN(Entry e, Find(exec_id));
  if (!e.input.stdin && !e.input.tty) {
    return FailedPrecondition(ExecName(exec_id) + " takes no input: it was started without stdin");
  }
  MutexLock order(*e.input_mu);
  if (InputClosed(exec_id)) return FailedPrecondition(ExecName(exec_id) + "'s stdin was closed");
  auto s = e.guest.lock();
  Status st = s ? s->Write(channel::kChanIn, data) : Unavailable("it ended");
  if (!st.ok()) return FailedPrecondition(ExecName(exec_id) + " is not running: " + st.message());
  return Status::Ok();
}

Status RunningExecs::CloseInput(int64_t exec_id) {
  ASSIGN_OR_RETURN(Entry e, Find(exec_id));
  if (e.input.tty) {
    return FailedPrecondition(ExecName(exec_id) +
                              " runs on a terminal, whose end of input is a typed Ctrl-D (0x04)");
  }
  if (!e.input.stdin) {
    return FailedPrecondition(ExecName(exec_id) + " takes no input: it was started without stdin");
  }
  MutexLock order(*e.input_mu);
  {
    MutexLock l(mu_);
    auto it = running_.find(exec_id);
    if (it == running_.end()) return FailedPrecondition(ExecName(exec_id) + " is not running");
    if (it->second.input_closed) return Status::Ok();  // closing twice is closed
    it->second.input_closed = true;
  }
  auto s = e.guest.lock();
  Status st = s ? s->CloseWrite(channel::kChanIn) : Unavailable("it ended");
  if (!st.ok()) return FailedPrecondition(ExecName(exec_id) + " is not running: " + st.message());
  return Status::Ok();
}

Status RunningExecs::Resize(int64_t exec_id, int rows, int cols) {
  ASSIGN_OR_RETURN(Entry e, Find(exec_id));
  if (!e.input.tty) return FailedPrecondition(ExecName(exec_id) + " has no terminal");
  auto s = e.guest.lock();
  Status st = s ? s->SendEvent({{"type", "resize"}, {"rows", rows}, {"cols", cols}})
                : Unavailable("it ended");
  if (!st.ok()) return FailedPrecondition(ExecName(exec_id) + " is not running: " + st.message());
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
