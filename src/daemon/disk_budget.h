// DiskBudget: the host-wide cap on the disk that running VMs take on the host, and a floor
// of free space under the daemon's state (issue 18, "bounded growth"; docs/security.md,
// "Disk").
//
// What a VM writes on the host is its own writable disk layer (disk.qcow2 over the image's
// 8 GiB scratch disk) and its transfer disk (xfer.img). Each is bounded by what the guest
// sees, but the sum over VMs is not: ten VMs can each write 8 GiB. The budget bounds the
// sum. Usage is counted as allocated blocks (st_blocks), so a sparse file counts what it
// holds, not its length.
//
// Rules: a create is refused (kResourceExhausted, naming the figures) when the running VMs
// already use the whole budget, or the state filesystem has less free space than the
// reserve. A running VM's growth past the budget is noticed after each exec and at
// housekeeping; the VM using the most is then destroyed, its record saying why
// (VmService::EnforceDiskBudget). A budget of 0 means none (the reserve still holds).
//
// Plain values and functions of files; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace trybox::daemon {

struct DiskUse {
  std::string vm_id;
  int64_t bytes = 0;  // allocated on the host by the VM's own files
};

class DiskBudget {
 public:
  // `budget_bytes`: the cap on the sum (0: none). `reserve_bytes`: the free space a create
  // needs on the filesystem of `state_dir`.
  DiskBudget(int64_t budget_bytes, int64_t reserve_bytes, std::string state_dir)
      : budget_(budget_bytes), reserve_(reserve_bytes), state_dir_(std::move(state_dir)) {}

  // Bytes allocated to the file at `path` (0 if it does not exist).
  static int64_t AllocatedBytes(const std::string& path);
  // A VM's use: its disk layer and transfer disk in `vm_dir`.
  static int64_t VmBytes(const std::string& vm_dir);

  // Whether one more VM may start beside `running`.
  Status Admit(const std::vector<DiskUse>& running) const;
  // The VM to stop while `running` is over the budget: the one using the most.
  std::optional<DiskUse> OverBudget(const std::vector<DiskUse>& running) const;

  int64_t budget() const { return budget_; }

 private:
  const int64_t budget_;
  const int64_t reserve_;
  const std::string state_dir_;
};

// The budget in bytes for `mib` (0: half the free space of the filesystem of `dir` now).
Result<int64_t> DiskBudgetBytes(int64_t mib, const std::string& dir);

// "1.5 MiB"-style figures for messages.
std::string FormatMiB(int64_t bytes);

}  // namespace trybox::daemon
