#include "vmm/qemu.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "util/fd.h"
#include "util/json.h"
#include "util/log.h"
#include "util/names.h"
#include "util/socket.h"
#include "vmm/qmp.h"

namespace trybox::vmm {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string Tail(const std::string& path, size_t max) {
  auto s = ReadFileToString(path);
  if (!s.ok()) return "";
  return s->size() > max ? s->substr(s->size() - max) : *s;
}

bool PathExists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

// A machine-id for the guest: 32 lowercase hex characters, fresh per VM.
std::string MachineId() { return RandomHex(16); }

// The host's TSC frequency in kHz from /proc/cpuinfo ("cpu MHz : 2445.404"), 0 if unknown.
int64_t HostTscKhz() {
  static const int64_t khz = [] {
    auto info = ReadFileToString("/proc/cpuinfo");
    if (!info.ok()) return int64_t{0};
    size_t at = info->find("cpu MHz");
    if (at == std::string::npos) return int64_t{0};
    size_t colon = info->find(':', at);
    if (colon == std::string::npos) return int64_t{0};
    return static_cast<int64_t>(std::atof(info->c_str() + colon + 1) * 1000);
  }();
  return khz;
}

// Unlinks the VM's sockets and removes its directory, recording what is gone afterwards.
void RemoveVmFiles(const std::string& dir, DestroyReport* r) {
  static const char* const kSockets[] = {"/ctl.sock", "/qga.sock", "/qmp.sock"};
  for (const char* sock : kSockets) ::unlink((dir + sock).c_str());
  r->sockets_removed = true;
  for (const char* sock : kSockets) r->sockets_removed &= !PathExists(dir + sock);
  Status st = RemoveTree(dir);
  if (!st.ok()) LogWarn("vmm", st.message());
  r->dir_removed = !PathExists(dir);
}

// How QEMU is started for egress layer 1, and the config as QEMU sees it (paths through
// inherited directory fds when it runs as another uid).
struct QemuSandbox {
  VmConfig seen;
  SpawnOptions spawn;
  // Kept open until QEMU has inherited them.
  UniqueFd image_dir, vm_dir, template_dir, ctl_socket, qmp_socket, placeholder;
};

std::string FdPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

// The disk layer QEMU writes: the VM's own, or for a template the template's.
std::string DiskLayer(const VmConfig& c) {
  return c.mode == StartMode::kTemplate ? c.template_dir + kTemplateDisk : c.vm_dir + "/disk.qcow2";
}

Status GiveTo(const std::string& path, uid_t uid) {
  if (::chown(path.c_str(), uid, uid) != 0) {
    return ErrnoError("give " + path + " to uid " + std::to_string(uid));
  }
  return Status::Ok();
}

// How QEMU is started (egress layer 1: its own network namespace, and its own uid when the
// daemon is root), and the config as QEMU sees it: paths through inherited directory fds
// when it runs as another uid, so no ancestor directory needs opening up. A clone always
// gets the template directory, its saved state and its RAM as fds 5, 6, 7.
Result<QemuSandbox> SandboxQemuFiles(const VmConfig& c, int state_fd) {
  QemuSandbox q;
  q.seen = c;
  q.spawn.new_netns = c.netns;
  q.spawn.nice = c.nice;
  std::vector<std::string> parent;
  for (char** e = environ; *e; ++e) parent.emplace_back(*e);
  q.spawn.env = QemuEnvironment(parent, c.vm_dir);
  const bool restore = c.mode == StartMode::kRestore;
  if (!c.qemu_uid && !restore) return q;

  ASSIGN_OR_RETURN(q.image_dir, OpenFile(c.image_dir, O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSIGN_OR_RETURN(q.vm_dir, OpenFile(c.vm_dir, O_PATH | O_DIRECTORY | O_CLOEXEC));
  q.spawn.keep_fds = {q.image_dir.get(), q.vm_dir.get()};
  if (c.mode != StartMode::kCold) {
    ASSIGN_OR_RETURN(q.template_dir, OpenFile(c.template_dir, O_PATH | O_DIRECTORY | O_CLOEXEC));
    q.spawn.keep_fds.push_back(q.template_dir.get());
  }
  if (restore) {
    if (state_fd < 0 || c.memory_fd < 0) {
      return InvalidArgument("a restore needs the template's state and RAM");
    }
    q.spawn.keep_fds.push_back(state_fd);
    q.spawn.keep_fds.push_back(c.memory_fd);
  }
  if (!c.qemu_uid) return q;

  uid_t uid = *c.qemu_uid;
  RETURN_IF_ERROR(GiveTo(c.vm_dir, uid));
  q.seen.image_dir = FdPath(kImageDirFd);
  q.seen.vm_dir = FdPath(kVmDirFd);
  const std::string disk = DiskLayer(c);
  if (c.mode == StartMode::kTemplate) {
    q.seen.template_dir = FdPath(kTemplateDirFd);
    RETURN_IF_ERROR(GiveTo(c.template_dir, uid));
    RETURN_IF_ERROR(GiveTo(c.template_dir + kTemplateMemory, uid));
  }
  RETURN_IF_ERROR(GiveTo(disk, uid));
  RETURN_IF_ERROR(GiveTo(c.vm_dir + "/" + kTransferDisk, uid));
  RETURN_IF_ERROR(GiveTo(c.vm_dir + "/" + kWorkspaceDisk, uid));
  if (!restore) {
    // The layer names its backing file by path; point it through the image's fd. -u
    // rewrites the header only. (A clone's layer names the template's disk through fd 5.)
    RETURN_IF_ERROR(RunChecked({"qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-b",
                                q.seen.image_dir + "/scratch.qcow2", "-F", "qcow2", disk},
                               std::chrono::seconds(30))
                        .Annotate("point the disk layer at the inherited image fd"));
  }
  q.spawn.uid = uid;
  q.spawn.gid = static_cast<gid_t>(uid);
  struct stat kvm;
  if (c.accel == "kvm" && ::stat("/dev/kvm", &kvm) == 0) q.spawn.groups = {kvm.st_gid};
  return q;
}

// SandboxQemuFiles, plus the control and monitor sockets QEMU serves, listening before it
// starts (kCtlSocketFd, kQmpSocketFd): the daemon connects once, at once, and reads the
// greeting when QEMU is ready, instead of retrying the connect on a 1 ms timer for the
// 70-130 ms QEMU takes to start. If QEMU dies first, the daemon's connection is reset (it
// holds no copy of the listening socket once QEMU has it).
Result<QemuSandbox> SandboxQemu(const VmConfig& c, int state_fd) {
  ASSIGN_OR_RETURN(QemuSandbox q, SandboxQemuFiles(c, state_fd));
  ASSIGN_OR_RETURN(q.ctl_socket, ListenUnixInPrivateDir(c.vm_dir + "/ctl.sock"));
  ASSIGN_OR_RETURN(q.qmp_socket, ListenUnixInPrivateDir(c.vm_dir + "/qmp.sock"));
  ASSIGN_OR_RETURN(q.placeholder, OpenFile("/dev/null", O_RDONLY | O_CLOEXEC));
  while (q.spawn.keep_fds.size() < static_cast<size_t>(kCtlSocketFd - 3)) {
    q.spawn.keep_fds.push_back(q.placeholder.get());
  }
  q.spawn.keep_fds.push_back(q.ctl_socket.get());
  q.spawn.keep_fds.push_back(q.qmp_socket.get());
  return q;
}

}  // namespace

int ImageLayers(const std::string& image_dir) {
  int k = 0;
  struct stat st;
  while (::stat((image_dir + "/layer-" + std::to_string(k + 1) + ".ext4").c_str(), &st) == 0) ++k;
  return k;
}

std::vector<std::string> QemuEnvironment(const std::vector<std::string>& parent,
                                         const std::string& vm_dir) {
  constexpr std::string_view kTunables = "GLIBC_TUNABLES=";
  constexpr std::string_view kHugePages = "glibc.malloc.hugetlb=";
  std::string tunables;
  std::vector<std::string> env;
  for (const std::string& e : parent) {
    if (e.starts_with(kTunables)) {
      tunables = e.substr(kTunables.size());
    } else if (!e.starts_with("TRYBOX_VM_DIR=")) {
      env.push_back(e);
    }
  }
  // Tunables are NAME=VALUE items separated by colons; the operator's own choice stands.
  const bool chosen = (":" + tunables).find(":" + std::string(kHugePages)) != std::string::npos;
  if (!chosen) tunables += (tunables.empty() ? "" : ":") + std::string(kHugePages) + "1";
  env.push_back(std::string(kTunables) + tunables);
  // It names the VM directory, so a test can find a sandboxed QEMU whose command line only
  // says /proc/self/fd/4.
  env.push_back("TRYBOX_VM_DIR=" + vm_dir);
  return env;
}

std::string LayerDiskSerial(int k) { return "trybox-layer-" + std::to_string(k); }

std::string KernelCmdline(const VmConfig& c) {
  // quiet: every console byte costs real time under TCG. panic=-1 with -no-reboot turns a
  // guest panic into a QEMU exit the daemon observes.
  std::string line = "console=ttyS0 quiet panic=-1 random.trust_cpu=on";
  // A template's command line is shared by every clone and is part of the template's key,
  // so it names no VM; each clone is told its identity after the restore.
  if (c.mode == StartMode::kCold) {
    line += " trybox.vmid=" + c.id + " trybox.hostname=trybox-" + c.id +
            " trybox.machine_id=" + MachineId();
  } else {
    line += " trybox.template=1";
  }
  // Under TCG the guest's TSC is the host's, but microvm offers no PIT-independent reference
  // to calibrate it; on a loaded host PIT calibration fails and the boot stalls for minutes
  // (measured: no progress in 60 s at load 4 on 2 cores). Telling the kernel the frequency
  // skips the calibration.
  if (c.accel == "tcg" && HostTscKhz() > 0) {
    line += " tsc_early_khz=" + std::to_string(HostTscKhz());
  }
  // The guest's TSC under TCG is the host's own (invariant) TSC, but the kernel's clocksource
  // watchdog checks it against jiffies, which a busy host delays: on a loaded host it marked
  // the TSC unstable in most boots and the guest fell back to refined-jiffies, a clock that
  // loses every tick the host delays (a VM's clock drifted tens of seconds behind) and on
  // which hrtimers stall (docs/timekeeping.md, "How it was found"). tsc=reliable keeps the
  // TSC as the clocksource, unwatched.
  if (c.accel == "tcg") line += " tsc=reliable";
  // TCG caches translated code by virtual address; with ASLR every new process maps libc
  // somewhere new and is translated again. Measured in the guest: fork+exec of /bin/true
  // from bash 56 ms with ASLR, 30 ms without. Inside a single-tenant throwaway VM ASLR
  // protects nothing the sandbox boundary does not; under KVM it stays on.
  if (c.accel == "tcg") line += " norandmaps";
  if (c.layers > 0) line += " trybox.layers=" + std::to_string(c.layers);
  return line;
}

std::vector<std::string> QemuArgv(const VmConfig& c) {
  const std::string& img = c.image_dir;
  const std::string& dir = c.vm_dir;
  const bool cold = c.mode == StartMode::kCold;
  const std::string disk = DiskLayer(c);
  // One option and its value per line, as in the QEMU manual.
  // clang-format off
  std::vector<std::string> a = {
      c.qemu,
      "-name", "trybox-vm-" + c.id + ",process=trybox-vm-" + c.id,
      "-machine", "microvm,accel=" + c.accel + ",isa-serial=on,rtc=on" +
                      (cold ? "" : ",memory-backend=mem"),
      "-cpu", c.accel == "kvm" ? "host" : "max",
      "-m", std::to_string(c.memory_mib),
      "-smp", std::to_string(c.cpus),
      "-nodefaults", "-no-user-config", "-display", "none", "-nic", "none", "-no-reboot",
      "-serial", "file:" + dir + "/console.log",
      "-kernel", img + "/vmlinux",
      "-initrd", img + "/initrd.cpio",
      "-append", KernelCmdline(c),
      // The frozen root is opened read-only; the guest writes only to its own qcow2 layer.
      "-drive", "id=root,file=" + img + "/rootfs.ext4,format=raw,if=none,readonly=on",
      "-device", "virtio-blk-device,drive=root",
      // A VM's layer is deleted at destroy: the guest's flushes need not reach the host's
      // disk (cache=unsafe). Each fdatasync they caused allocated and journaled blocks that
      // destroy then had to free: unlinking a 0.6 MB layer took 23-38 ms on a loaded host.
      // A template's layer is kept, and flushed as before.
      // werror/rerror=report: a write that fails on the host (a full disk) is an I/O error
      // in the guest, never a VM paused for good (QEMU's default for ENOSPC is to pause).
      "-drive", "id=disk,file=" + disk + ",format=qcow2,if=none,discard=unmap,cache=" +
                    (c.mode == StartMode::kTemplate ? "writeback" : "unsafe") +
                    ",werror=report,rerror=report",
      "-device", "virtio-blk-device,drive=disk",
      // The transfer disk (docs/protocol/guest.md, "Bulk data through a disk"): a raw file
      // of the VM's own, empty and of capacity 0 except during a transfer, when the daemon
      // fills it (or lets the guest fill it) and announces its size (QMP block_resize).
      "-drive", "id=xfer,file=" + dir + "/" + kTransferDisk +
                    ",format=raw,if=none,cache=unsafe,werror=report,rerror=report",
      "-device", std::string("virtio-blk-device,drive=xfer,serial=") + kTransferDiskSerial,
      // The workspace disk (docs/protocol/guest.md, "The workspace disk"): the same kind of
      // file, holding a workspace's ext4 from its workspace_in to the VM's end.
      "-drive", "id=ws,file=" + dir + "/" + kWorkspaceDisk +
                    ",format=raw,if=none,cache=unsafe,werror=report,rerror=report",
      "-device", std::string("virtio-blk-device,drive=ws,serial=") + kWorkspaceDiskSerial,
      "-device", "virtio-rng-device",
      "-device", "virtio-serial-device",
      "-chardev", "socket,id=ctl,fd=" + std::to_string(kCtlSocketFd) + ",server=on,wait=off",
      "-device", "virtserialport,chardev=ctl,name=org.trybox.ctl",
      // A second port for qemu-guest-agent, so the benchmarks can compare against it in the
      // same guest. Nothing in the guest listens on it unless qemu-ga is started there.
      "-chardev", "socket,id=qga,path=" + dir + "/qga.sock,server=on,wait=off",
      "-device", "virtserialport,chardev=qga,name=org.qemu.guest_agent.0",
      "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
  };
  // clang-format on
  // A derived image's layers, read-only like the root; the guest finds each by its serial.
  for (int k = 1; k <= c.layers; ++k) {
    const std::string id = "layer" + std::to_string(k);
    a.insert(a.end(),
             {"-drive",
              "id=" + id + ",file=" + img + "/layer-" + std::to_string(k) +
                  ".ext4,format=raw,if=none,readonly=on",
              "-device", "virtio-blk-device,drive=" + id + ",serial=" + LayerDiskSerial(k)});
  }
  a.insert(a.end(),
           {"-chardev", "socket,id=qmp,fd=" + std::to_string(kQmpSocketFd) + ",server=on,wait=off",
            "-mon", "chardev=qmp,mode=control"});
  if (!cold) {
    // The template's RAM is a file. The template maps it shared, so its RAM lands in the
    // file and the saved state need not carry it (x-ignore-shared). Clones map a sealed
    // memfd copy of it privately (inherited; QEMU opens it through /proc/self/fd): every
    // clone reads the same pages and copies only what it writes, and no process, the
    // clones' included, can write the original.
    const bool share = c.mode == StartMode::kTemplate;
    const std::string path = share ? c.template_dir + kTemplateMemory : FdPath(kRestoreMemoryFd);
    a.insert(a.end(),
             {"-object", "memory-backend-file,id=mem,size=" + std::to_string(c.memory_mib) +
                             "M,mem-path=" + path + (share ? ",share=on" : ",share=off")});
  }
  if (c.mode == StartMode::kRestore) a.insert(a.end(), {"-incoming", "defer"});
  return a;
}

Json DestroyReport::ToJson() const {
  return {{"process_gone", process_gone},
          {"qemu_exit", qemu_exit},
          {"sockets_removed", sockets_removed},
          {"dir_removed", dir_removed}};
}

Status Vm::Fail(const Status& st) {
  std::string console = ConsoleTail(1500);
  std::string qlog = Tail(config_.vm_dir + "/qemu.log", 1000);
  Destroy();
  std::string msg = st.message();
  if (!qlog.empty()) msg += "\n--- qemu ---\n" + qlog;
  if (!console.empty()) msg += "\n--- guest console ---\n" + console;
  return Status(st.code(), msg);
}

Status Vm::Spawn(int state_fd) {
  // The transfer disk starts empty: capacity 0, nothing for the guest to read or write. The
  // daemon keeps this descriptor and never opens the path again.
  ASSIGN_OR_RETURN(transfer_fd_, OpenFile(config_.vm_dir + "/" + kTransferDisk,
                                          O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  ASSIGN_OR_RETURN(workspace_fd_, OpenFile(config_.vm_dir + "/" + kWorkspaceDisk,
                                           O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  ASSIGN_OR_RETURN(QemuSandbox sandbox, SandboxQemu(config_, state_fd));
  auto log = OpenFile(config_.vm_dir + "/qemu.log", O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (!log.ok()) return log.status();
  SpawnOptions opts = std::move(sandbox.spawn);
  opts.argv = QemuArgv(sandbox.seen);
  opts.stdout_fd = log->get();
  opts.stderr_fd = log->get();
  // A daemon that is killed takes its QEMUs with it, whichever of its threads started them
  // (docs/daemon.md, "What a daemon that died leaves").
  opts.die_with_process = true;
  auto child = ChildProcess::Spawn(opts);
  if (!child.ok()) return child.status().Annotate("start QEMU");
  pid_ = child->Release();
  watcher_ = std::thread([this] { WatchQemu(); });
  // Lets a later daemon reap this QEMU if this one dies (ReapOrphan).
  return WriteFileAtomic(config_.vm_dir + "/qemu.pid", std::to_string(pid_), 0600);
}

Result<Json> Vm::AwaitHello(Clock::time_point deadline) {
  // The control socket listens from before QEMU starts (kCtlSocketFd): one connect, queued
  // until QEMU accepts it; a QEMU that dies first resets it, and the Mux reports that.
  auto ctl = ConnectUnix(config_.vm_dir + "/ctl.sock");
  if (!ctl.ok()) return Unavailable("the VM's control socket refused: " + ctl.status().message());
  mux_ = std::make_unique<channel::Mux>(std::move(*ctl), channel::Role::kHost);
  // The guest may open streams (egress); they go to whatever handler is set when they come.
  mux_->OnOpen([slot = guest_open_](std::shared_ptr<channel::Stream> s, Json req) {
    channel::Mux::OpenHandler h;
    {
      MutexLock lock(slot->mu);
      h = slot->handler;
    }
    if (h) return h(std::move(s), std::move(req));
    (void)s->Reset("this VM has no egress handler");
  });
  // Woken by the hello or by the channel's end (QEMU or the guest died): no timer.
  struct HelloWait {
    Mutex mu;
    CondVar cv;
    std::optional<Json> hello GUARDED_BY(mu);
    bool ended GUARDED_BY(mu) = false;
  };
  auto wait = std::make_shared<HelloWait>();
  mux_->OnControl([wait](const Json& e) {
    if (StrOr(e, "type") != "hello") return;
    MutexLock lock(wait->mu);
    if (!wait->hello) wait->hello = e;
    wait->cv.SignalAll();
  });
  mux_->OnDeath([wait](const std::string&) {
    MutexLock lock(wait->mu);
    wait->ended = true;
    wait->cv.SignalAll();
  });
  mux_->Start();
  std::optional<Json> hello;
  bool ended = false;
  {
    MutexLock lock(wait->mu);
    while (!wait->hello && !wait->ended && wait->cv.WaitUntil(wait->mu, deadline)) {
    }
    hello = wait->hello;
    ended = wait->ended;
  }
  if (!hello) {
    if (!ended) return DeadlineExceeded("the guest agent did not answer in time");
    return Unavailable("the guest never answered: " + death_reason());
  }
  const Json& got = *hello;
  transfer_disk_ = BoolOr(got, "transfer_disk");
  workspace_disk_ = BoolOr(got, "workspace_disk");
  return got;
}

Result<std::unique_ptr<Vm>> Vm::Boot(const VmConfig& config, std::chrono::milliseconds timeout) {
  auto start = Clock::now();
  auto deadline = start + timeout;
  std::unique_ptr<Vm> vm(new Vm(config));
  const std::string& dir = config.vm_dir;
  if (::mkdir(dir.c_str(), 0700) != 0) return ErrnoError("mkdir " + dir);

  const std::string disk = DiskLayer(config);
  Status st = RunChecked({"qemu-img", "create", "-q", "-f", "qcow2", "-b",
                          config.image_dir + "/scratch.qcow2", "-F", "qcow2", disk},
                         timeout);
  if (!st.ok()) return vm->Fail(st.Annotate("create the VM's disk layer"));
  if (config.mode == StartMode::kTemplate) {
    // The file QEMU maps as guest RAM; sparse until the guest touches it.
    UniqueFd mem(::open((config.template_dir + kTemplateMemory).c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!mem.valid() || ::ftruncate(mem.get(), static_cast<off_t>(config.memory_mib) << 20) != 0) {
      return vm->Fail(ErrnoError("create the template's memory file"));
    }
  }
  st = vm->Spawn(-1);
  if (!st.ok()) return vm->Fail(st);
  auto hello = vm->AwaitHello(deadline);
  if (!hello.ok()) {
    return vm->Fail(hello.status().code() == Code::kDeadlineExceeded
                        ? DeadlineExceeded("the guest agent did not answer within " +
                                           std::to_string(timeout.count()) + " ms")
                        : hello.status());
  }
  auto ping = vm->Open({{"op", "ping"}});
  if (!ping.ok()) return vm->Fail(ping.status().Annotate("ping the guest agent"));
  auto reply = (*ping)->Next(deadline);
  if (!reply.ok()) return vm->Fail(reply.status().Annotate("ping the guest agent"));
  if (reply->kind != channel::Stream::Message::Kind::kEnd || !BoolOr(reply->body, "ok")) {
    return vm->Fail(Unavailable("the guest agent answered the ping with " + reply->body.dump()));
  }
  vm->boot_id_ = StrOr(reply->body, "boot_id");
  vm->boot_ms_ = MsSince(start);
  return vm;
}

Result<std::unique_ptr<Vm>> Vm::Restore(const VmConfig& config, std::chrono::milliseconds timeout,
                                        bool identify) {
  auto start = Clock::now();
  auto deadline = start + timeout;
  std::unique_ptr<Vm> vm(new Vm(config));
  const std::string& dir = config.vm_dir;
  const std::string& tpl = config.template_dir;
  if (::mkdir(dir.c_str(), 0700) != 0) return ErrnoError("mkdir " + dir);

  // Every clone's writable layer is a copy of the same empty overlay on the template's
  // disk: the same bytes `qemu-img create` would write, without a process per clone.
  Status st = CopyFile(tpl + kTemplateCloneDisk, dir + "/disk.qcow2", 0600);
  if (!st.ok()) return vm->Fail(st.Annotate("create the clone's disk layer"));
  UniqueFd state(::open((tpl + kTemplateState).c_str(), O_RDONLY | O_CLOEXEC));
  if (!state.valid()) return vm->Fail(ErrnoError("open the template's saved state"));
  st = vm->Spawn(state.get());
  if (!st.ok()) return vm->Fail(st);
  state.Reset();
  vm->phases_["spawned"] = MsSince(start);

  auto qmp = Qmp::Connect(dir + "/qmp.sock", deadline);
  if (!qmp.ok()) return vm->Fail(qmp.status());
  // Both ends of a migration must agree that shared-file RAM is not in the stream.
  st = qmp->Execute("migrate-set-capabilities",
                    {{"capabilities", {{{"capability", "x-ignore-shared"}, {"state", true}}}}})
           .status();
  if (!st.ok()) return vm->Fail(st);
  vm->phases_["monitor_ready"] = MsSince(start);
  st =
      qmp->Execute("migrate-incoming", {{"uri", "fd:" + std::to_string(kRestoreStateFd)}}).status();
  if (!st.ok()) return vm->Fail(st);
  vm->phases_["incoming_started"] = MsSince(start);
  // A bad state file makes QEMU exit ("load of migration failed"); AwaitHello sees that.
  auto hello = vm->AwaitHello(deadline);
  if (!hello.ok()) return vm->Fail(hello.status().Annotate("restore from " + tpl));
  if (!BoolOr(*hello, "template")) {
    return vm->Fail(
        FailedPrecondition("the restored guest is not a template clone: " + hello->dump()));
  }
  vm->phases_["hello"] = MsSince(start);
  vm->NoteCpu("cpu_at_hello_ms");
  if (identify) {
    st = vm->Identify(deadline);
    if (!st.ok()) return vm->Fail(st.Annotate("give the clone its identity"));
  }
  vm->boot_ms_ = MsSince(start);
  vm->phases_["identified"] = vm->boot_ms_;
  return vm;
}

Result<Json> Vm::Call(const Json& request, Clock::time_point deadline) {
  ASSIGN_OR_RETURN(auto s, Open(request));
  ASSIGN_OR_RETURN(auto reply, s->Next(deadline));
  // Output and events (a warm-up's) are not wanted; skip to the END.
  using Kind = channel::Stream::Message::Kind;
  while (reply.kind == Kind::kData || reply.kind == Kind::kEof || reply.kind == Kind::kEvent) {
    ASSIGN_OR_RETURN(reply, s->Next(deadline));
  }
  if (reply.kind != Kind::kEnd) {
    return Unavailable("the guest aborted " + StrOr(request, "op", "a request") + ": " +
                       StrOr(reply.body, "reason", "no reason given"));
  }
  return reply.body;
}

namespace {

// The host's CLOCK_REALTIME in ns, for a guest's wall clock.
int64_t HostTimeNs() {
  struct timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

}  // namespace

Status Vm::Identify(Clock::time_point deadline) {
  auto start = Clock::now();
  ASSIGN_OR_RETURN(Json reply, Call({{"op", "identity"},
                                     {"vm_id", config_.id},
                                     {"hostname", "trybox-" + config_.id},
                                     {"machine_id", MachineId()},
                                     {"seed", RandomHex(64)},
                                     {"time_ns", HostTimeNs()}},
                                    deadline));
  if (!BoolOr(reply, "ok")) return Unavailable("the guest refused its identity: " + reply.dump());
  boot_id_ = StrOr(reply, "boot_id");
  phases_["identity_ms"] = MsSince(start);
  if (reply.contains("timings_us")) phases_["identity_guest_us"] = reply["timings_us"];
  return Status::Ok();
}

void Vm::NoteCpu(const std::string& key) {
  if (auto ms = ProcessCpuMs(pid_); ms.ok()) phases_[key] = *ms;
}

Status Vm::SetClock(Clock::time_point deadline) {
  auto start = Clock::now();
  ASSIGN_OR_RETURN(Json reply, Call({{"op", "clock"}, {"time_ns", HostTimeNs()}}, deadline));
  if (!BoolOr(reply, "ok")) return Unavailable("the guest refused the clock: " + reply.dump());
  phases_["clock_ms"] = MsSince(start);
  if (reply.contains("offset_ns") && reply["offset_ns"].is_number_integer()) {
    phases_["clock_offset_ms"] = reply["offset_ns"].get<int64_t>() / 1e6;
  }
  return Status::Ok();
}

Result<int64_t> Vm::StepClock(Clock::time_point deadline) {
  ASSIGN_OR_RETURN(Json reply, Call({{"op", "clock"}, {"time_ns", HostTimeNs()}}, deadline));
  if (!BoolOr(reply, "ok")) return Unavailable("the guest refused the clock: " + reply.dump());
  if (!reply.contains("offset_ns") || !reply["offset_ns"].is_number_integer()) {
    return Unavailable("the guest's clock reply has no offset_ns: " + reply.dump());
  }
  return reply["offset_ns"].get<int64_t>();
}

Status Vm::Warm(const Json& exec_request, Clock::time_point deadline) {
  auto start = Clock::now();
  ASSIGN_OR_RETURN(Json reply, Call(exec_request, deadline));
  if (StrOr(reply, "outcome") != "exited" || IntOr(reply, "exit_code", -1) != 0) {
    return Unavailable("the guest's warm-up failed: " + reply.dump());
  }
  phases_["warmup_ms"] = MsSince(start);
  return Status::Ok();
}

Status Vm::SaveTemplate(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  auto fail = [&](Status st) {
    Status out = Fail(st.Annotate("save the template"));
    return out;
  };
  if (config_.mode != StartMode::kTemplate) {
    return fail(FailedPrecondition("VM " + config_.id + " was not booted as a template"));
  }
  // Hang up, and wait until the guest has ended the session and is waiting for the next
  // host: clones resume exactly there and greet their own host at once.
  mux_->Shutdown();
  for (;;) {
    if (ConsoleTail(4096).find("parked after session 1") != std::string::npos) break;
    if (QemuExited()) return fail(Unavailable("QEMU exited before the guest parked"));
    if (Clock::now() > deadline) return fail(DeadlineExceeded("the guest never parked"));
    ::usleep(2000);
  }
  auto qmp = Qmp::Connect(config_.vm_dir + "/qmp.sock", deadline);
  if (!qmp.ok()) return fail(qmp.status());
  Status st =
      qmp->Execute("migrate-set-capabilities",
                   {{"capabilities", {{{"capability", "x-ignore-shared"}, {"state", true}}}}})
          .status();
  if (!st.ok()) return fail(st);
  const std::string path = config_.template_dir + kTemplateState;
  UniqueFd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!out.valid()) return fail(ErrnoError("create " + path));
  st = qmp->Execute("getfd", {{"fdname", "state"}}, out.get()).status();
  if (!st.ok()) return fail(st);
  st = qmp->Execute("migrate", {{"uri", "fd:state"}}).status();
  if (!st.ok()) return fail(st);
  for (;;) {
    auto info = qmp->Execute("query-migrate");
    if (!info.ok()) return fail(info.status());
    std::string status = StrOr(*info, "status");
    if (status == "completed") break;
    if (status == "failed" || status == "cancelled") {
      return fail(Internal("QEMU's migration " + status + ": " +
                           StrOr(*info, "error-desc", "no reason given")));
    }
    if (Clock::now() > deadline) return fail(DeadlineExceeded("saving the state took too long"));
    ::usleep(2000);
  }
  if (::fsync(out.get()) != 0) return fail(ErrnoError("fsync " + path));
  // QEMU flushed the disk layer and stopped the guest when the migration completed.
  (void)qmp->Execute("quit");
  Destroy();
  return Status::Ok();
}

Vm::~Vm() { Destroy(); }

void Vm::WatchQemu() {
  int status;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  ExitInfo info = ExitInfoFromWaitStatus(status);
  MutexLock lock(mu_);
  qemu_exit_ = info;
  if (death_.empty()) death_ = "QEMU exited (" + info.Describe() + ")";
  exited_cv_.SignalAll();
}

void Vm::SetGuestOpen(channel::Mux::OpenHandler handler) {
  MutexLock lock(guest_open_->mu);
  guest_open_->handler = std::move(handler);
}

bool Vm::QemuExited() const {
  MutexLock lock(mu_);
  return qemu_exit_.has_value();
}

bool Vm::alive() const {
  MutexLock lock(mu_);
  if (!death_.empty()) return false;
  return !mux_ || mux_->alive();
}

std::string Vm::death_reason() const {
  MutexLock lock(mu_);
  if (!death_.empty()) return death_;
  if (mux_ && !mux_->alive()) {
    // The channel usually closes because QEMU died; its exit status arrives a moment later
    // and is the more useful reason, so give the watcher a second to report it.
    auto until = Clock::now() + std::chrono::seconds(1);
    while (death_.empty() && exited_cv_.WaitUntil(mu_, until)) {
    }
    if (!death_.empty()) return death_;
    return "guest channel lost: " + mux_->death_reason();
  }
  return "";
}

Result<std::shared_ptr<channel::Stream>> Vm::Open(const Json& request) {
  if (!mux_) return Unavailable("VM " + config_.id + " is not connected");
  {
    MutexLock lock(mu_);
    if (!death_.empty()) return Unavailable("the guest is gone: " + death_);
  }
  auto s = mux_->Open(request);
  if (!s.ok()) {
    std::string why = death_reason();
    return Unavailable("the guest is gone: " + (why.empty() ? s.status().message() : why));
  }
  return s;
}

Status Vm::ResizeWorkspaceDisk(uint64_t bytes) { return ResizeDisk("ws", "workspace", bytes); }

std::string Vm::ConsoleTail(size_t max) const { return Tail(config_.vm_dir + "/console.log", max); }

Status Vm::ResizeTransferDisk(uint64_t bytes) { return ResizeDisk("xfer", "transfer", bytes); }

Status Vm::ResizeDisk(const char* device, const char* which, uint64_t bytes) {
  const std::string what = std::string("resize the ") + which + " disk";
  if (!alive()) return Unavailable("the guest is gone: " + death_reason());
  auto qmp = Qmp::Connect(config_.vm_dir + "/qmp.sock", Clock::now() + std::chrono::seconds(10));
  if (!qmp.ok()) return qmp.status().Annotate(what);
  return qmp->Execute("block_resize", {{"device", device}, {"size", bytes}})
      .status()
      .Annotate(what + " to " + std::to_string(bytes) + " bytes");
}

Status Vm::SetNice(int nice) {
  if (pid_ <= 0) return FailedPrecondition("QEMU is not running");
  return SetProcessNice(pid_, nice);
}

Result<std::string> Vm::RunState(std::chrono::steady_clock::time_point deadline) {
  if (!alive()) return Unavailable("the guest is gone: " + death_reason());
  auto qmp = Qmp::Connect(config_.vm_dir + "/qmp.sock", deadline);
  if (!qmp.ok()) return qmp.status().Annotate("ask QEMU for its run state");
  ASSIGN_OR_RETURN(Json st, qmp->Execute("query-status"));
  if (!st.is_object() || !st.contains("status") || !st["status"].is_string()) {
    return Internal("QEMU's query-status reply has no string 'status'");
  }
  return st["status"].get<std::string>();
}

Result<int64_t> Vm::FailedHostWrites(std::chrono::steady_clock::time_point deadline) {
  if (!alive()) return Unavailable("the guest is gone: " + death_reason());
  auto qmp = Qmp::Connect(config_.vm_dir + "/qmp.sock", deadline);
  if (!qmp.ok()) return qmp.status().Annotate("ask QEMU for its block statistics");
  ASSIGN_OR_RETURN(Json list, qmp->Execute("query-blockstats"));
  if (!list.is_array()) return Internal("QEMU's query-blockstats reply is not an array");
  int64_t failed = 0;
  for (const Json& dev : list) {
    if (!dev.is_object() || !dev.contains("stats") || !dev["stats"].is_object()) continue;
    const Json& s = dev["stats"];
    for (const char* k : {"failed_wr_operations", "failed_flush_operations"}) {
      if (s.contains(k) && s[k].is_number_integer()) failed += s[k].get<int64_t>();
    }
  }
  return failed;
}

Status Vm::Resume(std::chrono::steady_clock::time_point deadline) {
  if (!alive()) return Unavailable("the guest is gone: " + death_reason());
  auto qmp = Qmp::Connect(config_.vm_dir + "/qmp.sock", deadline);
  if (!qmp.ok()) return qmp.status().Annotate("resume the VM");
  return qmp->Execute("cont").status().Annotate("resume the VM");
}

DestroyReport Vm::Destroy(const std::string& why) {
  if (destroyed_) return *destroyed_;
  DestroyReport r;
  if (!why.empty()) {
    MutexLock lock(mu_);
    if (death_.empty()) death_ = why;
  }
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
  }
  if (watcher_.joinable()) watcher_.join();
  {
    MutexLock lock(mu_);
    if (qemu_exit_) {
      r.qemu_exit = qemu_exit_->Describe();
      if (death_.empty()) death_ = "destroyed";
    } else if (pid_ <= 0) {
      r.qemu_exit = "never started";
    }
  }
  r.process_gone = pid_ <= 0 || !ProcessExists(pid_);
  if (mux_) mux_->Shutdown();
  RemoveVmFiles(config_.vm_dir, &r);
  destroyed_ = r;
  return r;
}

DestroyReport ReapOrphan(const std::string& id, int64_t pid, const std::string& vm_dir) {
  DestroyReport r;
  // Candidates: the recorded pid, and any process whose argv names this VM (-name
  // trybox-vm-ID,...): a daemon killed between spawning QEMU and writing qemu.pid left none.
  std::vector<pid_t> pids = FindProcesses("trybox-vm-" + id + ",");
  if (pid > 0) pids.push_back(static_cast<pid_t>(pid));
  // Only a process whose command line still names this VM is ours: pids get reused.
  auto still_ours = [&](pid_t p) {
    return p > 0 && ProcessExists(p) &&
           ProcessCmdline(p).find("trybox-vm-" + id) != std::string::npos;
  };
  auto any_ours = [&] { return std::any_of(pids.begin(), pids.end(), still_ours); };
  if (any_ours()) {
    for (pid_t p : pids) {
      if (!still_ours(p)) continue;
      ::kill(-p, SIGKILL);
      ::kill(p, SIGKILL);
    }
    // Not our child any more (its parent died), so poll rather than wait.
    for (int i = 0; i < 500 && any_ours(); ++i) ::usleep(10000);
    r.qemu_exit = "killed orphan";
  } else {
    r.qemu_exit = "already gone";
  }
  r.process_gone = !any_ours();
  RemoveVmFiles(vm_dir, &r);
  return r;
}

}  // namespace trybox::vmm
