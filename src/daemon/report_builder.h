// ReportBuilder: the vm_agent report (schema trybox.report/1, docs/agent.md) from the
// daemon's own records: the run's state, the store's exec rows of the run's VM (not the
// transcript), the collect record, the VM's state as the daemon knows it now. The agent's
// words appear only as the quoted claim and question. The text rendering is
// agent::RenderReportText. Thread-safe (reads the store only).
#pragma once

#include "daemon/run_state.h"
#include "store/store.h"

namespace trybox::daemon {

class ReportBuilder {
 public:
  explicit ReportBuilder(store::Store& store) : store_(store) {}
  Json Build(const store::AgentRunRecord& rec, const RunState& state) const;

 private:
  store::Store& store_;
};

}  // namespace trybox::daemon
