// AgentRunner: vm_agent runs (docs/agent.md): the agent, agent_answer, agent_resume,
// agent_show, agent_cancel, agent_ls and agent_transcript verbs. It starts a run's VM with
// its workspace, has a trybox-agent process (agent_call.h) drive the loop against the model
// and that VM, hands a finished run to the Supervisor, saves the run after each turn, and
// gives back the VM of a run left waiting too long.
//
// The model's key lives in the LiveRun, in this process's memory, and nowhere else: the
// agent process that talks to the model never has it. Locks: the runner's mutex guards the
// table of live runs, their busy flags and their active calls; a LiveRun's own fields are
// touched only by the one call that holds it busy. Thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "agent/model.h"
#include "channel/mux.h"
#include "daemon/agent_call.h"
#include "daemon/report_builder.h"
#include "daemon/run_state.h"
#include "daemon/supervisor.h"
#include "daemon/uid_pool.h"
#include "daemon/vm_service.h"
#include "daemon/workspace_service.h"
#include "util/mutex.h"

namespace trybox::daemon {

struct AgentRunnerOptions {
  std::string state_dir;
  std::chrono::seconds idle{3600};
  std::string agent_binary;  // trybox-agent
};

class AgentRunner {
 public:
  AgentRunner(store::Store& store, VmService& vms, WorkspaceService& workspaces,
              Supervisor& supervisor, UidPool& uids, AgentRunnerOptions opts);
  // Stops the idle reaper.
  ~AgentRunner();

  // The verbs' work. Each returns the END body ({ok, report, text} or an error reply);
  // events ({"run"}, {"progress"}) go to `client` on the way. A reset or lost `client`
  // cancels the call.
  Json Start(const AgentRequest& req, channel::Stream& client) EXCLUDES(mu_);
  Json Continue(const AgentContinueRequest& req, bool answer, channel::Stream& client)
      EXCLUDES(mu_);
  // With `follow`, the live call's events go to `client` until it ends.
  Json Show(const std::string& run_id, bool follow, channel::Stream* client) EXCLUDES(mu_);
  // Stops the run where it is: the command in flight killed, the work collected, the VM
  // destroyed, the run recorded CANCELLED. A cancelled run can be shown, not continued.
  Json Cancel(const std::string& run_id) EXCLUDES(mu_);
  Json List(int64_t limit);
  // What waits for a person (docs/agent.md, "Approvals"): each live run waiting on a
  // request_network ("network") or a question ("agent_question"), oldest first, each
  // "pending", or "failed" with the reason when it can no longer be carried out (its VM
  // is gone).
  Json Approvals() EXCLUDES(mu_);
  // The runs in flight or waiting for an answer or a resume (retention never prunes them).
  std::set<std::string> LiveRunIds() EXCLUDES(mu_);
  // The transcript as JSON on channel 1, then {ok, entries}.
  void Transcript(const std::string& run_id, channel::Stream& client);

 private:
  struct Slot {
    LiveRun run;
    bool busy = false;                                    // GUARDED_BY(AgentRunner::mu_)
    AgentCall* active = nullptr;                          // GUARDED_BY(AgentRunner::mu_)
    std::chrono::steady_clock::time_point last_call_end;  // GUARDED_BY(AgentRunner::mu_)
  };

  // `watch` reads `client`: the caller's leaving cancels the call.
  Json Drive(LiveRun& run, channel::Stream& client, CallerWatch& watch, const AgentLimits& limits)
      EXCLUDES(mu_);
  // The run's work collected and its VM destroyed; recorded CANCELLED.
  void Cancelled(LiveRun& run, const std::string& why);
  // Leaves the run (busy off); a finished run, or one that never started, leaves the table.
  void Release(const std::shared_ptr<Slot>& slot) EXCLUDES(mu_);
  void Save(LiveRun& run);
  Json Reply(LiveRun& run);
  // The model's start-up probe (docs/agent.md), once per model; the caller's leaving
  // (`watch`) kills the probe's process and drops its request.
  agent::Outcome Probe(const agent::ModelSettings& settings, CallerWatch& watch) EXCLUDES(mu_);
  CallEnv Env();
  void ExpireIdleRuns() EXCLUDES(mu_);

  store::Store& store_;
  VmService& vms_;
  WorkspaceService& workspaces_;
  Supervisor& supervisor_;
  UidPool& uids_;
  ReportBuilder reports_;
  const AgentRunnerOptions opts_;

  Mutex mu_;
  CondVar changed_;  // a run was released or the runner is stopping
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Slot>> runs_ GUARDED_BY(mu_);
  // Probe outcomes by "provider base_url model": a pass or a truncation is kept.
  std::map<std::string, agent::Outcome> probes_ GUARDED_BY(mu_);
  std::thread reaper_;
};

}  // namespace trybox::daemon
