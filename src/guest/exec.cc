#include "guest/exec.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "guest/batch.h"
#include "guest/cgroup.h"
#include "guest/pty.h"
#include "guest/requests.h"
#include "guest/spawn.h"
#include "guest/wakeup.h"
#include "util/log.h"

namespace trybox::guest {
namespace {

using channel::Stream;
using Clock = std::chrono::steady_clock;

// Background processes may keep stdout open forever; after the command itself exits we
// read for this long at most.
constexpr auto kDrainAfterExit = std::chrono::seconds(2);
constexpr size_t kReadChunk = 1 << 20;
// Bigger pipes mean fewer wakeups per MB of output (1 MiB is the default pipe-max-size).
constexpr int kPipeSize = 1 << 20;

std::atomic<uint64_t> g_cgroup_serial{0};

Json ErrorEnd(const char* error, const std::string& message) {
  return {{"outcome", "error"}, {"error", error}, {"message", message}};
}

int64_t Millis(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

int PollMillis(Clock::time_point until) {
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// A cgroup for the exec's tree. Names follow the stream id; a session that reconnects
// reuses stream ids while the last session's cgroups may still be going away.
std::optional<ExecCgroup> MakeCgroup(uint32_t stream_id) {
  std::string name = "exec-" + std::to_string(stream_id);
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto cg =
        ExecCgroup::Create(attempt == 0 ? name : name + "-" + std::to_string(++g_cgroup_serial));
    if (cg.ok()) return std::move(cg).value();
    if (cg.status().code() != Code::kAlreadyExists) {
      // Without cgroups the tree is still killed through its process group.
      LogWarn("exec", cg.status().message());
      return std::nullopt;
    }
  }
  return std::nullopt;
}

class ExecRun {
 public:
  ExecRun(Reaper& reaper, Stream& stream, ExecRequest req, const ExecOptions& options)
      : reaper_(reaper), stream_(stream), req_(std::move(req)), options_(options) {}
  ~ExecRun() { StopControl(); }

  void Run();

 private:
  // Host-to-guest traffic: stdin DATA/EOF, RESET, connection loss; also the deadline.
  void ControlLoop();
  void WriteStdin(std::string_view data);
  // A host EVENT (resize, signal). False if it was malformed: the stream is then reset.
  bool Control(const Json& event);
  bool CheckDeadline();
  void Abort(const char* why);
  void KillTree();
  void StopControl();
  // Reads stdout/stderr until both close, or the drain limit after exit. False if the
  // stream died (the run was aborted).
  bool Pump();

  Reaper& reaper_;
  Stream& stream_;
  const ExecRequest req_;
  const ExecOptions& options_;

  std::optional<ExecCgroup> cgroup_;
  std::shared_ptr<ChildWatch> child_;
  UniqueFd out_, err_;          // our read ends
  UniqueFd stdin_;              // our write end (O_NONBLOCK); control thread only
  UniqueFd tty_;                // the terminal's master, for resizes; control thread only
  std::optional<Wakeup> wake_;  // abort or stop; polled by both threads
  std::optional<Clock::time_point> deadline_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> timed_out_{false};
  std::atomic<bool> host_signaled_{false};  // the tree goes when the command ends
  std::atomic<bool> stop_{false};
  std::thread control_;
};

void ExecRun::Run() {
  SpawnSpec spec;
  std::string home = "/root";
  std::optional<uid_t> owner;  // of the terminal: the account's, or root's
  if (req_.user == kRootUser) {
    spec.credentials = req_.privileged ? Credentials::Privileged() : Credentials::RootCommand();
  } else {
    auto account = LookupAccount(req_.user, options_.accounts);
    if (!account.ok()) {
      (void)stream_.End(ErrorEnd(
          account.status().code() == Code::kNotFound ? "unknown_user" : "user_lookup_failed",
          account.status().message()));
      return;
    }
    spec.credentials = Credentials::Of(*account);
    home = account->home;
    owner = account->uid;
  }
  auto wake = Wakeup::Make();
  if (!wake.ok()) {
    (void)stream_.End(ErrorEnd("spawn_failed", wake.status().message()));
    return;
  }
  wake_.emplace(std::move(wake).value());
  // The command's ends of its stdio; ours go to out_, err_, stdin_ (and tty_).
  UniqueFd child_in, child_out, child_err;
  if (req_.tty) {
    auto pty = OpenPty(*req_.tty, owner);
    UniqueFd in_dup, ctl_dup;
    if (pty.ok()) {
      in_dup.Reset(::fcntl(pty->master.get(), F_DUPFD_CLOEXEC, 3));
      ctl_dup.Reset(::fcntl(pty->master.get(), F_DUPFD_CLOEXEC, 3));
    }
    if (!pty.ok() || !in_dup.valid() || !ctl_dup.valid()) {
      Status st = pty.ok() ? ErrnoError("dup the terminal master") : pty.status();
      (void)stream_.End(ErrorEnd("spawn_failed", "terminal: " + st.message()));
      return;
    }
    // One terminal is the child's stdin, stdout and stderr (below).
    child_out = std::move(pty->slave);
    out_ = std::move(pty->master);
    stdin_ = std::move(in_dup);
    tty_ = std::move(ctl_dup);
    spec.controlling_tty = true;
  } else {
    auto out = MakePipe();
    auto err = MakePipe();
    if (!out.ok() || !err.ok()) {
      (void)stream_.End(
          ErrorEnd("spawn_failed", (!out.ok() ? out.status() : err.status()).message()));
      return;
    }
    if (req_.stdin_from_stream) {
      auto p = MakePipe();
      if (!p.ok()) {
        (void)stream_.End(ErrorEnd("spawn_failed", p.status().message()));
        return;
      }
      // Only our end is non-blocking: the command's read end must block.
      ::fcntl(p->write.get(), F_SETFL, O_NONBLOCK);
      child_in = std::move(p->read);
      stdin_ = std::move(p->write);
    }
    ::fcntl(out->read.get(), F_SETPIPE_SZ, kPipeSize);
    ::fcntl(err->read.get(), F_SETPIPE_SZ, kPipeSize);
    child_out = std::move(out->write);
    child_err = std::move(err->write);
    out_ = std::move(out->read);
    err_ = std::move(err->read);
  }
  if (options_.cgroups) {
    if (auto cg = MakeCgroup(stream_.id())) cgroup_.emplace(std::move(*cg));
  }

  spec.argv = req_.argv;
  spec.env = MergeEnv(req_.env, req_.user, home);
  spec.cwd = req_.cwd.value_or(home);
  spec.stdin_fd = req_.tty ? child_out.get() : child_in.get();
  spec.stdout_fd = child_out.get();
  spec.stderr_fd = req_.tty ? child_out.get() : child_err.get();
  spec.cgroup_procs_fd = cgroup_ ? cgroup_->procs_fd_for_child() : -1;
  spec.cgroup_dir_fd = cgroup_ ? cgroup_->dir_fd_for_clone() : -1;
  const Clock::time_point start = Clock::now();
  SpawnOutcome spawned = Spawn(reaper_, spec);
  // Our copies of the command's ends must go, or EOF never comes (for a terminal: EIO once
  // the last slave descriptor is closed).
  child_in.Reset();
  child_out.Reset();
  child_err.Reset();
  if (spawned.error != SpawnError::kNone) {
    (void)stream_.End(ErrorEnd(SpawnErrorName(spawned.error), spawned.message));
    return;
  }
  child_ = std::move(spawned.child);
  if (req_.timeout_ms > 0) deadline_ = start + std::chrono::milliseconds(req_.timeout_ms);

  if (!stream_.SendEvent({{"type", "started"}, {"pid", child_->pid()}}).ok() ||
      (req_.tty && !stream_.CloseWrite(channel::kChanErr).ok())) {
    KillTree();
    return;
  }
  control_ = std::thread([this] { ControlLoop(); });

  if (!Pump()) {
    KillTree();
    return;  // the stream is gone: nobody to report to
  }
  for (UniqueFd* fd : {&out_, &err_}) {
    if (fd->valid()) {
      fd->Reset();
      (void)stream_.CloseWrite(fd == &out_ ? channel::kChanOut : channel::kChanErr);
    }
  }
  ExitInfo status = ExitInfoFromWaitStatus(child_->Wait());
  const int64_t duration = Millis(child_->exit_time() - start);
  Json end;
  if (timed_out_) {
    end = {{"outcome", "timed_out"}, {"timeout_ms", req_.timeout_ms}, {"duration_ms", duration}};
  } else if (status.exited) {
    end = {{"outcome", "exited"}, {"exit_code", status.code}, {"duration_ms", duration}};
  } else {
    end = {{"outcome", "signaled"}, {"signal", status.signal}, {"duration_ms", duration}};
  }
  (void)stream_.End(end);
  StopControl();
  // Survivors of a normal exit (a server started in the background) keep running; a
  // timed-out tree, or one the host signalled, is killed by the cgroup's destructor.
  if (host_signaled_ && !cgroup_) ::kill(-child_->pid(), SIGKILL);
  if (cgroup_ && !timed_out_ && !host_signaled_) cgroup_->Release();
}

bool ExecRun::Pump() {
  // After the spawn: the command keeps the normal policy (guest/batch.h).
  RelayAsBatch("a command's output");
  std::unique_ptr<char[]> buf(req_.tty ? new char[kReadChunk] : nullptr);
  bool exited = false;
  Clock::time_point drain_until;
  for (;;) {
    if (aborted_) return false;
    if (!exited && child_->exited()) {
      exited = true;
      drain_until = child_->exit_time() + kDrainAfterExit;
      // A tree the host signalled goes with its command: no reason to wait for its output.
      if (host_signaled_) KillTree();
    }
    if (exited && !out_.valid() && !err_.valid()) return true;
    int timeout = -1;
    if (exited) {
      timeout = PollMillis(drain_until);
      if (timeout == 0) return true;
    }
    struct pollfd fds[4];
    UniqueFd* pipes[2] = {nullptr, nullptr};
    int n = 0;
    for (UniqueFd* fd : {&out_, &err_}) {
      if (!fd->valid()) continue;
      pipes[n] = fd;
      fds[n++] = {fd->get(), POLLIN, 0};
    }
    const int npipes = n;
    fds[n++] = {wake_->fd_for_poll(), POLLIN, 0};
    if (!exited) fds[n++] = {child_->exit_fd_for_poll(), POLLIN, 0};
    if (::poll(fds, static_cast<nfds_t>(n), timeout) < 0) {
      if (errno == EINTR) continue;
      LogError("exec", ErrnoError("poll").message());
      return false;
    }
    for (int i = 0; i < npipes; ++i) {
      if (fds[i].revents == 0) continue;
      UniqueFd& fd = *pipes[i];
      const uint8_t chan = &fd == &out_ ? channel::kChanOut : channel::kChanErr;
      if (!req_.tty) {
        // Pipes: the output goes to the channel by splice(2), never through this process.
        int queued = 0;
        if (::ioctl(fd.get(), FIONREAD, &queued) != 0) {
          LogError("exec", ErrnoError("FIONREAD on the output pipe").message());
          return false;
        }
        if (queued > 0) {
          size_t n = std::min(static_cast<size_t>(queued), kReadChunk);
          if (!stream_.WriteFromPipe(chan, fd.get(), n).ok()) return false;
          continue;
        }
        // Empty: poll woke us for the writers' end (POLLHUP), which is EOF.
        if ((fds[i].revents & (POLLHUP | POLLERR)) == 0) continue;
        fd.Reset();
        if (!stream_.CloseWrite(chan).ok()) return false;
        continue;
      }
      ssize_t got = ::read(fd.get(), buf.get(), kReadChunk);
      if (got < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        got = 0;  // a broken pipe ends like EOF
      }
      if (got == 0) {
        fd.Reset();
        if (!stream_.CloseWrite(chan).ok()) return false;
        continue;
      }
      if (!stream_.Write(chan, std::string_view(buf.get(), static_cast<size_t>(got))).ok()) {
        return false;
      }
    }
  }
}

// Sleeps until host traffic, the deadline, or StopControl's Interrupt(): no tick.
void ExecRun::ControlLoop() {
  while (!stop_ && !aborted_) {
    if (CheckDeadline()) continue;
    Stream::Deadline until;
    // A command that ended before its deadline has none left to watch.
    if (deadline_ && !timed_out_ && !(child_->exited() && child_->exit_time() < *deadline_)) {
      until = deadline_;
    }
    auto m = stream_.Next(until);
    if (!m.ok()) {
      if (m.status().code() == Code::kDeadlineExceeded) continue;
      if (m.status().code() == Code::kUnavailable) Abort("connection lost");
      return;
    }
    switch (m->kind) {
      case Stream::Message::Kind::kData:
        if (m->channel == channel::kChanIn) WriteStdin(m->data);
        break;
      case Stream::Message::Kind::kEof:
        if (m->channel == channel::kChanIn) stdin_.Reset();
        break;
      case Stream::Message::Kind::kReset:
      case Stream::Message::Kind::kEnd:
        Abort("stream reset by the host");
        return;
      case Stream::Message::Kind::kEvent:
        if (!Control(m->body)) return;
        break;
    }
  }
}

bool ExecRun::Control(const Json& event) {
  auto c = ParseExecControl(event);
  if (!c.ok()) {
    // The host's bug, not the command's: the stream goes (and with it the command's tree).
    (void)stream_.Reset("bad exec event: " + c.status().message());
    Abort("bad exec event");
    return false;
  }
  switch (c->kind) {
    case ExecControl::Kind::kResize:
      // A resize of an exec without a terminal changes nothing.
      if (tty_.valid()) {
        Status st = SetWindowSize(tty_.get(), c->size);
        if (!st.ok()) LogWarn("exec", st.message());
      }
      break;
    case ExecControl::Kind::kSignal:
      host_signaled_ = true;
      if (cgroup_) cgroup_->Signal(c->signal);
      ::kill(-child_->pid(), c->signal);
      break;
    case ExecControl::Kind::kUnknown:
      break;
  }
  return true;
}

// Blocks until `data` is in the pipe, the command stops reading stdin, or the run stops.
void ExecRun::WriteStdin(std::string_view data) {
  while (!data.empty() && stdin_.valid()) {
    ssize_t n = ::write(stdin_.get(), data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) {
      stdin_.Reset();  // EPIPE: nobody reads stdin any more; the rest is dropped
      return;
    }
    struct pollfd fds[2] = {{stdin_.get(), POLLOUT, 0}, {wake_->fd_for_poll(), POLLIN, 0}};
    int timeout = deadline_ && !timed_out_ ? PollMillis(*deadline_) : -1;
    (void)::poll(fds, 2, timeout);
    if (stop_ || aborted_) return;
    CheckDeadline();
  }
}

// True if the deadline has just passed and the tree was killed.
bool ExecRun::CheckDeadline() {
  if (!deadline_ || timed_out_ || Clock::now() < *deadline_) return false;
  // The command may have finished on its own just in time: that is not a timeout.
  if (child_->exited() && child_->exit_time() < *deadline_) return false;
  timed_out_ = true;
  KillTree();
  return true;
}

void ExecRun::Abort(const char* why) {
  LogDebug("exec", std::string("stream ") + std::to_string(stream_.id()) + ": " + why);
  aborted_ = true;
  KillTree();
  wake_->Signal();
}

void ExecRun::KillTree() {
  if (cgroup_) cgroup_->Kill();
  // Fallback and belt-and-braces: the command leads its own session and process group.
  if (child_) ::kill(-child_->pid(), SIGKILL);
}

void ExecRun::StopControl() {
  stop_ = true;
  if (wake_) wake_->Signal();
  stream_.Interrupt();
  if (control_.joinable()) control_.join();
}

}  // namespace

void ServeExec(Reaper& reaper, Stream& stream, const Json& request, const ExecOptions& options) {
  auto req = ParseExecRequest(request);
  if (!req.ok()) {
    (void)stream.End(ErrorEnd("bad_request", req.status().message()));
    return;
  }
  ExecRun run(reaper, stream, std::move(req).value(), options);
  run.Run();
}

}  // namespace trybox::guest
