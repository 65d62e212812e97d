// Supervisor: what happens when the sub-agent calls finish (docs/agent.md). The agent's
// /workspace is collected and committed on trybox/<run-id>, its VM is destroyed, and the
// verification command (the caller's, else the agent's) is re-run in a fresh VM built from
// the collected tree. Nothing the agent wrote runs there with more privilege than the check:
// tryboxd copies the tree in and hands it to the unprivileged account `user` (its own chown,
// which follows no link), the caller's .trybox/setup.sh as it went into the run (read from
// the host's record, never from the collected tree; none if it had none) runs as `user`,
// then the command as `user`, with no capabilities and no_new_privs, so that nothing in the
// workspace can reach the guest's control channel or run as root before the check, and
// forge the verdict (docs/security.md). The report names each step that ran before it.
//
// Thread-safe; one Finish per run at a time (the runner's rule).
#pragma once

#include <functional>
#include <string>

#include "daemon/run_state.h"
#include "daemon/vm_service.h"
#include "daemon/workspace_service.h"

namespace trybox::daemon {

// The account the verification runs as; every image has it (docs/images.md).
inline constexpr const char* kVerifyUser = "user";

class Supervisor {
 public:
  Supervisor(VmService& vms, WorkspaceService& workspaces, std::string state_dir)
      : vms_(vms), workspaces_(workspaces), state_dir_(std::move(state_dir)) {}

  // Fills state.claim, collect_id / files_note, verification and verdict. `vm_id` is the
  // agent's VM (destroyed here). `progress` reports steps to the caller.
  // `secrets`: the run's, given to the verification VM as to the run's own.
  void Finish(const std::string& run_id, const std::string& vm_id, RunState& state,
              const std::string& summary, const std::string& agent_verify,
              const std::shared_ptr<const egress::HeldSecrets>& secrets,
              const std::function<void(const std::string&)>& progress);
  // A cancelled run: what the agent did is collected and committed (as for a failed
  // command), the VM destroyed; nothing is verified.
  void Cancel(const std::string& run_id, const std::string& vm_id, RunState& state);

 private:
  // Collects the agent's /workspace into `into` and commits it on trybox/<run-id>; false
  // (with state.files_note saying why) if it could not.
  bool CollectWork(const std::string& run_id, const std::string& vm_id, const std::string& into,
                   const std::string& what, RunState& state);
  // The verification in a fresh VM from `tree` (collected from the run's VM `run_vm`); fills
  // `v`.
  void Verify(const RunState& state, const std::string& run_vm, const std::string& tree,
              const std::shared_ptr<const egress::HeldSecrets>& secrets, Verification& v);
  // What runs in the verification VM before the check, each step recorded in v.before: the
  // tree copied in, /workspace handed to kVerifyUser, the caller's hook (if any) run as
  // kVerifyUser. False (v.outcome "not_run", v.error naming the step) when one fails.
  bool Prepare(VmEntry& vm, const std::string& tree, const workspace::Manifest& manifest,
               const std::optional<CallerHook>& hook, Verification& v);

  VmService& vms_;
  WorkspaceService& workspaces_;
  const std::string state_dir_;
};

}  // namespace trybox::daemon
