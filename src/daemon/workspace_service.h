// WorkspaceService: a project's working tree into a VM, the setup hook, and the VM's work
// back as a diff and a commit (docs/workspace.md). The daemon reads the user's directory
// and the collected tree itself and computes the changes from its own manifests; it never
// asks the guest what changed. It writes the store's workspace and collect records.
//
// Thread-safe; no lock of its own. Two collects of one VM at once are the caller's
// business (each gets its own staging directory).
#pragma once

#include <optional>
#include <string>

#include "daemon/guest_ops.h"
#include "daemon/vm_service.h"
#include "store/store.h"
#include "workspace/workspace.h"

namespace trybox::daemon {

// What .trybox/setup.sh did.
struct SetupOutcome {
  ExecResult result;
  int64_t exec_id = 0;
  std::string output;  // its tail
};

// The caller's .trybox/setup.sh as it went into a VM, read back from the host's own record
// (WorkspaceService::InjectedHook).
struct CallerHook {
  std::string content;
  std::string blob;    // its git blob id in the workspace's repository
  std::string sha256;  // of the content, as the daemon took it at inject time
};

// The marker of a collect in flight: $state/collect/<vm>.collecting.<pid>.<n>, holding the
// VM's last exec id. What a killed daemon left is recorded as an `interrupted` collect.
inline constexpr const char* kCollectMarker = ".collecting.";

// Where the verification VM gets its copy of the caller's hook: root's, outside /workspace,
// so nothing in the collected tree stands in for it.
inline constexpr const char* kHookCopyPath = "/run/trybox/setup.sh";

// How a workspace tree moved (the replies' "transfer"): the ext4 on the VM's workspace disk,
// a tar through its transfer disk, or a tar through the control channel.
inline constexpr const char* kTransferWorkspaceDisk = "workspace_disk";
inline constexpr const char* kTransferDisk = "disk";
inline constexpr const char* kTransferChannel = "channel";

struct InjectOutcome {
  store::WorkspaceRecord record;
  // How the tree went in: kTransferWorkspaceDisk, kTransferDisk or kTransferChannel.
  const char* transfer = kTransferChannel;
  std::optional<SetupOutcome> setup;  // none when the project has no hook or it was skipped
};

struct CollectOptions {
  std::string into;  // "" = a temporary directory, removed after
  bool commit = true;
  std::string command;  // for the commit message; "" = the VM's last exec
  // The branch is trybox/<branch_id> (default: the VM id). vm_agent runs commit on their
  // run id; this is not reachable from the socket.
  std::string branch_id;
};

struct CollectOutcome {
  store::CollectRecord record;
  bool committed = false;
  std::string injected_commit;
  int64_t excluded = 0;
  int64_t tar_bytes = 0;
  const char* transfer = kTransferChannel;  // how the tree came back
  std::string into;
  std::string dir;  // the project's working tree
};

class WorkspaceService {
 public:
  WorkspaceService(store::Store& store, VmService& vms, std::string state_dir)
      : store_(store), vms_(vms), state_dir_(std::move(state_dir)) {}

  // workspace_in: plans, sends, records, then runs the hook (its output to `client` as it
  // is produced) unless `req.setup` is false.
  Result<InjectOutcome> WorkspaceIn(VmEntry& vm, const WorkspaceInRequest& req,
                                    channel::Stream* client);
  // Plans the workspace `dir` for `vm` (workspace::PlanInject). When the VM has a workspace
  // disk, its file system is written while the plan hashes the files (*written says it was:
  // pass it to Inject).
  Result<workspace::InjectPlan> Plan(VmEntry& vm, const std::string& dir,
                                     const workspace::Quota& quota, bool* written);
  // Sends a planned workspace to /workspace, records it and marks the VM as having one.
  // *transfer (if given): how the tree went (kTransfer...). `written`: Plan wrote the disk.
  Result<store::WorkspaceRecord> Inject(VmEntry& vm, const workspace::InjectPlan& plan,
                                        const workspace::Quota& quota,
                                        const char** transfer = nullptr, bool written = false);
  // Sends the tree `root` (the entries of `manifest`) to /workspace: as the ext4 of the VM's
  // workspace disk, sized for `quota`, when it has one (`written`: already written); else as
  // a tar.
  Status SendTree(VmEntry& vm, const std::string& root, const workspace::Manifest& manifest,
                  const workspace::Quota& quota, const char** transfer = nullptr,
                  bool written = false);
  // Runs the project's .trybox/setup.sh (if `manifest` has one that is not a symlink) in
  // /workspace, as root: the caller's own tree, just copied in, before anything else ran.
  // nullopt when there is none. With `record`, its output is kept with the workspace record.
  Result<std::optional<SetupOutcome>> RunSetup(VmEntry& vm, const workspace::Manifest& manifest,
                                               int64_t timeout_ms, channel::Stream* client,
                                               bool record);
  // The setup hook of the workspace injected into VM `vm_id` (which may be destroyed), read
  // from the host's own record: the manifest entry the daemon wrote at inject time, the
  // bytes from the repository's object store by that entry's blob id, checked against the
  // SHA-256 the daemon took then. Never from a tree a guest gave back. nullopt when the
  // workspace had none (or only a symlink, which never runs).
  Result<std::optional<CallerHook>> InjectedHook(const std::string& vm_id);
  // Runs `hook` in /workspace of `vm` as the account `user` (never root: the tree it runs in
  // may be anyone's), from a copy at kHookCopyPath.
  Result<SetupOutcome> RunHookAs(VmEntry& vm, const CallerHook& hook, const std::string& user,
                                 int64_t timeout_ms);
  Result<CollectOutcome> Collect(VmEntry& vm, const CollectOptions& opts);
  // The newest collect of a VM (which may be destroyed); NOT_FOUND naming what to do.
  Result<store::CollectRecord> LatestCollect(const std::string& vm_id);
  // The newest collect's commit as a patch against what was injected (`git show`, hardened),
  // at most `max_bytes` of it: {commit, text, text_b64?, bytes, truncated}. The commit may
  // have left the repository's branch; it stays reachable until git's own gc.
  Result<Json> Patch(const std::string& vm_id, size_t max_bytes);

 private:
  // `/bin/sh SCRIPT` in /workspace as `user` ("" = root, privileged in a privileged VM), its
  // output to `client` as it comes and its tail kept.
  Result<SetupOutcome> ExecHook(VmEntry& vm, const std::string& script, const std::string& user,
                                int64_t timeout_ms, channel::Stream* client);

  store::Store& store_;
  VmService& vms_;
  const std::string state_dir_;
};

// The change kinds counted: {"added": n, "modified": n, ...}.
Json CountChanges(const Json& changes);

}  // namespace trybox::daemon
