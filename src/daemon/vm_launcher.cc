#include "daemon/vm_launcher.h"

#include <cstdio>

#include "daemon/guest_ops.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/names.h"
#include "util/process.h"
#include "vmm/accel.h"

namespace trybox::daemon {
namespace {

using Clock = std::chrono::steady_clock;

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// How many times a spare runs the warm-up exec (MakeSpare).
constexpr int kWarmExecs = 2;

// The timer check a new template's first clone runs (docs/timekeeping.md): the timer
// interrupts taken so far (the local APIC timer's LOC line and the legacy timer's IRQ 0,
// summed over the CPUs), a `sleep 1`, and the count again. A kernel that switched its
// APIC timer off while calibrating on a busy host takes none, and its sleep never returns.
constexpr const char* kTimerCheck =
    "t() { awk '$1 == \"LOC:\" || $1 == \"0:\" { for (i = 2; i <= NF; i++) "
    "if ($i ~ /^[0-9]+$/) s += $i } END { print s + 0 }' /proc/interrupts; }; "
    "a=$(t); sleep 1; b=$(t); echo \"$a $b\"";
// The sleep's bound, on the guest's clock; the host waits kHostGraceMs more (its own
// clock). A sleep that does not return by then is a timer that does not work.
constexpr int64_t kTimerCheckTimeoutMs = 10000;

// A bare vmm::Vm as the channel guest_ops talks to (the timer check's clone is no VmEntry).
class BareVm : public GuestChannel {
 public:
  explicit BareVm(vmm::Vm& vm) : vm_(vm) {}
  Result<std::shared_ptr<channel::Stream>> Open(const Json& request) override {
    return vm_.Open(request);
  }
  bool alive() const override { return vm_.alive(); }
  std::string death_reason() const override { return vm_.death_reason(); }

 private:
  vmm::Vm& vm_;
};

}  // namespace

VmLauncher::VmLauncher(LauncherOptions opts, vmm::TemplateStore& templates, UidPool& uids,
                       BackgroundQueue& background)
    : opts_(std::move(opts)),
      refill_nice_(opts_.refill_nice > 0 && CanRestorePriority() ? opts_.refill_nice : 0),
      templates_(templates),
      uids_(uids),
      background_(background),
      pool_(opts_.pool) {
  if (opts_.refill_nice > 0 && refill_nice_ == 0) {
    LogInfo("daemon",
            "spare refills run at normal priority: this daemon could not raise a spare's "
            "priority back when handing it out (no CAP_SYS_NICE, RLIMIT_NICE below 20)");
  }
  keeper_ = std::thread([this] { Keep(); });
}

VmLauncher::~VmLauncher() { DestroySpares(); }

vmm::AccelChoice VmLauncher::Accel(const std::string& image_dir, const Progress& progress) {
  {
    MutexLock lock(mu_);
    if (accel_) return *accel_;
  }
  vmm::AccelChoice c = ChooseAccel(image_dir, /*fresh=*/false, progress);
  MutexLock lock(mu_);
  if (!accel_) accel_ = c;
  return *accel_;
}

vmm::AccelChoice VmLauncher::Reprobe(const std::string& image_dir) {
  vmm::AccelChoice c = ChooseAccel(image_dir, /*fresh=*/true, {});
  MutexLock lock(mu_);
  accel_ = c;
  return c;
}

vmm::AccelChoice VmLauncher::ChooseAccel(const std::string& image_dir, bool fresh,
                                         const Progress& progress) {
  if (!opts_.force_accel.empty()) {
    vmm::AccelChoice c{opts_.force_accel, "forced by --accel " + opts_.force_accel};
    // No key: a forced choice is no probe's answer, and is never reused as one.
    if (!opts_.accel_file.empty()) {
      (void)WriteFileAtomic(opts_.accel_file,
                            Json{{"accel", c.accel}, {"reason", c.reason}}.dump());
    }
    return c;
  }
  auto key = opts_.accel_key ? opts_.accel_key(image_dir) : vmm::AccelKey(opts_.qemu, image_dir);
  if (!key.ok())
    LogWarn("daemon", "the acceleration probe's answer cannot be kept: " + key.status().message());
  if (!fresh && key.ok() && !opts_.accel_file.empty()) {
    if (auto cached = vmm::LoadCachedAccel(opts_.accel_file, *key)) {
      cached->reason +=
          " (the answer of an earlier probe on this host, kernel, QEMU and CPU; "
          "`trybox doctor --probe` probes again)";
      LogInfo("daemon", "acceleration: " + cached->accel + ", cached");
      return *cached;
    }
  }
  if (progress) {
    progress("probe", "checking whether KVM runs a guest on this host (once; the answer is kept)");
  }
  vmm::AccelChoice c = opts_.probe ? opts_.probe(image_dir)
                                   : vmm::ProbeAccel(image_dir, opts_.probe_dir, opts_.qemu);
  LogInfo("daemon", "acceleration: " + c.accel + " (" + c.reason + ")");
  if (key.ok() && !opts_.accel_file.empty()) {
    Status st = vmm::SaveAccel(opts_.accel_file, *key, c);
    if (!st.ok()) LogWarn("daemon", "could not keep the probe's answer: " + st.message());
  }
  return c;
}

vmm::TemplateShape VmLauncher::Shape(const LaunchSpec& spec, const std::string& accel) const {
  return {spec.image_name, spec.image_dir, spec.manifest_sha256, spec.memory_mib,
          spec.cpus,       accel,          opts_.qemu,           own_uid()};
}

vmm::VmConfig VmLauncher::BaseConfig(const vmm::TemplateShape& shape, const std::string& id) const {
  vmm::VmConfig cfg;
  cfg.id = id;
  cfg.image_dir = shape.image_dir;
  cfg.layers = vmm::ImageLayers(shape.image_dir);
  cfg.vm_dir = opts_.vms_dir + "/" + id;
  cfg.memory_mib = shape.memory_mib;
  cfg.cpus = shape.cpus;
  cfg.accel = shape.accel;
  cfg.qemu = shape.qemu;
  cfg.netns = opts_.netns;
  return cfg;
}

Result<LaunchedVm> VmLauncher::Launch(const LaunchSpec& spec) {
  const Progress& progress = spec.progress;
  const vmm::TemplateShape shape = Shape(spec, Accel(spec.image_dir, progress).accel);
  LaunchedVm out;
  if (!spec.cold) {
    auto spare = TakeSpare(shape);
    // The next spare is started now, at a lower priority than the VM handed out here.
    RefillLater(shape);
    if (spare) {
      if (spare->niced) {
        Status st = spare->vm->SetNice(0);
        if (!st.ok())
          LogWarn("daemon", "could not give a spare its priority back: " + st.message());
      }
      // It got its identity when it was made; only the clock may have moved since.
      Status st = spare->vm->SetClock(Clock::now() + opts_.boot_timeout);
      if (st.ok()) {
        out.vm = std::move(spare->vm);
        out.uid = std::move(spare->uid);
        out.start = {{"mode", "restored"}, {"spare", true}};
        return out;
      }
      LogWarn("daemon", "a spare clone did not take the clock; restoring another: " + st.message());
      spare->vm->Destroy();
    }
  }
  ASSIGN_OR_RETURN(out.uid, uids_.Acquire());
  vmm::VmConfig cfg = BaseConfig(shape, NewId());
  cfg.qemu_uid = out.uid.uid();
  auto boot_cold = [&](const std::string& note) -> Result<LaunchedVm> {
    out.start = {{"mode", "cold"}, {"note", note}};
    if (progress) progress("cold", "booting the kernel (" + note + ")");
    ASSIGN_OR_RETURN(out.vm, vmm::Vm::Boot(cfg, opts_.boot_timeout));
    return std::move(out);
  };
  if (spec.cold) return boot_cold("a full boot was asked for (--cold)");
  auto tpl = GetTemplate(shape, progress);
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
  if (progress) progress("restore", "restoring a clone of the template (no spare clone was ready)");
  auto vm = vmm::Vm::Restore(restore, opts_.boot_timeout);
  tpl->hold.unlock();
  if (vm.ok()) {
    out.vm = std::move(*vm);
    out.start = {{"mode", "restored"}, {"spare", false}, {"template", template_info}};
    return out;
  }
  std::string why = FirstLine(vm.status().message());
  // A full disk is not the template's fault: it stays, and the create fails naming the
  // cause (a cold boot would need the same space).
  auto free = vmm::FreeBytes(opts_.vms_dir);
  if (vm.status().code() == Code::kResourceExhausted ||
      (free.ok() && *free < vmm::kTemplateSlackBytes)) {
    return ResourceExhausted("no_space: a clone could not be restored with " +
                             (free.ok() ? std::to_string(*free >> 20) : std::string("?")) +
                             " MiB free under " + opts_.vms_dir + " (" + why +
                             "); the template was kept");
  }
  templates_.Discard(shape, "restore failed: " + why);
  RebuildLater(shape);
  std::string note = "the template failed to restore (" + why +
                     "); it was discarded and is being rebuilt; this VM booted cold";
  LogWarn("daemon", note);
  return boot_cold(note);
}

Result<vmm::TemplateStore::Lease> VmLauncher::GetTemplate(const vmm::TemplateShape& shape,
                                                          const Progress& progress) {
  ASSIGN_OR_RETURN(UidLease uid, uids_.Acquire());
  // The template VM, if one is booted, is gone when Get returns; the uid goes with `uid`.
  return templates_.Get(
      shape, vmm::TemplateStore::Sandbox{opts_.netns, uid.uid()},
      [this, &shape](const std::string& dir, int memory_fd) {
        return ProveTimer(shape, dir, memory_fd);
      },
      progress);
}

Result<Json> VmLauncher::ProveTimer(const vmm::TemplateShape& shape, const std::string& dir,
                                    int memory_fd) {
  ASSIGN_OR_RETURN(UidLease uid, uids_.Acquire());
  vmm::VmConfig cfg = BaseConfig(shape, NewId());
  cfg.mode = vmm::StartMode::kRestore;
  cfg.template_dir = dir;
  cfg.memory_fd = memory_fd;
  cfg.qemu_uid = uid.uid();
  ASSIGN_OR_RETURN(auto vm, vmm::Vm::Restore(cfg, opts_.boot_timeout));
  BareVm guest(*vm);
  std::string output;
  ExecIo io;
  io.capture = &output;
  const auto start = Clock::now();
  ExecResult r = RunExec(
      guest, ExecSpec{.argv = {"sh", "-c", kTimerCheck}, .timeout_ms = kTimerCheckTimeoutMs}, io);
  const int64_t elapsed_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  std::string console = vm->ConsoleTail(600);
  vm->Destroy();
  if (!r.Succeeded()) {
    return Unavailable("its first clone's `sleep 1` did not return within " +
                       std::to_string(kTimerCheckTimeoutMs / 1000) + " s (" +
                       ExecOutcomeName(r.outcome) + (r.message.empty() ? "" : ": " + r.message) +
                       ")" + (console.empty() ? "" : "; console: " + console));
  }
  long long before = -1, after = -1;
  if (std::sscanf(output.c_str(), "%lld %lld", &before, &after) != 2) {
    return Unavailable("the timer check printed no interrupt counts: " + output.substr(0, 200));
  }
  Json proof = {{"timer_interrupts_before", before},
                {"timer_interrupts_after", after},
                {"check_ms", elapsed_ms}};
  if (after <= before) {
    return Unavailable("its timer interrupts did not rise across a `sleep 1` (" +
                       std::to_string(before) + " then " + std::to_string(after) + ")");
  }
  return proof;
}

std::optional<VmLauncher::Spare> VmLauncher::TakeSpare(const vmm::TemplateShape& shape) {
  auto key = vmm::ComputeTemplateKey(shape);
  if (!key.ok()) return std::nullopt;
  std::vector<Spare> stale;
  const auto now = Clock::now();
  // A spare of an older template (the image or QEMU changed since) is not this shape.
  auto spare = pool_.Take(
      templates_.DirFor(shape), shape.memory_mib, now, now + opts_.boot_timeout,
      [&](const Spare& s) { return s.key == key->hash && s.vm->alive(); }, &stale);
  for (auto& s : stale) s.vm->Destroy();
  PokeKeeper();
  return spare;
}

void VmLauncher::RebuildLater(const vmm::TemplateShape& shape) {
  background_.Enqueue("rebuild " + templates_.DirFor(shape), [this, shape] {
    auto lease = GetTemplate(shape);
    if (!lease.ok()) LogWarn("daemon", "template rebuild failed: " + lease.status().message());
  });
  RefillLater(shape);
}

void VmLauncher::RefillLater(const vmm::TemplateShape& shape) {
  if (!pool_.enabled()) return;
  background_.Enqueue("refill " + templates_.DirFor(shape), [this, shape] { Refill(shape); });
}

void VmLauncher::Refill(const vmm::TemplateShape& shape) {
  const std::string dir = templates_.DirFor(shape);
  // Runs on any of the background queue's workers, possibly beside another Refill of the
  // same shape: each spare is begun in one step with the pool, so none is made twice.
  while (pool_.BeginRefill(dir, shape.memory_mib, Clock::now())) {
    auto spare = MakeSpare(shape, dir);
    if (!spare.ok())
      LogWarn("daemon", "could not prepare a spare clone: " + spare.status().message());
    // A refill hurried for a waiting create (MakeSpare) may find that create served by
    // another refill that ended first: a spare that goes to the ready list waits at the
    // refill priority again, whichever refill it came from.
    auto leftover = pool_.RefillDone(
        dir, spare.ok() ? std::optional<Spare>(std::move(*spare)) : std::nullopt, Clock::now(),
        [this](Spare& ready) {
          if (ready.niced || refill_nice_ == 0) return;
          Status st = ready.vm->SetNice(refill_nice_);
          if (st.ok()) {
            ready.niced = true;
          } else {
            LogWarn("daemon", "could not lower a ready spare's priority: " + st.message());
          }
        });
    PokeKeeper();
    if (leftover) leftover->vm->Destroy();
    if (!spare.ok() || background_.stopping()) return;
  }
}

Result<VmLauncher::Spare> VmLauncher::MakeSpare(const vmm::TemplateShape& shape,
                                                const std::string& dir) {
  ASSIGN_OR_RETURN(auto key, vmm::ComputeTemplateKey(shape));
  ASSIGN_OR_RETURN(auto lease, GetTemplate(shape));
  ASSIGN_OR_RETURN(UidLease uid, uids_.Acquire());
  vmm::VmConfig cfg = BaseConfig(shape, NewId());
  cfg.mode = vmm::StartMode::kRestore;
  cfg.template_dir = lease.dir;
  cfg.memory_fd = lease.memory_fd;
  cfg.qemu_uid = uid.uid();
  cfg.nice = refill_nice_;
  auto vm = vmm::Vm::Restore(cfg, opts_.boot_timeout, /*identify=*/false);
  lease.hold.unlock();
  if (!vm.ok()) return vm.status();
  Spare spare{std::move(*vm), key.hash, std::move(uid), refill_nice_ != 0};
  // A create is waiting for this one: it need not yield any more.
  if (spare.niced && pool_.Claimed(dir) && spare.vm->SetNice(0).ok()) spare.niced = false;
  // Made its own machine here rather than when it is handed out (the hand-out only sets
  // the clock again), then warmed with the very request `trybox exec ID -- true` sends,
  // twice. Measured by the pages QEMU dirtied during a caller's first exec: a fixed
  // `/bin/true` before the identity left it 220-400 KiB of guest RAM (guest spawn-to-exit
  // 24-28 ms against 8-12 for later ones); one such run after the identity, 112-124 KiB
  // (12-20 ms); two, 28-36 KiB (12-13 ms) (docs/performance.md).
  Status st = spare.vm->Identify(Clock::now() + opts_.boot_timeout);
  spare.vm->NoteCpu("cpu_at_identified_ms");
  const Json warm = GuestExecRequest(ExecSpec{.argv = {"true"}});
  for (int i = 0; i < kWarmExecs && st.ok(); ++i) {
    st = spare.vm->Warm(warm, Clock::now() + opts_.boot_timeout);
  }
  if (!st.ok()) {
    spare.vm->Destroy();
    return st;
  }
  spare.vm->NoteCpu("cpu_at_ready_ms");
  return spare;
}

void VmLauncher::PokeKeeper() {
  MutexLock lock(keeper_mu_);
  keeper_poked_ = true;
  keeper_cv_.SignalAll();
}

void VmLauncher::Keep() {
  for (;;) {
    {
      MutexLock lock(keeper_mu_);
      while (!keeper_stop_ && !keeper_poked_) {
        auto next = pool_.NextRelease(Clock::now());
        if (!next) {
          keeper_cv_.Wait(keeper_mu_);
        } else if (!keeper_cv_.WaitUntil(keeper_mu_, *next)) {
          break;  // one is due
        }
      }
      if (keeper_stop_) return;
      keeper_poked_ = false;
    }
    for (auto& s : pool_.Release(Clock::now())) {
      LogInfo("daemon", "released an idle spare clone (" + s.vm->config().id + ")");
      s.vm->Destroy();
    }
  }
}

Json VmLauncher::SpareCounts() const {
  Json out = Json::object();
  for (const auto& [dir, n] : pool_.ReadyCounts()) out[dir.substr(dir.rfind('/') + 1)] = n;
  return out;
}

Json VmLauncher::DescribeSpares() const {
  Json d = pool_.Describe(Clock::now());
  Json shapes = Json::object();
  for (auto& [dir, v] : d["shapes"].items()) shapes[dir.substr(dir.rfind('/') + 1)] = v;
  d["shapes"] = shapes;
  d["refill_nice"] = refill_nice_;
  d["refill_workers"] = background_.workers();
  return d;
}

Json VmLauncher::DescribeTemplate(const std::string& image_name, const std::string& image_dir,
                                  const std::string& accel) const {
  return vmm::DescribeImageTemplate(opts_.templates_dir, image_name, image_dir, accel, opts_.qemu,
                                    own_uid());
}

void VmLauncher::DestroySpares() {
  {
    MutexLock lock(keeper_mu_);
    keeper_stop_ = true;
    keeper_cv_.SignalAll();
  }
  if (keeper_.joinable()) keeper_.join();
  for (auto& s : pool_.Stop()) s.vm->Destroy();
}

}  // namespace trybox::daemon
