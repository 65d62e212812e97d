#include "daemon/vm_registry.h"

namespace trybox::daemon {

store::VmRecord VmEntry::record() const {
  MutexLock lock(mu_);
  return record_;
}

bool VmEntry::MarkDead(const std::string& why) {
  MutexLock lock(mu_);
  if (record_.state != "running" || why.empty()) return false;
  record_.state = "dead";
  record_.note = why;
  return true;
}

vmm::DestroyReport VmEntry::Destroy() {
  vmm::DestroyReport report = vm_->Destroy();
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
