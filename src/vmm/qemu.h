// QEMU command lines, the acceleration probe, and Vm: one running microVM.
//
// A Vm owns its QEMU process (own process group), its directory under the runtime dir
// (control socket, console log, writable disk layer) and the channel::Mux to its guest
// agent. It is created by Boot(), which returns only once the guest agent answered a ping;
// anything short of that is torn down and reported. Thread-safe: requests may be opened
// from many threads at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "channel/mux.h"
#include "util/process.h"
#include "util/status.h"

namespace trybox::vmm {

using Json = nlohmann::json;

struct VmConfig {
  std::string id;
  std::string image_dir;  // verified frozen image
  std::string vm_dir;     // created by Boot, removed by Destroy
  int memory_mib = 512;
  int cpus = 1;
  std::string accel = "tcg";  // "kvm" or "tcg"
  std::string qemu = "qemu-system-x86_64";
  // Egress layer 1 (docs/architecture.md): QEMU starts in a network namespace of its own with
  // only `lo`, and, if `qemu_uid` is set (the daemon is root), as that uid and gid. QEMU then
  // reaches the image and the VM directory through inherited directory fds
  // (/proc/self/fd/3 and /proc/self/fd/4), so neither path's ancestors need opening up.
  bool netns = true;
  std::optional<uid_t> qemu_uid;
  // Streams the guest opens (egress tunnels). Without one the host refuses them.
  channel::Mux::OpenHandler guest_open;
};

// The full argv for a VM: -M microvm, no network card, no default devices, the frozen root
// read-only, a per-VM qcow2 layer, and the control port org.trybox.ctl on a unix socket.
std::vector<std::string> QemuArgv(const VmConfig& c);
std::string KernelCmdline(const VmConfig& c);

struct AccelChoice {
  std::string accel;   // "kvm" or "tcg"
  std::string reason;  // why, in words a person can act on
};
// Boots the image's kernel under KVM with trybox.probe=1 and looks for the guest's marker on
// the console. KVM is chosen only if a standard guest actually runs; /dev/kvm existing is
// not enough (nested hosts can fail the first MSR write).
AccelChoice ProbeAccel(const std::string& image_dir, const std::string& work_dir,
                       const std::string& qemu = "qemu-system-x86_64");

// What Destroy observed, not what it sent.
struct DestroyReport {
  bool process_gone = false;
  std::string qemu_exit;  // "signal 9 (Killed)", "exit code 0", or why unknown
  bool sockets_removed = false;
  bool dir_removed = false;
  Json ToJson() const;
};

class Vm {
 public:
  // Spawns QEMU and waits for the guest agent's hello and a ping reply, up to `timeout`.
  // On failure everything started is killed and removed; the error quotes the console tail.
  static Result<std::unique_ptr<Vm>> Boot(const VmConfig& config,
                                          std::chrono::milliseconds timeout);
  ~Vm();

  const VmConfig& config() const { return config_; }
  pid_t pid() const { return pid_; }
  double boot_ms() const { return boot_ms_; }

  // Opens a request stream to the guest agent. kUnavailable once the guest is gone.
  Result<std::shared_ptr<channel::Stream>> Open(const Json& request);
  bool alive() const;
  // Why the VM is no longer usable ("" while alive): QEMU exit or channel loss.
  std::string death_reason() const;

  // Kills QEMU, waits for it, removes sockets and the directory, and reports what it saw.
  // Idempotent: a second call returns the first report.
  DestroyReport Destroy();

  // Last `max` bytes of the serial console log (for error messages).
  std::string ConsoleTail(size_t max = 2000) const;

 private:
  explicit Vm(VmConfig c) : config_(std::move(c)) {}
  void WatchQemu();

  VmConfig config_;
  pid_t pid_ = -1;
  double boot_ms_ = 0;
  std::unique_ptr<channel::Mux> mux_;
  std::thread watcher_;  // waits for QEMU's exit
  mutable std::mutex mu_;
  mutable std::condition_variable exited_cv_;
  std::optional<ExitInfo> qemu_exit_;  // GUARDED_BY(mu_)
  std::string death_;                  // GUARDED_BY(mu_)
  std::optional<DestroyReport> destroyed_;
};

// Kills a QEMU left behind by a daemon that died, if `pid` is still that VM's process (its
// command line names the VM id), then removes `vm_dir`. Reports what it observed.
DestroyReport ReapOrphan(const std::string& id, int64_t pid, const std::string& vm_dir);

}  // namespace trybox::vmm
