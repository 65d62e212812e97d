#include "daemon/vm_launcher.h"

#include "util/fd.h"
#include "util/log.h"
#include "util/names.h"

namespace trybox::daemon {
namespace {

using Clock = std::chrono::steady_clock;

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

VmLauncher::~VmLauncher() { DestroySpares(); }

vmm::AccelChoice VmLauncher::Accel(const std::string& image_dir) {
  {
    MutexLock lock(mu_);
    if (accel_) return *accel_;
  }
  vmm::AccelChoice c;
  if (!opts_.force_accel.empty()) {
    c = {opts_.force_accel, "forced by --accel " + opts_.force_accel};
  } else {
    c = vmm::ProbeAccel(image_dir, opts_.probe_dir, opts_.qemu);
  }
  LogInfo("daemon", "acceleration: " + c.accel + " (" + c.reason + ")");
  if (!opts_.accel_file.empty()) {
    (void)WriteFileAtomic(opts_.accel_file, Json{{"accel", c.accel}, {"reason", c.reason}}.dump());
  }
  MutexLock lock(mu_);
  if (!accel_) accel_ = c;
  return *accel_;
}

vmm::TemplateShape VmLauncher::Shape(const LaunchSpec& spec, const std::string& accel) const {
  return {spec.image_name, spec.image_dir, spec.manifest_sha256, spec.memory_mib,
          spec.cpus,       accel,          opts_.qemu,           own_uid()};
}

vmm::VmConfig VmLauncher::BaseConfig(const vmm::TemplateShape& shape, const std::string& id) const {
  vmm::VmConfig cfg;
  cfg.id = id;
  cfg.image_dir = shape.image_dir;
  cfg.vm_dir = opts_.vms_dir + "/" + id;
  cfg.memory_mib = shape.memory_mib;
  cfg.cpus = shape.cpus;
  cfg.accel = shape.accel;
  cfg.qemu = shape.qemu;
  cfg.netns = opts_.netns;
  return cfg;
}

Result<LaunchedVm> VmLauncher::Launch(const LaunchSpec& spec) {
  const vmm::TemplateShape shape = Shape(spec, Accel(spec.image_dir).accel);
  LaunchedVm out;
  if (!spec.cold) {
    if (auto spare = TakeSpare(shape)) {
      Status st = spare->vm->Identify(Clock::now() + opts_.boot_timeout);
      if (st.ok()) {
        out.vm = std::move(spare->vm);
        out.uid = std::move(spare->uid);
        out.start = {{"mode", "restored"}, {"spare", true}};
        RefillLater(shape);
        return out;
      }
      LogWarn("daemon", "a spare clone failed its identity; restoring another: " + st.message());
      spare->vm->Destroy();
    }
  }
  ASSIGN_OR_RETURN(out.uid, uids_.Acquire());
  vmm::VmConfig cfg = BaseConfig(shape, NewId());
  cfg.qemu_uid = out.uid.uid();
  auto boot_cold = [&](const std::string& note) -> Result<LaunchedVm> {
    out.start = {{"mode", "cold"}, {"note", note}};
    ASSIGN_OR_RETURN(out.vm, vmm::Vm::Boot(cfg, opts_.boot_timeout));
    return std::move(out);
  };
  if (spec.cold) return boot_cold("a full boot was asked for (--cold)");
  auto tpl = GetTemplate(shape);
  if (!tpl.ok()) {
    // No template means no restore, not no VM: the cold boot may still work.
    std::string note =
        "no template could be built (" + FirstLine(tpl.status().message()) + "); booted cold";
    LogWarn("daemon", note);
    return boot_cold(note);
  }
  Json template_info = {{"built", tpl->built}};
  if (tpl->built) {
    template_info["why"] = tpl->built_why;
    template_info["build_ms"] = tpl->build_ms;
  }
  vmm::VmConfig restore = cfg;
  restore.mode = vmm::StartMode::kRestore;
  restore.template_dir = tpl->dir;
  restore.memory_fd = tpl->memory_fd;
  auto vm = vmm::Vm::Restore(restore, opts_.boot_timeout);
  tpl->hold.unlock();
  if (vm.ok()) {
    out.vm = std::move(*vm);
    out.start = {{"mode", "restored"}, {"spare", false}, {"template", template_info}};
    RefillLater(shape);
    return out;
  }
  std::string why = FirstLine(vm.status().message());
  templates_.Discard(shape, "restore failed: " + why);
  RebuildLater(shape);
  std::string note = "the template failed to restore (" + why +
                     "); it was discarded and is being rebuilt; this VM booted cold";
  LogWarn("daemon", note);
  return boot_cold(note);
}

Result<vmm::TemplateStore::Lease> VmLauncher::GetTemplate(const vmm::TemplateShape& shape) {
  ASSIGN_OR_RETURN(UidLease uid, uids_.Acquire());
  // The template VM, if one is booted, is gone when Get returns; the uid goes with `uid`.
  return templates_.Get(shape, vmm::TemplateStore::Sandbox{opts_.netns, uid.uid()});
}

std::optional<VmLauncher::Spare> VmLauncher::TakeSpare(const vmm::TemplateShape& shape) {
  auto key = vmm::ComputeTemplateKey(shape);
  if (!key.ok()) return std::nullopt;
  std::vector<Spare> stale;
  std::optional<Spare> found;
  {
    MutexLock lock(mu_);
    auto& list = spares_[templates_.DirFor(shape)];
    while (!list.empty() && !found) {
      Spare s = std::move(list.back());
      list.pop_back();
      // A spare of an older template (the image or QEMU changed since) is not this shape.
      if (s.key == key->hash && s.vm->alive()) {
        found = std::move(s);
      } else {
        stale.push_back(std::move(s));
      }
    }
  }
  for (auto& s : stale) s.vm->Destroy();
  return found;
}

void VmLauncher::RebuildLater(const vmm::TemplateShape& shape) {
  background_.Enqueue("rebuild " + templates_.DirFor(shape), [this, shape] {
    auto lease = GetTemplate(shape);
    if (!lease.ok()) LogWarn("daemon", "template rebuild failed: " + lease.status().message());
  });
  RefillLater(shape);
}

void VmLauncher::RefillLater(const vmm::TemplateShape& shape) {
  if (opts_.spares <= 0) return;
  // The create that just took a spare is about to run its caller's first commands;
  // restoring the next spare at the same moment would take a core from them.
  auto not_before = Clock::now() + opts_.refill_delay;
  background_.Enqueue("refill " + templates_.DirFor(shape), [this, shape, not_before] {
    if (background_.SleepUntil(not_before)) Refill(shape);
  });
}

void VmLauncher::Refill(const vmm::TemplateShape& shape) {
  const std::string dir = templates_.DirFor(shape);
  for (;;) {
    {
      MutexLock lock(mu_);
      if (stopping_ || static_cast<int>(spares_[dir].size()) >= opts_.spares) return;
    }
    auto key = vmm::ComputeTemplateKey(shape);
    auto lease = GetTemplate(shape);
    auto uid = uids_.Acquire();
    if (!key.ok() || !lease.ok() || !uid.ok()) return;
    vmm::VmConfig cfg = BaseConfig(shape, NewId());
    cfg.mode = vmm::StartMode::kRestore;
    cfg.template_dir = lease->dir;
    cfg.memory_fd = lease->memory_fd;
    cfg.qemu_uid = uid->uid();
    auto vm = vmm::Vm::Restore(cfg, opts_.boot_timeout, /*identify=*/false);
    lease->hold.unlock();
    Status st = vm.ok() ? (*vm)->Warm(Clock::now() + opts_.boot_timeout) : vm.status();
    if (!st.ok()) {
      LogWarn("daemon", "could not prepare a spare clone: " + st.message());
      return;
    }
    {
      MutexLock lock(mu_);
      if (!stopping_) {
        spares_[dir].push_back({std::move(*vm), key->hash, std::move(*uid)});
        continue;
      }
    }
    (*vm)->Destroy();
    return;
  }
}

Json VmLauncher::SpareCounts() const {
  Json out = Json::object();
  MutexLock lock(mu_);
  for (const auto& [dir, list] : spares_) out[dir.substr(dir.rfind('/') + 1)] = list.size();
  return out;
}

Json VmLauncher::DescribeTemplate(const std::string& image_name, const std::string& image_dir,
                                  const std::string& accel) const {
  return vmm::DescribeImageTemplate(opts_.templates_dir, image_name, image_dir, accel, opts_.qemu,
                                    own_uid());
}

void VmLauncher::DestroySpares() {
  std::map<std::string, std::vector<Spare>> spares;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    spares.swap(spares_);
  }
  for (auto& [dir, list] : spares) {
    for (auto& s : list) s.vm->Destroy();
  }
}

}  // namespace trybox::daemon
