// Admission: whether one more VM may start now (docs/protocol/daemon.md, "Admission").
//
// Three limits, checked before a create boots anything, so that a refusal is immediate and
// never leaves a half-booted VM:
//   - promised memory: every live VM's memory size (registered, booted or not, plus creates
//     admitted and still booting) and the new VM's must fit in the VM memory budget: the
//     host's memory (MemTotal, or --memory-total) less the reserve, times the overcommit
//     ratio (--memory-overcommit, 1.0 by default: no overcommit). A restored clone uses
//     ~40 MiB at first, so what a guest uses now says nothing of what it may use; what it
//     was promised is what counts. Spare clones are not counted: no one was promised them,
//     and the spare pool's own budget (--spare-memory) bounds them.
//   - available memory: MemAvailable (/proc/meminfo) must cover the VM's memory size plus
//     the reserve; creates already admitted but still booting count against it too.
//   - the VM cap: live VMs (registered, plus creates admitted and still booting) must stay
//     under it. Spare clones are not counted: they are bounded by the spare pool's own
//     memory budget (--spare-memory) and a create that takes one turns it into a live VM.
// A refusal is kResourceExhausted whose message starts with its name, `insufficient_memory`
// or `too_many_vms`, and names the figures and the setting that changes it.
//
// Thread-safe: one mutex guards the in-flight counts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "util/mutex.h"
#include "util/status.h"

namespace trybox::daemon {

struct AdmissionLimits {
  // MiB of MemAvailable that must remain after the VM's memory; 0 checks only the VM's size.
  int64_t memory_reserve_mib = 256;
  // Live VMs at most; 0: no cap.
  int64_t max_vms = 0;
  // MiB of host memory the budget starts from; 0: MemTotal (/proc/meminfo).
  int64_t memory_total_mib = 0;
  // The VM memory budget is (total - reserve) * this; 1.0: nothing promised twice over.
  double overcommit = 1.0;
};

// The VM memory budget in MiB for a host of `total_mib` (limits.memory_total_mib wins
// when set); never negative.
int64_t MemoryBudgetMib(const AdmissionLimits& limits, int64_t total_mib);

// What the host has and holds when a create asks.
struct AdmissionLoad {
  int64_t mem_available_mib = 0;
  int64_t live_vms = 0;            // registered VMs plus admitted creates still booting
  int64_t booting_memory_mib = 0;  // memory of admitted creates still booting
  int64_t mem_total_mib = 0;       // MemTotal; 0 with limits.memory_total_mib set
  int64_t promised_mib = 0;        // memory of the registered VMs (not the booting ones)
};

// The decision alone, a pure function: OK, or the named refusal.
Status AdmitVm(const AdmissionLimits& limits, const AdmissionLoad& load, int64_t vm_memory_mib);

// MemAvailable from the text of /proc/meminfo, in MiB; kInternal if it is missing.
Result<int64_t> ParseMemAvailableMib(std::string_view meminfo);
// Any "NAME: N kB" line of /proc/meminfo (MemTotal, MemAvailable...), in MiB.
Result<int64_t> ParseMeminfoMib(std::string_view meminfo, std::string_view field);

// "too_many_vms" or "insufficient_memory" for an admission refusal, else "".
std::string AdmissionErrorKind(const Status& st);

class Admission {
 public:
  explicit Admission(AdmissionLimits limits, std::string meminfo_path = "/proc/meminfo")
      : limits_(limits), meminfo_path_(std::move(meminfo_path)) {}

  // A create admitted and still booting; its count ends with it (then the VM is either
  // registered or gone).
  class Ticket {
   public:
    Ticket(Ticket&& o) noexcept : owner_(o.owner_), mib_(o.mib_) { o.owner_ = nullptr; }
    Ticket& operator=(Ticket&&) = delete;
    ~Ticket();

   private:
    friend class Admission;
    Ticket(Admission* owner, int64_t mib) : owner_(owner), mib_(mib) {}
    Admission* owner_;
    int64_t mib_;
  };

  // Admits a create of `vm_memory_mib` beside `registered_vms` live VMs that were promised
  // `registered_mib` MiB together, or refuses it.
  Result<Ticket> Admit(int64_t vm_memory_mib, int64_t registered_vms, int64_t registered_mib)
      EXCLUDES(mu_);

  // The memory picture for doctor and daemon status.
  struct Memory {
    int64_t total_mib = 0;  // what the budget starts from (the setting or MemTotal)
    bool total_from_setting = false;
    int64_t reserve_mib = 0;
    double overcommit = 1.0;
    int64_t budget_mib = 0;
    int64_t booting_mib = 0;     // promised to creates still booting
    int64_t available_mib = -1;  // MemAvailable; -1 if unreadable
  };
  Memory Describe() const EXCLUDES(mu_);

  const AdmissionLimits& limits() const { return limits_; }

 private:
  void Release(int64_t mib) EXCLUDES(mu_);
  Result<std::string> ReadMeminfo() const;
  const AdmissionLimits limits_;
  const std::string meminfo_path_;
  mutable Mutex mu_;
  int64_t booting_ GUARDED_BY(mu_) = 0;
  int64_t booting_mib_ GUARDED_BY(mu_) = 0;
};

}  // namespace trybox::daemon
