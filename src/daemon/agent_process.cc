#include "daemon/agent_process.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace trybox::daemon {

std::string DefaultAgentBinary() { return BinaryBesideSelf("trybox-agent"); }

Result<std::unique_ptr<AgentProcess>> AgentProcess::Start(const Options& opts,
                                                          const VerbTable& verbs) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoError("socketpair for trybox-agent");
  }
  UniqueFd ours(sv[0]), theirs(sv[1]);
  SpawnOptions so;
  so.argv = {opts.binary};
  if (opts.uid) {
    so.argv.push_back("--uid");
    so.argv.push_back(std::to_string(*opts.uid));
  }
  so.env = std::vector<std::string>{};  // nothing of the daemon's environment
  so.keep_fds = {theirs.get()};
  so.stderr_fd = STDERR_FILENO;  // its complaints go to the daemon's log
  std::unique_ptr<AgentProcess> p(new AgentProcess());
  ASSIGN_OR_RETURN(p->child_, ChildProcess::Spawn(so));
  theirs.Reset();
  p->pidfd_.Reset(static_cast<int>(::syscall(SYS_pidfd_open, p->child_.pid(), 0)));
  if (!p->pidfd_.valid()) return ErrnoError("pidfd_open trybox-agent");
  // The agent opens the streams (odd ids); the daemon answers them.
  p->mux_ = std::make_unique<channel::Mux>(std::move(ours), channel::Role::kGuest);
  p->mux_->OnOpen([&verbs, conn = &p->conn_, in_flight = p->in_flight_](
                      std::shared_ptr<channel::Stream> s, Json req) {
    {
      MutexLock lock(in_flight->mu);
      ++in_flight->handlers;
    }
    verbs.Dispatch(*s, req, *conn);
    MutexLock lock(in_flight->mu);
    --in_flight->handlers;
    in_flight->cv.SignalAll();
  });
  p->mux_->Start();
  return p;
}

AgentProcess::~AgentProcess() {
  Kill();
  (void)Wait(nullptr);
}

ExitInfo AgentProcess::Wait(const std::function<void()>& abort) {
  auto exit = child_.Wait();
  // Nothing more is read from the process; what its handlers still do is stopped, and
  // waited for: they use the caller's state.
  if (mux_) mux_->Shutdown();
  if (abort) abort();
  MutexLock lock(in_flight_->mu);
  while (in_flight_->handlers > 0) in_flight_->cv.Wait(in_flight_->mu);
  if (!exit.ok()) return ExitInfo{false, 0, SIGKILL};
  return *exit;
}

void AgentProcess::Kill() {
  if (pidfd_.valid()) (void)::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0);
}

}  // namespace trybox::daemon
