// VmService: the life of VMs (create, destroy, list) and the acts on a running one that the
// record must see (exec, put, get). It is the only writer of the store's vms and execs
// tables: every exec is recorded before it starts and finished when it ends, and a VM's
// death is recorded once, when first observed. Every exec's output is fed to ExecLogs as it
// arrives; every running exec is listed in RunningExecs (for `kill`); the records of VMs
// that ended are pruned with their logs when the retention says so (RecordKeeper).
//
// Thread-safe; it holds no lock of its own (the registry, the launcher and the store have
// theirs), so a long exec never blocks a create or a list.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/admission.h"
#include "daemon/disk_budget.h"
#include "daemon/egress_gateway.h"
#include "daemon/exec_logs.h"
#include "daemon/guest_ops.h"
#include "daemon/requests.h"
#include "daemon/running_execs.h"
#include "daemon/vm_launcher.h"
#include "daemon/vm_registry.h"
#include "store/store.h"

namespace trybox::daemon {

struct CreatedVm {
  std::shared_ptr<VmEntry> entry;
  Json start;  // how it started (LaunchedVm::start)
  double boot_ms = 0;
};

// An exec started with no client (`exec -d`).
struct DetachedExec {
  int64_t exec_id = 0;
  // Set when it ended before it started (not found, bad cwd...): its result. Otherwise it
  // is running.
  std::optional<ExecResult> ended;
};

class VmService {
 public:
  // `disk_transfers`: bulk data may use VMs' transfer disks (else
  // always the channel).
  // `disks`: the host-wide disk budget, checked at create and enforced after each exec.
  VmService(store::Store& store, VmRegistry& registry, VmLauncher& launcher, EgressGateway& egress,
            std::string images_dir, ExecLogs& logs, RunningExecs& running, const DiskBudget& disks,
            bool disk_transfers = true)
      : store_(store),
        registry_(registry),
        launcher_(launcher),
        egress_(egress),
        images_dir_(std::move(images_dir)),
        logs_(logs),
        running_(running),
        disks_(disks),
        disk_transfers_(disk_transfers) {}

  // Everything Create checks before it boots: the image (built, verified), the egress
  // allow-list, and room under the disk budget.
  Status Validate(const CreateRequest& req) const;
  // Validates everything before anything boots, then starts and records the VM.
  // `progress` hears of the steps that may take seconds (vm_launcher.h).
  Result<CreatedVm> Create(const CreateRequest& req, const Progress& progress = {});
  // A running VM's egress list grows or shrinks (EgressGateway::Change); from its next
  // connection on.
  Result<egress::Reach> ChangeEgress(const std::string& id, const EgressChange& c);
  // A vm_agent's request_network, answered by the operator's policy or left to a person
  // (EgressGateway::AnswerRequest); and a person's refusal of one, audited.
  Result<EgressGateway::RequestAnswer> AnswerNetworkRequest(const std::string& id,
                                                            const std::string& entry,
                                                            const std::string& who);
  Status RefuseNetworkRequest(const std::string& id, const std::string& entry,
                              const std::string& why);
  // Kills the VM and reports what was observed. FAILED_PRECONDITION if it was already
  // destroyed (or is being destroyed), NOT_FOUND if it never existed.
  Result<vmm::DestroyReport> Destroy(const std::string& id);
  // A running VM, or an error naming why not (destroyed, reaped, dead, unknown).
  Result<std::shared_ptr<VmEntry>> Get(const std::string& id);
  // Get, and UNAVAILABLE ("the VM died: ...") for a VM whose QEMU is gone.
  Result<std::shared_ptr<VmEntry>> GetLive(const std::string& id);
  // The running VMs' records (deaths noticed on the way).
  std::vector<store::VmRecord> List();
  // A VM's record, running or not, until it is pruned; kNotFound naming it otherwise.
  Result<store::VmRecord> Record(const std::string& id);

  // Runs and records one exec, its output kept (io.sink is set here). An error Status when
  // it could not be recorded, or when the VM is unresponsive or paused (nothing ran). A VM
  // already known dead gives not_started and records nothing: no command started.
  Result<ExecResult> Exec(VmEntry& vm, const ExecSpec& spec, const ExecIo& io,
                          int64_t* exec_id = nullptr);
  // Records and starts an exec with no client, on a thread of its own (RunningExecs), and
  // returns once the guest said it started (or it ended without starting). It runs until
  // it ends, times out, is killed, or its VM goes.
  Result<DetachedExec> ExecDetached(std::shared_ptr<VmEntry> vm, const ExecSpec& spec);
  // Signals a running exec's tree (the guest's signal event). kNotFound: no such exec;
  // kFailedPrecondition: it is not running, naming how it ended.
  Status SignalExec(int64_t exec_id, int sig);
  // The input of a running detached exec (RunningExecs): what it takes, writing to it,
  // closing its stdin, sizing its terminal. kNotFound: no such exec; kFailedPrecondition:
  // not running (naming how it ended), or it takes no such input.
  Result<ExecInput> ExecInputOf(int64_t exec_id);
  Status InputExec(int64_t exec_id, std::string_view data);
  Status CloseExecInput(int64_t exec_id);
  Status ResizeExec(int64_t exec_id, TermSize size);
  Result<store::ExecRecord> GetExec(int64_t exec_id);
  // The kept output of an exec (live while it runs). kNotFound for an unknown id.
  Result<std::shared_ptr<ExecLog>> OpenExecLog(int64_t exec_id);
  // A VM's execs, oldest first, with the byte counts of running ones as of now. The VM may
  // have been destroyed; kNotFound if it has no record.
  Result<std::vector<store::ExecRecord>> Execs(const std::string& vm_id);
  // Per running VM: execs so far and running now.
  std::map<std::string, store::ExecCount> ExecCounts();

  // Deletes the records of VMs that ended before `ended_before` or beyond the newest
  // `keep_ended` (Store::PruneVms), then their exec logs. `dry_run`: counts only.
  Result<store::PrunedVms> PruneRecords(double ended_before, int64_t keep_ended, bool dry_run);
  // Each running VM's disk use on the host (DiskBudget::VmBytes).
  std::vector<DiskUse> DiskUses() const;
  // While the running VMs use more than the disk budget, destroys the one using the most,
  // recording it `reaped` with the reason. Returns the VMs destroyed.
  std::vector<std::string> EnforceDiskBudget();
  // The exec spec of an exec request on `vm` (its default cwd, its privileges).
  ExecSpec SpecFor(const VmEntry& vm, const ExecRequest& req) const;

  // Memory and VM-count admission for creates (admission.h); none when never set. Set
  // before serving.
  void SetAdmission(Admission* admission) { admission_ = admission; }
  // Null before SetAdmission.
  const Admission* admission() const { return admission_; }
  size_t LiveVms() const { return registry_.size(); }

  // Marks the VM dead in the store once, if it has died.
  void NoteDeath(VmEntry& vm);
  // The heartbeat's verdict on a VM (heartbeat.h): shown in its record and logged. Execs
  // waiting on a guest that stopped answering end as guest_unresponsive.
  void NoteCondition(VmEntry& vm, VmEntry::Condition c, const std::string& note);
  // The heartbeat found `failed_writes` of the VM's disk writes failed on the host: the VM
  // is marked damaged (VmEntry::MarkDamaged), with the reason and the way to get files out,
  // and logged (docs/reliability.md, "A full disk").
  void NoteDamage(VmEntry& vm, int64_t failed_writes);

  // Where images live (read-only use: the agent's prompt describes a run's image).
  const std::string& images_dir() const { return images_dir_; }

  // At start: kills QEMUs and removes directories a dead daemon left (docs/store.md).
  void ReapLeftovers(const std::string& vms_dir, const std::string& templates_dir);
  // At stop: destroys every VM; `why` is what an exec cut off by it reports.
  void DestroyAll(const std::string& why = "");

 private:
  store::Store& store_;
  VmRegistry& registry_;
  VmLauncher& launcher_;
  EgressGateway& egress_;
  const std::string images_dir_;
  ExecLogs& logs_;
  RunningExecs& running_;
  const DiskBudget& disks_;
  const bool disk_transfers_;
  Admission* admission_ = nullptr;

  struct Recorded {
    store::ExecRecord rec;
    std::shared_ptr<ExecLog> log;
    // rec.started_at is a time of day for the record; the duration is measured from this.
    std::chrono::steady_clock::time_point started;
  };
  // `why` (RunningExecs' refusal) for an exec that is no longer running: how it ended.
  Status NotRunning(int64_t exec_id, const Status& why);
  // OK unless the heartbeat finds the VM unresponsive or paused: then an error naming it.
  static Status Responsive(VmEntry& vm);
  // Inserts the exec's row and starts its log: nothing runs unrecorded.
  Result<Recorded> Record(VmEntry& vm, const ExecSpec& spec);
  // Runs a recorded exec to its end and finishes its row and its log.
  ExecResult RunRecorded(VmEntry& vm, const ExecSpec& spec, const ExecIo& io, Recorded r);
};

}  // namespace trybox::daemon
