#include "daemon/admission.h"

#include <charconv>
#include <cstdio>

#include "util/fd.h"

namespace trybox::daemon {

int64_t MemoryBudgetMib(const AdmissionLimits& limits, int64_t total_mib) {
  int64_t total = limits.memory_total_mib > 0 ? limits.memory_total_mib : total_mib;
  double budget = static_cast<double>(total - limits.memory_reserve_mib) * limits.overcommit;
  return budget > 0 ? static_cast<int64_t>(budget) : 0;
}

Status AdmitVm(const AdmissionLimits& limits, const AdmissionLoad& load, int64_t vm_memory_mib) {
  if (limits.max_vms > 0 && load.live_vms >= limits.max_vms) {
    return ResourceExhausted("too_many_vms: " + std::to_string(load.live_vms) +
                             " VMs are live (booting ones included) and the cap is " +
                             std::to_string(limits.max_vms) +
                             "; destroy one (trybox rm) or raise the cap (tryboxd --max-vms, "
                             "TRYBOX_MAX_VMS)");
  }
  if (limits.memory_total_mib > 0 || load.mem_total_mib > 0) {
    const int64_t total =
        limits.memory_total_mib > 0 ? limits.memory_total_mib : load.mem_total_mib;
    const int64_t budget = MemoryBudgetMib(limits, load.mem_total_mib);
    const int64_t promised = load.promised_mib + load.booting_memory_mib;
    if (promised + vm_memory_mib > budget) {
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, "%g", limits.overcommit);
      return ResourceExhausted(
          "insufficient_memory: " + std::to_string(promised) + " MiB are promised to the " +
          std::to_string(load.live_vms) + " live VMs (booting ones included) and a " +
          std::to_string(vm_memory_mib) + " MiB VM would make " +
          std::to_string(promised + vm_memory_mib) + " MiB, over the VM memory budget of " +
          std::to_string(budget) + " MiB (" + std::to_string(total) + " MiB of host memory" +
          (limits.memory_total_mib > 0 ? " as set by tryboxd --memory-total" : "") +
          " less the reserve of " + std::to_string(limits.memory_reserve_mib) +
          " MiB (tryboxd --memory-reserve, TRYBOX_MEMORY_RESERVE_MIB), times the overcommit "
          "ratio " +
          ratio +
          ": tryboxd --memory-overcommit, TRYBOX_MEMORY_OVERCOMMIT); ask for less memory "
          "(--memory) or destroy a VM");
    }
  }
  int64_t free_mib = load.mem_available_mib - load.booting_memory_mib;
  int64_t need_mib = vm_memory_mib + limits.memory_reserve_mib;
  if (free_mib < need_mib) {
    std::string booting = load.booting_memory_mib > 0
                              ? " (" + std::to_string(load.booting_memory_mib) +
                                    " MiB of it promised to VMs still booting)"
                              : "";
    return ResourceExhausted(
        "insufficient_memory: the host has " + std::to_string(load.mem_available_mib) +
        " MiB available" + booting + "; a " + std::to_string(vm_memory_mib) + " MiB VM needs " +
        std::to_string(need_mib) + " MiB with the host's reserve of " +
        std::to_string(limits.memory_reserve_mib) +
        " MiB (tryboxd --memory-reserve, TRYBOX_MEMORY_RESERVE_MIB); ask for less memory "
        "(--memory) or destroy a VM");
  }
  return Status::Ok();
}

Result<int64_t> ParseMemAvailableMib(std::string_view meminfo) {
  return ParseMeminfoMib(meminfo, "MemAvailable");
}

Result<int64_t> ParseMeminfoMib(std::string_view meminfo, std::string_view field) {
  const std::string key = std::string(field) + ":";
  const std::string_view kKey = key;
  size_t at = 0;
  while (at < meminfo.size()) {
    size_t eol = meminfo.find('\n', at);
    std::string_view line = meminfo.substr(at, eol == std::string_view::npos ? eol : eol - at);
    at = eol == std::string_view::npos ? meminfo.size() : eol + 1;
    if (line.substr(0, kKey.size()) != kKey) continue;
    line.remove_prefix(kKey.size());
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    int64_t kib = 0;
    auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), kib);
    std::string_view unit(end, line.data() + line.size() - end);
    if (ec != std::errc() || kib < 0 || unit != " kB") break;
    return kib / 1024;
  }
  return Internal("/proc/meminfo has no readable " + std::string(field) + " line");
}

std::string AdmissionErrorKind(const Status& st) {
  if (st.code() != Code::kResourceExhausted) return "";
  for (const char* kind : {"too_many_vms", "insufficient_memory"}) {
    if (st.message().rfind(std::string(kind) + ":", 0) == 0) return kind;
  }
  return "";
}

Admission::Ticket::~Ticket() {
  if (owner_) owner_->Release(mib_);
}

Result<std::string> Admission::ReadMeminfo() const { return ReadFileToString(meminfo_path_); }

Result<Admission::Ticket> Admission::Admit(int64_t vm_memory_mib, int64_t registered_vms,
                                           int64_t registered_mib) {
  ASSIGN_OR_RETURN(std::string meminfo, ReadMeminfo());
  ASSIGN_OR_RETURN(int64_t available, ParseMemAvailableMib(meminfo));
  int64_t total = 0;
  if (limits_.memory_total_mib == 0) {
    // Unknown is never permission: without MemTotal nothing is admitted.
    ASSIGN_OR_RETURN(total, ParseMeminfoMib(meminfo, "MemTotal"));
  }
  MutexLock lock(mu_);
  AdmissionLoad load{available, registered_vms + booting_, booting_mib_, total, registered_mib};
  RETURN_IF_ERROR(AdmitVm(limits_, load, vm_memory_mib));
  ++booting_;
  booting_mib_ += vm_memory_mib;
  return Ticket(this, vm_memory_mib);
}

Admission::Memory Admission::Describe() const {
  Memory m;
  m.reserve_mib = limits_.memory_reserve_mib;
  m.overcommit = limits_.overcommit;
  m.total_from_setting = limits_.memory_total_mib > 0;
  m.total_mib = limits_.memory_total_mib;
  auto meminfo = ReadMeminfo();
  if (meminfo.ok()) {
    if (auto a = ParseMemAvailableMib(*meminfo); a.ok()) m.available_mib = *a;
    if (!m.total_from_setting) {
      if (auto t = ParseMeminfoMib(*meminfo, "MemTotal"); t.ok()) m.total_mib = *t;
    }
  }
  m.budget_mib = MemoryBudgetMib(limits_, m.total_mib);
  MutexLock lock(mu_);
  m.booting_mib = booting_mib_;
  return m;
}

void Admission::Release(int64_t mib) {
  MutexLock lock(mu_);
  --booting_;
  booting_mib_ -= mib;
}

}  // namespace trybox::daemon
