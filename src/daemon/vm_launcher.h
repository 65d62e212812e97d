// VmLauncher: turns "a VM of this image and shape" into a running, identified vmm::Vm.
//
// It chooses the acceleration (a real probe boot, once per daemon), restores clones from
// the shape's template (built on first use), keeps warmed spare clones per shape in a pool
// sized to demand (spare_pool.h), and boots cold when asked or when no template can be
// had. Template rebuilds and spare refills run on the background queue; a refill's QEMU
// runs at a lower CPU priority until its spare is handed out. A keeper thread releases
// idle spares when the pool says one is due. Every QEMU it starts runs in its own network
// namespace and, under a root daemon, as a uid leased from the UidPool
// (docs/templates.md, docs/architecture.md).
//
// Thread-safe. Its mutex guards the acceleration choice, the pool has its own; neither is
// held while a VM boots or is destroyed.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/background.h"
#include "daemon/spare_pool.h"
#include "daemon/uid_pool.h"
#include "nlohmann/json.hpp"
#include "util/mutex.h"
#include "vmm/qemu.h"
#include "vmm/template.h"

namespace trybox::daemon {

using Json = nlohmann::json;

// Told before a step of a create that may take seconds: (stage, what is being done).
// Stages: "probe", "template", "memory", "restore", "cold" (docs/protocol/daemon.md).
using Progress = std::function<void(const std::string& stage, const std::string& message)>;

struct LauncherOptions {
  std::string vms_dir;        // per-VM directories
  std::string templates_dir;  // TemplateStore's root
  std::string probe_dir;      // where the acceleration probe runs
  std::string accel_file;     // the probe's result and its key (vmm/accel.h), reused
  std::string qemu = "qemu-system-x86_64";
  std::string force_accel;  // "kvm", "tcg", or "" to probe
  std::chrono::milliseconds boot_timeout{120000};
  SparePoolOptions pool;  // min_spares 0: no spares
  // The nice value of a refill's QEMU until its spare is handed out (0 where the daemon
  // could not take it back: no CAP_SYS_NICE, RLIMIT_NICE below 20).
  int refill_nice = 10;
  bool netns = true;
  // Seams for tests; empty means the real ones: vmm::ProbeAccel (5 s at most) and
  // vmm::AccelKey.
  std::function<vmm::AccelChoice(const std::string& image_dir)> probe;
  std::function<Result<Json>(const std::string& image_dir)> accel_key;
};

struct LaunchSpec {
  std::string image_name;
  std::string image_dir;  // verified
  std::string manifest_sha256;
  int memory_mib = 512;
  int cpus = 1;
  bool cold = false;
  Progress progress;  // may be empty
};

struct LaunchedVm {
  std::unique_ptr<vmm::Vm> vm;
  UidLease uid;
  // How it started: {"mode":"restored","spare":bool,"template"?:{...}} or
  // {"mode":"cold","note":why}.
  Json start;
};

class VmLauncher {
 public:
  VmLauncher(LauncherOptions opts, vmm::TemplateStore& templates, UidPool& uids,
             BackgroundQueue& background);
  // Destroys the spares.
  ~VmLauncher();

  // The accelerator for VMs of `image_dir`'s kernel: the probe's answer kept in accel_file
  // while its key holds (across restarts), else probed once and kept.
  vmm::AccelChoice Accel(const std::string& image_dir, const Progress& progress = {}) EXCLUDES(mu_);
  // Probes again whatever is cached (doctor --probe), and keeps the new answer.
  vmm::AccelChoice Reprobe(const std::string& image_dir) EXCLUDES(mu_);
  // Starts a VM. Returns once its guest agent answered (and, for a clone, took its
  // identity). A VM id is chosen here (a spare brings its own).
  Result<LaunchedVm> Launch(const LaunchSpec& spec) EXCLUDES(mu_);
  // Ready spares per template directory name.
  Json SpareCounts() const;
  // The pool for doctor: SparePool::Describe plus "refill_nice", shapes by template name.
  Json DescribeSpares() const;
  bool own_uid() const { return uids_.enabled(); }
  // The template's description for doctor / image ls.
  Json DescribeTemplate(const std::string& image_name, const std::string& image_dir,
                        const std::string& accel) const;
  // Destroys every spare (shutdown).
  void DestroySpares() EXCLUDES(mu_);

 private:
  struct Spare {
    std::unique_ptr<vmm::Vm> vm;
    std::string key;  // the template key it was restored from
    UidLease uid;
    bool niced = false;  // still at the refill's priority
  };
  vmm::AccelChoice ChooseAccel(const std::string& image_dir, bool fresh, const Progress& progress);
  vmm::TemplateShape Shape(const LaunchSpec& spec, const std::string& accel) const;
  vmm::VmConfig BaseConfig(const vmm::TemplateShape& shape, const std::string& id) const;
  Result<vmm::TemplateStore::Lease> GetTemplate(const vmm::TemplateShape& shape,
                                                const Progress& progress = {});
  // Restores a clone of the template just built in `dir` and checks its timer
  // (docs/timekeeping.md): what it measured, or why the template is broken.
  Result<Json> ProveTimer(const vmm::TemplateShape& shape, const std::string& dir, int memory_fd);
  // A ready spare of `shape`'s current template (or one being prepared, waited for).
  std::optional<Spare> TakeSpare(const vmm::TemplateShape& shape);
  void RebuildLater(const vmm::TemplateShape& shape);
  void RefillLater(const vmm::TemplateShape& shape);
  void Refill(const vmm::TemplateShape& shape);
  Result<Spare> MakeSpare(const vmm::TemplateShape& shape, const std::string& dir);
  // Releases idle spares when the pool says one is due; sleeps until then.
  void Keep() EXCLUDES(keeper_mu_);
  void PokeKeeper() EXCLUDES(keeper_mu_);

  const LauncherOptions opts_;
  const int refill_nice_;
  vmm::TemplateStore& templates_;
  UidPool& uids_;
  BackgroundQueue& background_;
  mutable Mutex mu_;
  std::optional<vmm::AccelChoice> accel_ GUARDED_BY(mu_);
  SparePool<Spare> pool_;  // by template dir
  Mutex keeper_mu_;
  CondVar keeper_cv_;
  bool keeper_stop_ GUARDED_BY(keeper_mu_) = false;
  bool keeper_poked_ GUARDED_BY(keeper_mu_) = false;
  std::thread keeper_;
};

}  // namespace trybox::daemon
