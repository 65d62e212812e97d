// AgentProcess: one trybox-agent process, started for one call of one vm_agent run, and the
// connection it has to the daemon (docs/protocol/agent.md). The process gets a socketpair
// as fd 3, an empty environment, and (under a root daemon) a uid of its own; it sandboxes
// itself before it reads anything (agent/sandbox.h). Its requests are served by the
// VerbTable the caller gives, whose handlers are bound to that one run: the process can
// name no VM, no run and no verb outside the table.
//
// Thread-safe: Kill() may be called from any thread while another Wait()s.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "channel/mux.h"
#include "daemon/control_server.h"
#include "util/mutex.h"
#include "util/process.h"

namespace trybox::daemon {

class AgentProcess {
 public:
  struct Options {
    std::string binary;        // trybox-agent
    std::optional<uid_t> uid;  // the uid it becomes (a root daemon's lease)
  };
  // Starts the process and serves its requests with `verbs` (which must outlive it).
  static Result<std::unique_ptr<AgentProcess>> Start(const Options& opts, const VerbTable& verbs);
  ~AgentProcess();

  pid_t pid() const { return child_.pid(); }
  // Waits for the process to exit and shuts its connection down; then `abort` (may be null)
  // stops work its requests still hold (a command in flight), and Wait returns once every
  // request handler has returned. How the process ended.
  ExitInfo Wait(const std::function<void()>& abort);
  // SIGKILLs it (a cancelled run).
  void Kill();

 private:
  AgentProcess() = default;
  struct InFlight {
    Mutex mu;
    CondVar cv;
    int handlers GUARDED_BY(mu) = 0;
  };
  ChildProcess child_;
  std::shared_ptr<InFlight> in_flight_ = std::make_shared<InFlight>();
  // Signals go through a pidfd: never to a pid that was reaped and reused meanwhile.
  UniqueFd pidfd_;
  std::unique_ptr<channel::Mux> mux_;
  Connection conn_{0};
};

// trybox-agent beside the running binary (tryboxd), else on PATH.
std::string DefaultAgentBinary();

}  // namespace trybox::daemon
