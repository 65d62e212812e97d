// AgentRunner: vm_agent runs (docs/agent.md): the agent, agent_answer, agent_resume and
// agent_show verbs. It starts a run's VM with its workspace, drives agent::RunLoop against
// the model and that VM, hands a finished run to the Supervisor, saves the run after each
// turn, and gives back the VM of a run left waiting too long.
//
// The model's key lives in the Run, in memory, and nowhere else. Locks: the runner's mutex
// guards the table of live runs and each run's busy flag; a run's own fields are touched
// only by the one call that holds it busy. Thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "agent/loop.h"
#include "agent/model.h"
#include "channel/mux.h"
#include "daemon/report_builder.h"
#include "daemon/run_state.h"
#include "daemon/supervisor.h"
#include "daemon/vm_service.h"
#include "daemon/workspace_service.h"
#include "util/mutex.h"

namespace trybox::daemon {

class AgentRunner {
 public:
  AgentRunner(store::Store& store, VmService& vms, WorkspaceService& workspaces,
              Supervisor& supervisor, std::string state_dir, std::chrono::seconds idle);
  // Stops the idle reaper.
  ~AgentRunner();

  // The verbs' work. Each returns the END body ({ok, report, text} or an error reply);
  // events ({"run"}, {"progress"}) go to `client` on the way.
  Json Start(const AgentRequest& req, channel::Stream& client) EXCLUDES(mu_);
  Json Continue(const AgentContinueRequest& req, bool answer, channel::Stream& client)
      EXCLUDES(mu_);
  Json Show(const std::string& run_id);

 private:
  struct Run;
  class InProcessVm;
  class ClientEvents;

  // Drives the loop until the run finishes, asks, stops or reaches a limit; saves it.
  Json Drive(Run& run, channel::Stream& client, const AgentLimits& limits);
  // Leaves the run (busy off); a DONE run or one that never started leaves the table.
  void Release(const std::shared_ptr<Run>& run) EXCLUDES(mu_);
  void Save(Run& run);
  Json Reply(Run& run);
  agent::Outcome Probe(agent::ModelClient& client) EXCLUDES(mu_);
  void ExpireIdleRuns() EXCLUDES(mu_);

  store::Store& store_;
  VmService& vms_;
  WorkspaceService& workspaces_;
  Supervisor& supervisor_;
  ReportBuilder reports_;
  const std::string state_dir_;
  const std::chrono::seconds idle_;

  Mutex mu_;
  CondVar reaper_cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Run>> runs_ GUARDED_BY(mu_);
  // Probe outcomes by "provider base_url model": a pass or a truncation is kept.
  std::map<std::string, agent::Outcome> probes_ GUARDED_BY(mu_);
  std::thread reaper_;
};

}  // namespace trybox::daemon
