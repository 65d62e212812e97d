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
#include "util/mutex.h"
#include "util/process.h"
#include "util/status.h"

namespace trybox::vmm {

using Json = nlohmann::json;

// How a VM comes to life (docs/templates.md).
enum class StartMode {
  kCold,      // boots the kernel; identity on the kernel command line
  kTemplate,  // boots the kernel to be saved as a template: RAM in a shared file, no identity
  kRestore,   // a clone: RAM mapped privately from a template's file, devices loaded from its
              // saved state, identity sent over the channel once the guest answers
};

inline constexpr int kDefaultMemoryMib = 512;

struct VmConfig {
  std::string id;
  std::string image_dir;  // verified frozen image
  // Read-only layers over the root (a derived image's layer-1.ext4 .. layer-N.ext4,
  // docs/images.md): each a disk of its own, stacked by the guest's overlay.
  int layers = 0;
  std::string vm_dir;  // created by Boot, removed by Destroy
  int memory_mib = kDefaultMemoryMib;
  int cpus = 1;
  std::string accel = "tcg";  // "kvm" or "tcg"
  std::string qemu = "qemu-system-x86_64";
  StartMode mode = StartMode::kCold;
  // kTemplate and kRestore: holds `memory`, `state`, `disk.qcow2` and `clone.qcow2`.
  std::string template_dir;
  // kRestore: the template's RAM as a sealed memfd (TemplateStore::Lease::memory_fd).
  int memory_fd = -1;
  // Egress layer 1 (docs/architecture.md): QEMU starts in a network namespace of its own with
  // only `lo`, and, if `qemu_uid` is set (the daemon is root), as that uid and gid. QEMU then
  // reaches the image and the VM directory through inherited directory fds
  // (/proc/self/fd/3 and /proc/self/fd/4), so neither path's ancestors need opening up.
  bool netns = true;
  std::optional<uid_t> qemu_uid;
  // QEMU's nice value from its start (a spare being prepared yields the CPU to the VMs in
  // use; Vm::SetNice takes it back when the spare is handed out).
  int nice = 0;
};

// Descriptors QEMU inherits: the image and VM directories (O_PATH) when it runs as another
// uid, plus the template directory, the saved state and the RAM memfd for a clone (always:
// a clone's disk names its backing file through the template directory's fd).
inline constexpr int kImageDirFd = 3;
inline constexpr int kVmDirFd = 4;
inline constexpr int kTemplateDirFd = 5;
inline constexpr int kRestoreStateFd = 6;
inline constexpr int kRestoreMemoryFd = 7;
// The guest channel's and the monitor's listening sockets (ctl.sock, qmp.sock in the VM's
// directory), made by the daemon before QEMU starts, so that connecting to them never waits
// for QEMU to create them. Every QEMU inherits them as these fds (unused lower slots hold
// /dev/null).
inline constexpr int kCtlSocketFd = 8;
inline constexpr int kQmpSocketFd = 9;

// Files of a template directory.
inline constexpr const char* kTemplateMemory = "/memory";
inline constexpr const char* kTemplateState = "/state";
inline constexpr const char* kTemplateDisk = "/disk.qcow2";
inline constexpr const char* kTemplateCloneDisk = "/clone.qcow2";  // empty overlay for clones

// The transfer disk: a file in every VM's directory behind a virtio-blk slot with this serial.
inline constexpr const char* kTransferDisk = "xfer.img";
inline constexpr const char* kTransferDiskSerial = "trybox-xfer";
// The workspace disk (docs/protocol/guest.md, "The workspace disk"): another raw file of the
// VM's own, of capacity 0 until a workspace's ext4 image is written into it.
inline constexpr const char* kWorkspaceDisk = "ws.img";
inline constexpr const char* kWorkspaceDiskSerial = "trybox-ws";

// The layers of the verified image in `image_dir`: how many layer-K.ext4 parts it has, from
// K = 1 up (0 for a base image).
int ImageLayers(const std::string& image_dir);
// The serial of the disk holding layer K, as the guest finds it: "trybox-layer-K".
std::string LayerDiskSerial(int k);

// The full argv for a VM: -M microvm, no network card, no default devices, the frozen root
// read-only, a per-VM qcow2 layer, and the control port org.trybox.ctl on a unix socket.
std::vector<std::string> QemuArgv(const VmConfig& c);
std::string KernelCmdline(const VmConfig& c);
// QEMU's environment: the daemon's own (`parent`, NAME=VALUE entries), TRYBOX_VM_DIR=vm_dir,
// and glibc's malloc told to ask for transparent huge pages for its heap
// (GLIBC_TUNABLES=glibc.malloc.hugetlb=1, added to whatever tunables `parent` sets; one that
// already sets glibc.malloc.hugetlb is left as it is). QEMU's start allocates and touches
// tens of MiB, and each 4 KiB fault is slow in a nested VM: the setting took a start's CPU
// from 96 to 76 ms p50 and its page faults from 4,130 to 2,730 (docs/performance.md).
std::vector<std::string> QemuEnvironment(const std::vector<std::string>& parent,
                                         const std::string& vm_dir);

struct AccelChoice {
  std::string accel;   // "kvm" or "tcg"
  std::string reason;  // why, in words a person can act on
};
// ProbeAccel and the probe's reaping: accel.h.

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
  // kCold or kTemplate.
  static Result<std::unique_ptr<Vm>> Boot(const VmConfig& config,
                                          std::chrono::milliseconds timeout);
  // kRestore: starts QEMU with `-incoming`, loads the template's saved state, waits for the
  // restored guest agent's hello, and gives the clone its identity (fresh entropy, clock,
  // hostname, machine-id). Returns only once the clone may serve requests.
  // With `identify` false the clone is left without one (a spare): call Identify() before
  // it serves anything, and SetClock() when it is handed out after waiting.
  static Result<std::unique_ptr<Vm>> Restore(const VmConfig& config,
                                             std::chrono::milliseconds timeout,
                                             bool identify = true);

  // Gives a restored clone its own identity: fresh entropy (kernel CRNG reseeded), the
  // host's wall clock, hostname trybox-<id>, a new machine-id. Once per clone.
  Status Identify(std::chrono::steady_clock::time_point deadline);
  // Sets the guest's wall clock to the host's again (an identified clone that waited as a
  // spare). Records how far off it was (phases: clock_offset_ms) and the round trip
  // (clock_ms).
  Status SetClock(std::chrono::steady_clock::time_point deadline);
  // The same step for a running VM (the heartbeat's, docs/timekeeping.md): how far the
  // guest's wall clock was from the host's, in ns (positive: the guest was behind). Records
  // nothing in phases(), so it may run beside anything.
  Result<int64_t> StepClock(std::chrono::steady_clock::time_point deadline);
  // Runs `exec_request` (an exec request as the daemon sends one for a caller) to its end,
  // which must be exit code 0, so that the emulator has translated that exec's whole path,
  // the guest kernel's included, before a caller's first exec (see docs/templates.md).
  Status Warm(const Json& exec_request, std::chrono::steady_clock::time_point deadline);

  // For a kTemplate VM: disconnects, waits until the guest has parked, saves the device
  // state to template_dir/state (RAM stays in template_dir/memory), and stops QEMU.
  // The Vm is dead afterwards whatever the outcome.
  Status SaveTemplate(std::chrono::milliseconds timeout);
  ~Vm();

  const VmConfig& config() const { return config_; }
  pid_t pid() const { return pid_; }
  double boot_ms() const { return boot_ms_; }
  // The guest's boot_id as its agent reported it ("" if it did not).
  const std::string& boot_id() const { return boot_id_; }
  // Milliseconds from the start of Boot/Restore to the end of each phase, for benchmarks.
  const Json& phases() const { return phases_; }

  // Opens a request stream to the guest agent. kUnavailable once the guest is gone.
  Result<std::shared_ptr<channel::Stream>> Open(const Json& request);
  bool alive() const;
  // Why the VM is no longer usable ("" while alive): QEMU exit or channel loss.
  std::string death_reason() const;

  // Where streams the guest opens (egress tunnels) go. Until one is set they are refused.
  // A spare clone gets its handler when it is handed out.
  void SetGuestOpen(channel::Mux::OpenHandler handler);

  // Records in phases()[key] the CPU time QEMU has used so far, in ms (for benchmarks: what a
  // restore and a spare's warm-up cost in CPU, which wall time on a busy host hides).
  void NoteCpu(const std::string& key);

  // Sets the nice value of every QEMU thread.
  Status SetNice(int nice);

  // The transfer disk (docs/protocol/guest.md): usable once the guest's hello said it has
  // it open. Its host file, and its capacity as the guest sees it (QMP block_resize, which
  // also truncates or extends the file). One transfer at a time: TryLockTransferDisk.
  bool has_transfer_disk() const { return transfer_disk_ && transfer_fd_.valid(); }
  // The file, as created before QEMU started (its path is in a directory QEMU's uid owns).
  int transfer_disk_fd() const { return transfer_fd_.get(); }
  Status ResizeTransferDisk(uint64_t bytes);
  std::unique_lock<std::timed_mutex> TryLockTransferDisk() {
    // The last transfer's handler lets go a moment after its END reached its client, who may
    // already have sent the next request: that one waits up to a second rather than take
    // the channel (the guest's side waits the same way).
    return std::unique_lock<std::timed_mutex>(transfer_mu_, std::chrono::seconds(1));
  }

  // The workspace disk: usable once the guest's hello said it has it open. Its host file,
  // created before QEMU started, and its capacity as the guest sees it (QMP block_resize,
  // which also truncates or extends the file).
  bool has_workspace_disk() const { return workspace_disk_ && workspace_fd_.valid(); }
  int workspace_disk_fd() const { return workspace_fd_.get(); }
  Status ResizeWorkspaceDisk(uint64_t bytes);

  // QEMU's run state (QMP query-status): "running", "paused", "io-error", ... An error if
  // QEMU does not answer by `deadline` (a stopped QEMU answers nothing).
  Result<std::string> RunState(std::chrono::steady_clock::time_point deadline);
  // Resumes a VM QEMU paused (QMP cont).
  Status Resume(std::chrono::steady_clock::time_point deadline);
  // Writes and flushes of the guest's writable drives that failed on the host since QEMU
  // started (QMP query-blockstats: failed_wr_operations + failed_flush_operations): with
  // werror=report each was an I/O error in the guest, caused by the host (a full disk).
  Result<int64_t> FailedHostWrites(std::chrono::steady_clock::time_point deadline);

  // Kills QEMU, waits for it, removes sockets and the directory, and reports what it saw.
  // Idempotent: a second call returns the first report. `why`, when given, is the guest's
  // death reason from now on (what an exec cut off by it reports), not QEMU's exit.
  DestroyReport Destroy(const std::string& why = "");

  // Last `max` bytes of the serial console log (for error messages).
  std::string ConsoleTail(size_t max = 2000) const;

 private:
  explicit Vm(VmConfig c) : config_(std::move(c)) {}
  void WatchQemu();
  // Spawns QEMU, sandboxed as the config says (egress layer 1), with `state_fd` and the
  // config's memory fd for a restore, and starts the exit watcher.
  Status Spawn(int state_fd);
  // Connects the control socket, runs the Mux, and waits for the guest agent's hello.
  Result<Json> AwaitHello(std::chrono::steady_clock::time_point deadline);
  // Kills what was started and returns `st` with QEMU's log and the console tail.
  Status Fail(const Status& st);
  // Opens `request`, and returns the END body if it says ok; else an error quoting it.
  Result<Json> Call(const Json& request, std::chrono::steady_clock::time_point deadline);
  bool QemuExited() const;

  VmConfig config_;
  pid_t pid_ = -1;
  double boot_ms_ = 0;
  std::string boot_id_;
  Json phases_ = Json::object();
  std::unique_ptr<channel::Mux> mux_;
  // Shared with the Mux's handler threads, which may outlive a destroyed Vm by a moment.
  struct OpenSlot {
    Mutex mu;
    channel::Mux::OpenHandler handler GUARDED_BY(mu);
  };
  std::shared_ptr<OpenSlot> guest_open_ = std::make_shared<OpenSlot>();
  std::thread watcher_;  // waits for QEMU's exit
  mutable Mutex mu_;
  mutable CondVar exited_cv_;
  std::optional<ExitInfo> qemu_exit_ GUARDED_BY(mu_);
  std::string death_ GUARDED_BY(mu_);
  std::optional<DestroyReport> destroyed_;
  std::atomic<bool> transfer_disk_{false};
  UniqueFd transfer_fd_;
  std::timed_mutex transfer_mu_;
  std::atomic<bool> workspace_disk_{false};
  UniqueFd workspace_fd_;
  // QMP block_resize of the drive `device` ("xfer", "ws"); `which` names it in errors.
  Status ResizeDisk(const char* device, const char* which, uint64_t bytes);
};

// Kills a QEMU left behind by a daemon that died, if `pid` is still that VM's process (its
// command line names the VM id), then removes `vm_dir`. Reports what it observed.
DestroyReport ReapOrphan(const std::string& id, int64_t pid, const std::string& vm_dir);

}  // namespace trybox::vmm
