// VmRegistry: the running VMs of this daemon, by id. VmEntry: one of them, with what the
// daemon holds for it (its QEMU, its egress state, its QEMU uid lease, its record).
//
// Locks: the registry's own mutex guards the map only; each entry's mutex guards its
// mutable record fields. Neither is held while a VM is started, stopped or spoken to.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/egress_gateway.h"
#include "daemon/guest_ops.h"
#include "daemon/uid_pool.h"
#include "store/store.h"
#include "util/mutex.h"
#include "vmm/qemu.h"

namespace trybox::daemon {

class VmEntry : public GuestChannel, private TransferDiskPort {
 public:
  // `disk_transfers`: bulk data may use the VM's transfer disk (when its guest has one).
  // `record.privileged` says whether its commands keep every capability.
  VmEntry(std::unique_ptr<vmm::Vm> vm, UidLease uid, std::shared_ptr<EgressVm> egress,
          store::VmRecord record, bool disk_transfers = true)
      : vm_(std::move(vm)),
        uid_(std::move(uid)),
        egress_(std::move(egress)),
        id_(record.id),
        privileged_(record.privileged.value_or(false)),
        disk_transfers_(disk_transfers),
        record_(std::move(record)) {}

  // GuestChannel over the VM's agent. Each stream is remembered (weakly) so that the
  // heartbeat's verdict can wake whatever waits on the guest.
  Result<std::shared_ptr<channel::Stream>> Open(const Json& request) override EXCLUDES(mu_);
  bool alive() const override { return vm_->alive(); }
  bool unresponsive() const override { return condition_.load() != Condition::kRunning; }
  // Under kHostFullBytes free on the file system of the VM's directory.
  std::string host_no_space() const override;
  std::string host_disk_damage() const override { return damage(); }
  // The host's disk failed some of the VM's writes (Vm::FailedHostWrites): the guest saw
  // I/O errors and its file systems may have gone read-only for good. Shown as the state
  // "damaged" with `note` (the reason and how to get files out) while the VM is otherwise
  // running; execs and copies still run. False if already damaged or dead.
  bool MarkDamaged(const std::string& note) EXCLUDES(mu_);
  std::string damage() const EXCLUDES(mu_);
  // Free bytes on the file system of the VM's directory (nullopt if statvfs fails).
  std::optional<uint64_t> HostFreeBytes() const;
  static constexpr uint64_t kHostFullBytes = uint64_t{4} << 20;
  std::string death_reason() const override { return vm_->death_reason(); }
  TransferDiskPort* transfer_disk() override {
    return disk_transfers_ && vm_->has_transfer_disk() ? this : nullptr;
  }
  WorkspaceDiskPort* workspace_disk() override {
    return disk_transfers_ && vm_->has_workspace_disk() ? &workspace_port_ : nullptr;
  }

  const std::string& id() const { return id_; }
  vmm::Vm& vm() { return *vm_; }
  const std::shared_ptr<EgressVm>& egress() const { return egress_; }
  bool privileged() const { return privileged_; }

  store::VmRecord record() const EXCLUDES(mu_);
  // Marks the record dead with `why`, once: true if this call did (the caller records it).
  bool MarkDead(const std::string& why) EXCLUDES(mu_);

  // What the heartbeat last found (docs/reliability.md). Shown as the record's state while
  // the VM lives: "running", "unresponsive" (its guest does not answer) or "paused" (QEMU
  // stopped it on a disk I/O error).
  enum class Condition { kRunning, kUnresponsive, kPaused };
  static const char* ConditionName(Condition c);
  Condition condition() const { return condition_.load(); }
  // Sets the condition and shows it in the record (`note` says why). Leaving kRunning
  // interrupts every open stream to the guest: their waits end, as guest_unresponsive.
  // False if the VM was already in it, or is dead.
  bool SetCondition(Condition c, const std::string& note) EXCLUDES(mu_);
  // The image's env (its manifest's, docs/images.md): every exec gets it under its own.
  const std::map<std::string, std::string>& image_env() const { return image_env_; }
  // Before the entry is shared (VmService::Create).
  void set_image_env(std::map<std::string, std::string> env) { image_env_ = std::move(env); }

  // Execs default to /workspace once the VM has a workspace.
  bool has_workspace() const { return has_workspace_; }
  void set_has_workspace() { has_workspace_ = true; }
  // The workspace is the workspace disk's file system (not a tree on the root disk), so a
  // collect reads it from the disk.
  bool workspace_on_disk() const { return workspace_on_disk_; }
  void set_workspace_on_disk() { workspace_on_disk_ = true; }

  // Kills QEMU and releases its uid. Idempotent: later calls return the first report.
  vmm::DestroyReport Destroy(const std::string& why = "");

 private:
  // TransferDiskPort over the VM's transfer disk.
  int fd_for_io() const override { return vm_->transfer_disk_fd(); }
  Status Announce(uint64_t bytes) override { return vm_->ResizeTransferDisk(bytes); }
  std::unique_lock<std::timed_mutex> TryLock() override { return vm_->TryLockTransferDisk(); }

  class WorkspacePort : public WorkspaceDiskPort {
   public:
    explicit WorkspacePort(VmEntry& e) : e_(e) {}
    int fd_for_io() const override { return e_.vm_->workspace_disk_fd(); }
    Status Announce(uint64_t bytes) override { return e_.vm_->ResizeWorkspaceDisk(bytes); }
    std::optional<uid_t> reader_uid() const override { return e_.uid_.uid(); }

   private:
    VmEntry& e_;
  };

  const std::unique_ptr<vmm::Vm> vm_;
  UidLease uid_;
  const std::shared_ptr<EgressVm> egress_;
  const std::string id_;
  const bool privileged_;
  const bool disk_transfers_;
  std::atomic<bool> has_workspace_{false};
  std::atomic<bool> workspace_on_disk_{false};
  WorkspacePort workspace_port_{*this};
  std::atomic<Condition> condition_{Condition::kRunning};
  std::map<std::string, std::string> image_env_;
  mutable Mutex mu_;
  store::VmRecord record_ GUARDED_BY(mu_);
  std::string damage_ GUARDED_BY(mu_);
  std::vector<std::weak_ptr<channel::Stream>> streams_ GUARDED_BY(mu_);
};

class VmRegistry {
 public:
  void Add(std::shared_ptr<VmEntry> e) EXCLUDES(mu_);
  // The running VM, or null.
  std::shared_ptr<VmEntry> Find(const std::string& id) const EXCLUDES(mu_);
  // Removes it for a destroy; null if it is not (or no longer) here.
  std::shared_ptr<VmEntry> Remove(const std::string& id) EXCLUDES(mu_);
  std::vector<std::shared_ptr<VmEntry>> All() const EXCLUDES(mu_);
  // Empties the registry (shutdown).
  std::vector<std::shared_ptr<VmEntry>> TakeAll() EXCLUDES(mu_);
  size_t size() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<VmEntry>> vms_ GUARDED_BY(mu_);
};

}  // namespace trybox::daemon
