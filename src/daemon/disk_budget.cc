#include "daemon/disk_budget.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstdio>

namespace trybox::daemon {
namespace {

int64_t Total(const std::vector<DiskUse>& running) {
  int64_t total = 0;
  for (const auto& u : running) total += u.bytes;
  return total;
}

}  // namespace

std::string FormatMiB(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

Result<int64_t> DiskBudgetBytes(int64_t mib, const std::string& dir) {
  if (mib > 0) return mib << 20;
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) != 0) return ErrnoError("statvfs " + dir);
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize) / 2;
}

int64_t DiskBudget::AllocatedBytes(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_blocks) * 512;
}

int64_t DiskBudget::VmBytes(const std::string& vm_dir) {
  return AllocatedBytes(vm_dir + "/disk.qcow2") + AllocatedBytes(vm_dir + "/xfer.img") +
         AllocatedBytes(vm_dir + "/ws.img");
}

Status DiskBudget::Admit(const std::vector<DiskUse>& running) const {
  if (reserve_ > 0) {
    struct statvfs fs;
    if (::statvfs(state_dir_.c_str(), &fs) == 0) {
      const int64_t free = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
      if (free < reserve_) {
        return ResourceExhausted("the disk under " + state_dir_ + " has " + FormatMiB(free) +
                                 " free, less than the " + FormatMiB(reserve_) +
                                 " a new VM needs (tryboxd --disk-reserve); free some space "
                                 "or destroy a VM");
      }
    }
  }
  const int64_t used = Total(running);
  if (budget_ > 0 && used >= budget_) {
    return ResourceExhausted("the running VMs' disks use " + FormatMiB(used) + " of the " +
                             FormatMiB(budget_) +
                             " host-wide disk budget (tryboxd --disk-budget); destroy a VM or "
                             "raise the budget");
  }
  return Status::Ok();
}

std::optional<DiskUse> DiskBudget::OverBudget(const std::vector<DiskUse>& running) const {
  if (budget_ <= 0 || running.empty() || Total(running) <= budget_) return std::nullopt;
  const DiskUse* largest = &running.front();
  for (const auto& u : running) {
    if (u.bytes > largest->bytes) largest = &u;
  }
  return *largest;
}

}  // namespace trybox::daemon
