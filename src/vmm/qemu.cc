#include "vmm/qemu.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <future>

#include "util/fd.h"
#include "util/log.h"
#include "util/names.h"
#include "util/socket.h"

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
std::string MachineId() { return NewId() + NewId() + NewId().substr(0, 8); }

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
  for (const char* sock : {"/ctl.sock", "/qga.sock"}) ::unlink((dir + sock).c_str());
  r->sockets_removed = !PathExists(dir + "/ctl.sock") && !PathExists(dir + "/qga.sock");
  Status st = RemoveTree(dir);
  if (!st.ok()) LogWarn("vmm", st.message());
  r->dir_removed = !PathExists(dir);
}

// How QEMU is started for egress layer 1, and the config as QEMU sees it (paths through
// inherited directory fds when it runs as another uid).
struct QemuSandbox {
  VmConfig seen;
  SpawnOptions spawn;
  UniqueFd image_dir, vm_dir;  // kept open until QEMU has inherited them
};

Result<QemuSandbox> SandboxQemu(const VmConfig& c) {
  QemuSandbox q;
  q.seen = c;
  q.spawn.new_netns = c.netns;
  // QEMU's environment names the VM directory, so a test can find a sandboxed QEMU whose
  // command line only says /proc/self/fd/4.
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back("TRYBOX_VM_DIR=" + c.vm_dir);
  q.spawn.env = std::move(env);
  if (!c.qemu_uid) return q;
  uid_t uid = *c.qemu_uid;
  if (::chown(c.vm_dir.c_str(), uid, uid) != 0 ||
      ::chown((c.vm_dir + "/disk.qcow2").c_str(), uid, uid) != 0) {
    return ErrnoError("give the VM directory to uid " + std::to_string(uid));
  }
  ASSIGN_OR_RETURN(q.image_dir, OpenFile(c.image_dir, O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSIGN_OR_RETURN(q.vm_dir, OpenFile(c.vm_dir, O_PATH | O_DIRECTORY | O_CLOEXEC));
  q.seen.image_dir = "/proc/self/fd/3";
  q.seen.vm_dir = "/proc/self/fd/4";
  // The layer names its backing file by path; point it through the same fd. -u rewrites the
  // header only.
  RETURN_IF_ERROR(
      RunChecked({"qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-b",
                  q.seen.image_dir + "/scratch.qcow2", "-F", "qcow2", c.vm_dir + "/disk.qcow2"},
                 std::chrono::seconds(30))
          .Annotate("point the disk layer at the inherited image fd"));
  q.spawn.keep_fds = {q.image_dir.get(), q.vm_dir.get()};
  q.spawn.uid = uid;
  q.spawn.gid = static_cast<gid_t>(uid);
  struct stat kvm;
  if (c.accel == "kvm" && ::stat("/dev/kvm", &kvm) == 0) q.spawn.groups = {kvm.st_gid};
  return q;
}

}  // namespace

std::string KernelCmdline(const VmConfig& c) {
  // quiet: every console byte costs real time under TCG. panic=-1 with -no-reboot turns a
  // guest panic into a QEMU exit the daemon observes.
  std::string line = "console=ttyS0 quiet panic=-1 random.trust_cpu=on trybox.vmid=" + c.id +
                     " trybox.hostname=trybox-" + c.id + " trybox.machine_id=" + MachineId();
  // Under TCG the guest's TSC is the host's, but microvm offers no PIT-independent reference
  // to calibrate it; on a loaded host PIT calibration fails and the boot stalls for minutes
  // (measured: no progress in 60 s at load 4 on 2 cores). Telling the kernel the frequency
  // skips the calibration.
  if (c.accel == "tcg" && HostTscKhz() > 0) {
    line += " tsc_early_khz=" + std::to_string(HostTscKhz());
  }
  // TCG caches translated code by virtual address; with ASLR every new process maps libc
  // somewhere new and is translated again. Measured in the guest: fork+exec of /bin/true
  // from bash 56 ms with ASLR, 30 ms without. Inside a single-tenant throwaway VM ASLR
  // protects nothing the sandbox boundary does not; under KVM it stays on.
  if (c.accel == "tcg") line += " norandmaps";
  return line;
}

std::vector<std::string> QemuArgv(const VmConfig& c) {
  const std::string& img = c.image_dir;
  const std::string& dir = c.vm_dir;
  // One option and its value per line, as in the QEMU manual.
  // clang-format off
  std::vector<std::string> a = {
      c.qemu,
      "-name", "trybox-vm-" + c.id + ",process=trybox-vm-" + c.id,
      "-machine", "microvm,accel=" + c.accel + ",isa-serial=on,rtc=on",
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
      "-drive", "id=disk,file=" + dir + "/disk.qcow2,format=qcow2,if=none,discard=unmap",
      "-device", "virtio-blk-device,drive=disk",
      "-device", "virtio-rng-device",
      "-device", "virtio-serial-device",
      "-chardev", "socket,id=ctl,path=" + dir + "/ctl.sock,server=on,wait=off",
      "-device", "virtserialport,chardev=ctl,name=org.trybox.ctl",
      // A second port for qemu-guest-agent, so the benchmarks can compare against it in the
      // same guest. Nothing in the guest listens on it unless qemu-ga is started there.
      "-chardev", "socket,id=qga,path=" + dir + "/qga.sock,server=on,wait=off",
      "-device", "virtserialport,chardev=qga,name=org.qemu.guest_agent.0",
      "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
  };
  // clang-format on
  return a;
}

AccelChoice ProbeAccel(const std::string& image_dir, const std::string& work_dir,
                       const std::string& qemu) {
  if (::access("/dev/kvm", F_OK) != 0) return {"tcg", "/dev/kvm does not exist"};
  int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return {"tcg", "cannot open /dev/kvm: " + ErrnoError("open").message() +
                       " (add yourself to the kvm group for hardware acceleration)"};
  }
  ::close(fd);
  std::string log = work_dir + "/kvm-probe-console.log";
  ::unlink(log.c_str());
  auto start = Clock::now();
  auto r = RunCommand({qemu,
                       "-machine",
                       "microvm,accel=kvm",
                       "-cpu",
                       "host",
                       "-m",
                       "128",
                       "-nodefaults",
                       "-no-user-config",
                       "-display",
                       "none",
                       "-no-reboot",
                       "-serial",
                       "file:" + log,
                       "-kernel",
                       image_dir + "/vmlinux",
                       "-initrd",
                       image_dir + "/initrd.cpio",
                       "-append",
                       "console=ttyS0 quiet panic=-1 trybox.probe=1"},
                      std::chrono::seconds(30));
  double ms = MsSince(start);
  std::string console = Tail(log, 4096);
  ::unlink(log.c_str());
  if (r.ok() && console.find("TRYBOX-PROBE-OK") != std::string::npos) {
    return {"kvm",
            "a probe guest booted under KVM in " + std::to_string(static_cast<int>(ms)) + " ms"};
  }
  std::string why;
  if (!r.ok()) {
    why = r.status().message();
  } else {
    std::string out = r->output;
    size_t nl = out.find('\n');
    why = "QEMU " + r->exit.Describe() + (out.empty() ? "" : ": " + out.substr(0, nl));
  }
  return {"tcg", "/dev/kvm exists but a standard guest does not run under it (" + why +
                     "); using TCG software emulation"};
}

Json DestroyReport::ToJson() const {
  return {{"process_gone", process_gone},
          {"qemu_exit", qemu_exit},
          {"sockets_removed", sockets_removed},
          {"dir_removed", dir_removed}};
}

Result<std::unique_ptr<Vm>> Vm::Boot(const VmConfig& config, std::chrono::milliseconds timeout) {
  auto start = Clock::now();
  auto deadline = start + timeout;
  std::unique_ptr<Vm> vm(new Vm(config));
  const std::string& dir = config.vm_dir;
  if (::mkdir(dir.c_str(), 0700) != 0) return ErrnoError("mkdir " + dir);
  auto fail = [&](Status st) -> Status {
    std::string console = vm->ConsoleTail(1500);
    std::string qlog = Tail(dir + "/qemu.log", 1000);
    vm->Destroy();
    std::string msg = st.message();
    if (!qlog.empty()) msg += "\n--- qemu ---\n" + qlog;
    if (!console.empty()) msg += "\n--- guest console ---\n" + console;
    return Status(st.code(), msg);
  };

  Status st = RunChecked({"qemu-img", "create", "-q", "-f", "qcow2", "-b",
                          config.image_dir + "/scratch.qcow2", "-F", "qcow2", dir + "/disk.qcow2"},
                         std::chrono::seconds(30));
  if (!st.ok()) return fail(st.Annotate("create the VM's disk layer"));
  auto sandbox = SandboxQemu(config);
  if (!sandbox.ok()) return fail(sandbox.status());

  auto log = OpenFile(dir + "/qemu.log", O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (!log.ok()) return fail(log.status());
  SpawnOptions opts = std::move(sandbox->spawn);
  opts.argv = QemuArgv(sandbox->seen);
  opts.stdout_fd = log->get();
  opts.stderr_fd = log->get();
  auto child = ChildProcess::Spawn(opts);
  if (!child.ok()) return fail(child.status().Annotate("start QEMU"));
  vm->pid_ = child->Release();
  vm->watcher_ = std::thread([v = vm.get()] { v->WatchQemu(); });

  // QEMU creates the control socket during start-up; retry until it accepts.
  UniqueFd ctl;
  for (;;) {
    auto fd = ConnectUnix(dir + "/ctl.sock");
    if (fd.ok()) {
      ctl = std::move(*fd);
      break;
    }
    if (!vm->alive()) return fail(Unavailable("QEMU exited during start-up"));
    if (Clock::now() > deadline)
      return fail(DeadlineExceeded("QEMU never opened its control socket"));
    ::usleep(2000);
  }
  vm->mux_ = std::make_unique<channel::Mux>(std::move(ctl), channel::Role::kHost);
  if (config.guest_open) vm->mux_->OnOpen(config.guest_open);
  auto hello = std::make_shared<std::promise<Json>>();
  auto once = std::make_shared<std::once_flag>();
  vm->mux_->OnControl([hello, once](const Json& e) {
    if (e.value("type", "") == "hello") std::call_once(*once, [&] { hello->set_value(e); });
  });
  vm->mux_->Start();
  auto fut = hello->get_future();
  while (fut.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    if (!vm->alive()) {
      return fail(Unavailable("the guest never answered: " + vm->death_reason()));
    }
    if (Clock::now() > deadline) {
      return fail(DeadlineExceeded("the guest agent did not answer within " +
                                   std::to_string(timeout.count()) + " ms"));
    }
  }
  auto ping = vm->Open({{"op", "ping"}});
  if (!ping.ok()) return fail(ping.status().Annotate("ping the guest agent"));
  auto reply = (*ping)->Next(deadline);
  if (!reply.ok()) return fail(reply.status().Annotate("ping the guest agent"));
  if (reply->kind != channel::Stream::Message::Kind::kEnd || !reply->body.value("ok", false)) {
    return fail(Unavailable("the guest agent answered the ping with " + reply->body.dump()));
  }
  vm->boot_ms_ = MsSince(start);
  return vm;
}

Vm::~Vm() { Destroy(); }

void Vm::WatchQemu() {
  int status;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  ExitInfo info = ExitInfoFromWaitStatus(status);
  std::lock_guard<std::mutex> lock(mu_);
  qemu_exit_ = info;
  if (death_.empty()) death_ = "QEMU exited (" + info.Describe() + ")";
  exited_cv_.notify_all();
}

bool Vm::alive() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!death_.empty()) return false;
  return !mux_ || mux_->alive();
}

std::string Vm::death_reason() const {
  std::unique_lock<std::mutex> lock(mu_);
  if (!death_.empty()) return death_;
  if (mux_ && !mux_->alive()) {
    // The channel usually closes because QEMU died; its exit status arrives a moment later
    // and is the more useful reason, so give the watcher a second to report it.
    exited_cv_.wait_for(lock, std::chrono::seconds(1), [&] { return !death_.empty(); });
    if (!death_.empty()) return death_;
    return "guest channel lost: " + mux_->death_reason();
  }
  return "";
}

Result<std::shared_ptr<channel::Stream>> Vm::Open(const Json& request) {
  if (!mux_) return Unavailable("VM " + config_.id + " is not connected");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!death_.empty()) return Unavailable("VM " + config_.id + " is gone: " + death_);
  }
  auto s = mux_->Open(request);
  if (!s.ok()) {
    std::string why = death_reason();
    return Unavailable("VM " + config_.id +
                       " is gone: " + (why.empty() ? s.status().message() : why));
  }
  return s;
}

std::string Vm::ConsoleTail(size_t max) const { return Tail(config_.vm_dir + "/console.log", max); }

DestroyReport Vm::Destroy() {
  if (destroyed_) return *destroyed_;
  DestroyReport r;
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
  }
  if (watcher_.joinable()) watcher_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  pid_t p = static_cast<pid_t>(pid);
  // Only a process whose command line still names this VM is ours: pids get reused.
  auto still_ours = [&] {
    return p > 0 && ProcessExists(p) &&
           ProcessCmdline(p).find("trybox-vm-" + id) != std::string::npos;
  };
  if (still_ours()) {
    ::kill(-p, SIGKILL);
    ::kill(p, SIGKILL);
    // Not our child any more (its parent died), so poll rather than wait.
    for (int i = 0; i < 500 && still_ours(); ++i) ::usleep(10000);
    r.qemu_exit = "killed orphan";
  } else {
    r.qemu_exit = "already gone";
  }
  r.process_gone = !still_ours();
  RemoveVmFiles(vm_dir, &r);
  return r;
}

}  // namespace trybox::vmm
