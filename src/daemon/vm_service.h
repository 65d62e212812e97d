// VmService: the life of VMs (create, destroy, list) and the acts on a running one that the
// record must see (exec, put, get). It is the only writer of the store's vms and execs
// tables: every exec is recorded before it starts and finished when it ends, and a VM's
// death is recorded once, when first observed.
//
// Thread-safe; it holds no lock of its own (the registry, the launcher and the store have
// theirs), so a long exec never blocks a create or a list.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/egress_gateway.h"
#include "daemon/guest_ops.h"
#include "daemon/requests.h"
#include "daemon/vm_launcher.h"
#include "daemon/vm_registry.h"
#include "store/store.h"

namespace trybox::daemon {

struct CreatedVm {
  std::shared_ptr<VmEntry> entry;
  Json start;  // how it started (LaunchedVm::start)
  double boot_ms = 0;
  std::vector<std::string> allow;  // the egress allow-list, as entries
};

class VmService {
 public:
  // `disk_transfers`: bulk data may use VMs' transfer disks (else always the channel).
  VmService(store::Store& store, VmRegistry& registry, VmLauncher& launcher, EgressGateway& egress,
            std::string images_dir, bool disk_transfers = true)
      : store_(store),
        registry_(registry),
        launcher_(launcher),
        egress_(egress),
        images_dir_(std::move(images_dir)),
        disk_transfers_(disk_transfers) {}

  // Everything Create checks before it boots: the image (built, verified) and the egress
  // allow-list.
  Status Validate(const CreateRequest& req) const;
  // Validates everything before anything boots, then starts and records the VM.
  // `progress` hears of the steps that may take seconds (vm_launcher.h).
  Result<CreatedVm> Create(const CreateRequest& req, const Progress& progress = {});
  // Kills the VM and reports what was observed. FAILED_PRECONDITION if it was already
  // destroyed (or is being destroyed), NOT_FOUND if it never existed.
  Result<vmm::DestroyReport> Destroy(const std::string& id);
  // A running VM, or an error naming why not (destroyed, reaped, dead, unknown).
  Result<std::shared_ptr<VmEntry>> Get(const std::string& id);
  // The running VMs' records (deaths noticed on the way).
  std::vector<store::VmRecord> List();

  // Runs and records one exec. An error Status when it could not be recorded (nothing ran).
  // A VM already known dead gives channel_lost and records nothing: no command started.
  Result<ExecResult> Exec(VmEntry& vm, const ExecSpec& spec, const ExecIo& io,
                          int64_t* exec_id = nullptr);
  // The exec spec of an exec request on `vm` (its default cwd, its privileges).
  ExecSpec SpecFor(const VmEntry& vm, const ExecRequest& req) const;

  // Marks the VM dead in the store once, if it has died.
  void NoteDeath(VmEntry& vm);

  // At start: kills QEMUs and removes directories a dead daemon left (docs/store.md).
  void ReapLeftovers(const std::string& vms_dir, const std::string& templates_dir);
  // At stop: destroys every VM.
  void DestroyAll();

 private:
  store::Store& store_;
  VmRegistry& registry_;
  VmLauncher& launcher_;
  EgressGateway& egress_;
  const std::string images_dir_;
  const bool disk_transfers_;
};

}  // namespace trybox::daemon
