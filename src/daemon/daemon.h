// Daemon: tryboxd's core. Owns the VM registry, the SQLite store, the acceleration choice
// and the unix socket with its fixed list of verbs (docs/protocol/daemon.md).
//
// Each client connection is a channel::Mux (the daemon plays the accepting role); each
// request is one stream whose OPEN names a verb. Verbs run on their own threads, so a long
// exec never blocks a list or a create. Thread-safe throughout.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/model.h"
#include "agent/tools.h"
#include "channel/mux.h"
#include "egress/config.h"
#include "egress/proxy.h"
#include "store/store.h"
#include "util/paths.h"
#include "util/socket.h"
#include "vmm/qemu.h"
#include "vmm/template.h"
#include "workspace/manifest.h"
#include "workspace/workspace.h"

namespace trybox::daemon {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  Paths paths;
  std::string qemu = "qemu-system-x86_64";
  // Forces the acceleration instead of probing ("kvm" or "tcg"); empty means probe.
  std::string force_accel;
  std::chrono::milliseconds boot_timeout{120000};
  // Restored, warmed clones kept ready per machine shape in use (docs/templates.md).
  int spares = 1;
  // A vm_agent run left waiting (NEEDS_INPUT, IN_PROGRESS, ERROR) keeps its VM this long
  // after its last call; then the VM is destroyed and the run can no longer continue.
  std::chrono::seconds agent_idle{3600};
};

class Daemon {
 public:
  explicit Daemon(Options opts) : opts_(std::move(opts)) {}
  ~Daemon();

  // Creates directories, takes the single-instance lock, opens the store, reaps VMs left by
  // a daemon that died, and binds the socket.
  Status Init();
  // Accepts clients until Stop(). Then destroys every VM.
  Status Serve();
  // Safe from any thread (the signal thread calls it).
  void Stop();

 private:
  // A VM's egress policy and tunnel count; shared with its guest-open handler.
  struct EgressVm {
    egress::Policy policy;
    egress::TunnelSlots slots;
    // Streams the guest has open, decided or not: bounds the threads a guest can hold.
    std::atomic<int> streams{0};
    explicit EgressVm(int max_tunnels) : slots(max_tunnels) {}
  };

  // The uid a QEMU runs as (none when the daemon is not root), held by a flock on a lease
  // file so that it is unique across daemons on the host.
  struct UidLease {
    std::optional<uid_t> uid;
    UniqueFd lock;
  };

  struct VmEntry {
    std::unique_ptr<vmm::Vm> vm;
    store::VmRecord record;
    std::shared_ptr<EgressVm> egress;
    UidLease qemu_uid;
    bool has_workspace = false;  // GUARDED_BY(Daemon::mu_): execs default to /workspace
  };

  // One client connection. VMs created with "ephemeral": true belong to it and are
  // destroyed when it closes, however the client went away.
  struct Connection {
    std::mutex mu;
    std::vector<std::string> ephemeral;  // GUARDED_BY(mu)
    bool closed = false;                 // GUARDED_BY(mu)
  };

  void HandleClient(UniqueFd fd);
  void Dispatch(std::shared_ptr<channel::Stream> s, Json req, Connection& conn);
  Json DoCreate(const Json& req);
  Json DoDestroy(const Json& req);
  Json DoList(const Json& req);
  Json DoDoctor(const Json& req);
  Json DoAudit(const Json& req);
  // The VM's allow-list from the request's "allow" entries and "profiles" names.
  Result<egress::AllowList> EgressAllowList(const Json& req);
  // A stream the guest opened: an egress tunnel, or refused.
  void ServeGuestStream(const std::string& vm_id, EgressVm& eg, channel::Stream& s,
                        const Json& req);
  // A uid for a VM's QEMU when the daemon is root (egress layer 1), released at destroy.
  // True if each QEMU gets a uid of its own (root daemon, egress.json allows it).
  bool QemuOwnUid() const;
  Result<UidLease> AllocateQemuUid();
  void ReleaseQemuUid(UidLease& lease);
  void DoExec(channel::Stream& client, const Json& req);
  void DoPut(channel::Stream& client, const Json& req);
  void DoGet(channel::Stream& client, const Json& req);
  // Workspace verbs (workspace_verbs.cc, docs/workspace.md).
  void DoWorkspaceIn(channel::Stream& client, const Json& req);
  Json DoCollect(const Json& req);
  Json DoDiff(const Json& req);
  // Sends a planned workspace to /workspace, records it and marks the VM as having one.
  Result<store::WorkspaceRecord> InjectPlanned(VmEntry& e, const workspace::InjectPlan& plan,
                                               int64_t quota);
  // Sends the tree `root` (the entries of `manifest`) to /workspace in the VM.
  Status SendTree(VmEntry& e, const std::string& root, const workspace::Manifest& manifest);

  // vm_agent runs (agent_runs.cc, docs/agent.md).
  struct AgentRun;
  void DoAgent(channel::Stream& client, const Json& req);
  // agent_answer (`answer` true) and agent_resume.
  void DoAgentContinue(channel::Stream& client, const Json& req, bool answer);
  Json DoAgentShow(const Json& req);
  // Works on the run until it finishes, asks, or reaches a limit; returns the END body.
  Json DriveRun(AgentRun& run, channel::Stream& client, const Json& limits);
  // Collects the workspace, destroys the agent's VM and re-runs the verification command
  // in a fresh VM. Fills the run's state.
  void FinishRun(AgentRun& run, channel::Stream& client, const std::string& summary,
                 const std::string& agent_verify);
  // Runs one tool call in the run's VM; returns the result for the model.
  agent::ToolResult RunTool(AgentRun& run, VmEntry& vm, const agent::ToolCall& call,
                            const agent::ToolArgs& args, Clock::time_point deadline);
  // The report document for a run, from the store's records.
  Json BuildReport(const store::AgentRunRecord& rec);
  // Saves the run's record (state and transcript) to the store.
  void SaveRun(AgentRun& run);
  // Destroys the VMs of runs left waiting longer than Options::agent_idle.
  void ExpireIdleRuns();
  // The start-up probe of `s`'s model, run once per provider, address and model.
  agent::Outcome ProbeModel(agent::ModelClient& client);

  // Runs one exec request `greq` in the VM and records it in the store. Output goes to
  // `client` (if not null) and, capped to its tail, to `capture` (if not null).
  Json RunGuestExec(VmEntry& e, const Json& greq, channel::Stream* client, bool want_stdin,
                    std::string* capture, int64_t* exec_id);

  // The VM for a request's "vm" field, or an error Status naming why not.
  Result<std::shared_ptr<VmEntry>> Lookup(const Json& req);
  // Marks a VM dead in the store once, when its death is first observed.
  void NoteDeath(VmEntry& e);
  vmm::AccelChoice Accel(const std::string& image_dir);
  void ReapLeftovers();
  // Starts VM `cfg`: restored from its shape's template unless `cold`, else (or when the
  // template cannot be had or fails to restore) booted. `note` says what happened when it
  // was not a plain restore.
  // `lease` receives the QEMU's uid lease (a spare brings its own).
  Result<std::unique_ptr<vmm::Vm>> StartVm(vmm::VmConfig cfg, const vmm::TemplateShape& shape,
                                           bool cold, UidLease* lease, Json* start);
  // The shape's template, built if needed by a QEMU sandboxed like a VM's.
  Result<vmm::TemplateStore::Lease> GetTemplate(const vmm::TemplateShape& shape);
  // Background work runs on one thread, in order, each task queued at most once.
  void Enqueue(const std::string& task, std::function<void()> fn);
  void RunBackground();
  // Rebuilds a discarded template in the background.
  void RebuildLater(const vmm::TemplateShape& shape);
  // Tops up the shape's spare clones (restored, warmed, not yet identified) to
  // Options::spares in the background.
  void RefillLater(const vmm::TemplateShape& shape);
  // A live spare of the current template for `shape`, or null. Stale ones are destroyed.
  std::unique_ptr<vmm::Vm> TakeSpare(const vmm::TemplateShape& shape, UidLease* lease);

  Options opts_;
  egress::Config egress_;
  std::unique_ptr<egress::Resolver> resolver_;
  std::unique_ptr<egress::AuditSink> audit_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<vmm::TemplateStore> templates_;
  std::optional<UnixListener> listener_;
  UniqueFd lock_fd_;

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<VmEntry>> vms_;  // GUARDED_BY(mu_)
  std::optional<vmm::AccelChoice> accel_;                // GUARDED_BY(mu_)
  bool stopping_ = false;                                // GUARDED_BY(mu_)
  struct Spare {
    std::unique_ptr<vmm::Vm> vm;
    std::string key;  // the template key it was restored from
    UidLease qemu_uid;
  };
  std::map<std::string, std::vector<Spare>> spares_;  // by template dir; GUARDED_BY(mu_)
  std::thread background_;
  std::thread run_reaper_;             // ExpireIdleRuns
  std::condition_variable reaper_cv_;  // wakes the reaper at stop; its own, so that it never
                                       // takes a notify_one meant for the background worker
  std::condition_variable tasks_cv_;
  std::deque<std::pair<std::string, std::function<void()>>> tasks_;  // GUARDED_BY(mu_)
  std::set<std::string> queued_;                                     // GUARDED_BY(mu_)
  std::set<uid_t> qemu_uids_;                                        // GUARDED_BY(mu_)
  std::map<std::string, std::shared_ptr<AgentRun>> runs_;            // GUARDED_BY(mu_)
  // Probe outcomes by "provider base_url model": a pass or a truncation is kept.
  std::map<std::string, agent::Outcome> probes_;  // GUARDED_BY(mu_)
  // Guest egress handlers still running; the destructor waits for them.
  std::atomic<int> egress_in_flight_{0};
};

// {"ok":false,"error":{"code":"NOT_FOUND","message":...}}
Json ErrorReply(const Status& st);
// A guest file request's error END ({"ok":false,"error":"not_found",...}) in that shape,
// keeping the guest's error name as "kind". Other bodies are returned unchanged.
Json NormalizeGuestEnd(Json end);

}  // namespace trybox::daemon
