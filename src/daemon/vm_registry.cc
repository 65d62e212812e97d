#include "daemon/vm_registry.h"

#include <sys/statvfs.h>

namespace trybox::daemon {

store::VmRecord VmEntry::record() const {
  MutexLock lock(mu_);
  return record_;
}

Result<std::shared_ptr<channel::Stream>> VmEntry::Open(const Json& request) {
  auto s = vm_->Open(request);
  if (!s.ok()) return s;
  MutexLock lock(mu_);
  std::erase_if(streams_, [](const auto& w) { return w.expired(); });
  streams_.push_back(*s);
  return s;
}

std::optional<uint64_t> VmEntry::HostFreeBytes() const {
  struct statvfs st {};
  if (::statvfs(vm_->config().vm_dir.c_str(), &st) != 0) return std::nullopt;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

bool VmEntry::MarkDamaged(const std::string& note) {
  MutexLock lock(mu_);
  if (record_.state == "dead" || !damage_.empty() || note.empty()) return false;
  damage_ = note;
  if (condition_.load() == Condition::kRunning) {
    record_.state = "damaged";
    record_.note = note;
  }
  return true;
}

std::string VmEntry::damage() const {
  MutexLock lock(mu_);
  return damage_;
}

std::string VmEntry::host_no_space() const {
  auto free = HostFreeBytes();
  if (!free || *free >= kHostFullBytes) return "";
  return "the host's file system under " + vm_->config().vm_dir + " is full (" +
         std::to_string(*free >> 10) + " KiB free)";
}

const char* VmEntry::ConditionName(Condition c) {
  switch (c) {
    case Condition::kRunning:
      return "running";
    case Condition::kUnresponsive:
      return "unresponsive";
    case Condition::kPaused:
      return "paused";
  }
  return "running";
}

bool VmEntry::SetCondition(Condition c, const std::string& note) {
  std::vector<std::shared_ptr<channel::Stream>> wake;
  {
    MutexLock lock(mu_);
    if (record_.state == "dead" || condition_.load() == c) return false;
    condition_ = c;
    record_.state = ConditionName(c);
    record_.note = note;
    if (c == Condition::kRunning && !damage_.empty()) {
      record_.state = "damaged";
      record_.note = damage_;
    }
    if (c != Condition::kRunning) {
      for (const auto& w : streams_) {
        if (auto s = w.lock()) wake.push_back(std::move(s));
      }
    }
  }
  // Interrupt() only wakes readers; it writes nothing to the guest, so it never blocks.
  for (const auto& s : wake) s->Interrupt();
  return true;
}

bool VmEntry::MarkDead(const std::string& why) {
  MutexLock lock(mu_);
  if (record_.state == "dead" || why.empty()) return false;
  record_.state = "dead";
  record_.note = why;
  return true;
}

vmm::DestroyReport VmEntry::Destroy(const std::string& why) {
  vmm::DestroyReport report = vm_->Destroy(why);
  uid_.Release();
  return report;
}

void VmRegistry::Add(std::shared_ptr<VmEntry> e) {
  MutexLock lock(mu_);
  vms_[e->id()] = std::move(e);
}

std::shared_ptr<VmEntry> VmRegistry::Find(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = vms_.find(id);
  return it == vms_.end() ? nullptr : it->second;
}

std::shared_ptr<VmEntry> VmRegistry::Remove(const std::string& id) {
  MutexLock lock(mu_);
  auto it = vms_.find(id);
  if (it == vms_.end()) return nullptr;
  auto e = std::move(it->second);
  vms_.erase(it);
  return e;
}

std::vector<std::shared_ptr<VmEntry>> VmRegistry::All() const {
  MutexLock lock(mu_);
  std::vector<std::shared_ptr<VmEntry>> out;
  for (const auto& [id, e] : vms_) out.push_back(e);
  return out;
}

std::vector<std::shared_ptr<VmEntry>> VmRegistry::TakeAll() {
  MutexLock lock(mu_);
  std::vector<std::shared_ptr<VmEntry>> out;
  for (auto& [id, e] : vms_) out.push_back(std::move(e));
  vms_.clear();
  return out;
}

size_t VmRegistry::size() const {
  MutexLock lock(mu_);
  return vms_.size();
}

}  // namespace trybox::daemon
