#include "guest/boot.h"

#include <fcntl.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "guest/cgroup.h"
#include "guest/identity.h"
#include "guest/lockdown.h"
#include "util/fd.h"
#include "util/log.h"

#ifndef MODULE_INIT_COMPRESSED_FILE
#define MODULE_INIT_COMPRESSED_FILE 4
#endif

namespace trybox::guest {
namespace {

constexpr const char* kModulesList = "/etc/trybox/modules.load";
constexpr const char* kKernelVersion = "/etc/trybox/kernel_version";
constexpr const char* kLower = "/mnt/lower";
constexpr const char* kScratch = "/mnt/scratch";
constexpr const char* kNewRoot = "/mnt/root";
constexpr auto kDiskWait = std::chrono::seconds(10);
constexpr const char* kProbeMarker = "TRYBOX-PROBE-OK\n";

std::string Trim(std::string s) {
  while (!s.empty() && std::strchr(" \t\r\n", s.back()) != nullptr) s.pop_back();
  size_t start = s.find_first_not_of(" \t");
  return start == std::string::npos ? "" : s.substr(start);
}

// Serial output is transmitted after write(2) returns; wait for it before the power goes.
void DrainConsole() {
  if (::isatty(2)) ::tcdrain(2);
}

[[noreturn]] void Fatal(const Status& st) {
  LogError("init", "boot failed: " + st.message() + "; powering off");
  PowerOff();
}

Status MakeDir(const std::string& path, mode_t mode = 0755) {
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) return ErrnoError("mkdir " + path);
  return Status::Ok();
}

Status Mount(const std::string& source, const std::string& target, const char* type,
             unsigned long flags, const std::string& data = "") {
  RETURN_IF_ERROR(MakeDir(target));
  const char* options = data.empty() ? nullptr : data.c_str();
  if (::mount(source.c_str(), target.c_str(), type, flags, options) != 0) {
    return ErrnoError(std::string("mount ") + (type ? type : "") + " " + source + " on " + target +
                      (data.empty() ? "" : " (" + data + ")"));
  }
  return Status::Ok();
}

Status MountEarly() {
  RETURN_IF_ERROR(Mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC));
  RETURN_IF_ERROR(Mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC));
  RETURN_IF_ERROR(Mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755"));
  RETURN_IF_ERROR(Mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755"));
  return Status::Ok();
}

// The kernel gives init the console as 0/1/2 only if /dev/console existed in the initramfs.
void AttachConsole() {
  bool missing = false;
  for (int fd = 0; fd <= 2; ++fd) missing |= ::fcntl(fd, F_GETFD) < 0;
  if (!missing) return;
  int console = ::open("/dev/console", O_RDWR | O_NOCTTY);
  if (console < 0) return;  // nowhere to report anything; carry on silently
  for (int fd = 0; fd <= 2; ++fd) {
    if (fd != console && ::fcntl(fd, F_GETFD) < 0) ::dup2(console, fd);
  }
  if (console > 2) ::close(console);
}

[[noreturn]] void Probe() {
  UniqueFd console(::open("/dev/console", O_WRONLY | O_NOCTTY | O_CLOEXEC));
  if (console.valid()) {
    (void)WriteFull(console.get(), kProbeMarker);
    // Serial output leaves after write(2) returns; the host must see the whole line.
    ::tcdrain(console.get());
  }
  PowerOff();
}

void LoadModules(const KernelCmdline& cmdline) {
  auto list = ReadFileToString(kModulesList);
  if (!list.ok()) {
    if (list.status().code() != Code::kNotFound) LogError("init", list.status().message());
    return;  // no list: everything needed is built in
  }
  auto version = ReadFileToString(kKernelVersion);
  if (!version.ok()) {
    LogError("init", "cannot load modules: " + version.status().message());
    return;
  }
  const std::string dir = "/lib/modules/" + Trim(*version) + "/";
  size_t start = 0;
  while (start < list->size()) {
    size_t nl = list->find('\n', start);
    if (nl == std::string::npos) nl = list->size();
    std::string line = Trim(list->substr(start, nl - start));
    start = nl + 1;
    if (line.empty() || line[0] == '#') continue;
    const std::string name = ModuleNameFromPath(line);
    UniqueFd fd(::open((dir + line).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      LogError("init", "module " + name + ": " + ErrnoError("open " + dir + line).message());
      continue;
    }
    bool compressed = line.size() > 3 &&
                      (line.ends_with(".xz") || line.ends_with(".zst") || line.ends_with(".gz"));
    // Module options on the kernel command line are only applied by whoever loads the
    // module (e.g. virtio_mmio.device=... when ACPI does not describe the devices).
    std::string params = ModuleParams(cmdline, name);
    if (::syscall(SYS_finit_module, fd.get(), params.c_str(),
                  compressed ? MODULE_INIT_COMPRESSED_FILE : 0) != 0 &&
        errno != EEXIST) {
      LogError("init", "module " + name + ": " + ErrnoError("finit_module").message());
    }
  }
}

Status WaitForDevice(const std::string& path, std::chrono::steady_clock::time_point deadline) {
  struct stat st;
  while (::stat(path.c_str(), &st) != 0 || !S_ISBLK(st.st_mode)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return NotFound(path + " did not appear within " +
                      std::to_string(std::chrono::seconds(kDiskWait).count()) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Status::Ok();
}

// Mounts a derived image's layer K (docs/images.md, "Derived images") read-only at
// /mnt/layerK, found by its disk's serial, and removes its node as for the other disks.
Result<std::string> MountLayer(int k, std::chrono::steady_clock::time_point deadline) {
  const std::string serial = "trybox-layer-" + std::to_string(k);
  std::string name;
  while ((name = DiskBySerial(serial)).empty()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return NotFound("no disk with serial " + serial + " (layer " + std::to_string(k) + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string node = "/dev/" + name;
  const std::string dir = "/mnt/layer" + std::to_string(k);
  RETURN_IF_ERROR(WaitForDevice(node, deadline));
  RETURN_IF_ERROR(Mount(node, dir, "ext4", MS_RDONLY, "noload"));
  if (::unlink(node.c_str()) != 0) return ErrnoError("unlink " + node);
  return dir;
}

Status MountRoot(int layers, UniqueFd* upper) {
  auto deadline = std::chrono::steady_clock::now() + kDiskWait;
  RETURN_IF_ERROR(WaitForDevice("/dev/vda", deadline));
  RETURN_IF_ERROR(WaitForDevice("/dev/vdb", deadline));
  RETURN_IF_ERROR(MakeDir("/mnt"));
  // noload: the frozen image is attached read-only, so its journal must not be replayed.
  RETURN_IF_ERROR(Mount("/dev/vda", kLower, "ext4", MS_RDONLY, "noload"));
  RETURN_IF_ERROR(Mount("/dev/vdb", kScratch, "ext4", MS_NOATIME));
  RETURN_IF_ERROR(MakeDir(std::string(kScratch) + "/upper"));
  RETURN_IF_ERROR(MakeDir(std::string(kScratch) + "/work"));
  // The newest layer first: overlayfs reads lowerdir left to right.
  std::string lower = kLower;
  for (int k = 1; k <= layers; ++k) {
    ASSIGN_OR_RETURN(std::string dir, MountLayer(k, deadline));
    lower = dir + ":" + lower;
  }
  // Kept for a commit (layer.h): the upper dir is out of every command's reach once the
  // root has moved.
  upper->Reset(
      ::open((std::string(kScratch) + "/upper").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!upper->valid()) return ErrnoError("open the upper dir");
  return Mount(
      "overlay", kNewRoot, "overlay", 0,
      "lowerdir=" + lower + ",upperdir=" + kScratch + "/upper,workdir=" + kScratch + "/work");
}

// switch_root: an initramfs cannot be pivot_root'ed away, so the new root is moved over "/".
Status SwitchRoot() {
  for (const char* dir : {"/proc", "/sys", "/dev", "/run"}) {
    std::string target = std::string(kNewRoot) + dir;
    RETURN_IF_ERROR(MakeDir(target));
    if (::mount(dir, target.c_str(), nullptr, MS_MOVE, nullptr) != 0) {
      return ErrnoError(std::string("move ") + dir + " to " + target);
    }
  }
  // The modules are loaded; their files would only hold initramfs memory from now on.
  (void)RemoveTree("/lib/modules");
  if (::chdir(kNewRoot) != 0) return ErrnoError(std::string("chdir ") + kNewRoot);
  if (::mount(".", "/", nullptr, MS_MOVE, nullptr) != 0) {
    return ErrnoError(std::string("move ") + kNewRoot + " to /");
  }
  if (::chroot(".") != 0) return ErrnoError("chroot");
  if (::chdir("/") != 0) return ErrnoError("chdir /");
  return Status::Ok();
}

Status MountLate() {
  RETURN_IF_ERROR(Mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                        "ptmxmode=0666,mode=0620,gid=5"));
  RETURN_IF_ERROR(Mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777"));
  RETURN_IF_ERROR(Mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777"));
  RETURN_IF_ERROR(Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC));
  RETURN_IF_ERROR(MakeDir("/run/lock", 01777));
  ::chmod("/run/lock", 01777);
  const std::pair<const char*, const char*> links[] = {{"/proc/self/fd", "/dev/fd"},
                                                       {"/proc/self/fd/0", "/dev/stdin"},
                                                       {"/proc/self/fd/1", "/dev/stdout"},
                                                       {"/proc/self/fd/2", "/dev/stderr"}};
  for (const auto& [target, link] : links) {
    if (::symlink(target, link) != 0 && errno != EEXIST) {
      return ErrnoError(std::string("symlink ") + link);
    }
  }
  return Status::Ok();
}

void SetIdentity(const KernelCmdline& cmdline) {
  // A template's names are placeholders; each clone gets its own by an identity request.
  std::string name = cmdline.template_boot      ? "trybox-template"
                     : cmdline.hostname.empty() ? kDefaultHostname
                                                : cmdline.hostname;
  Status st = SetNames(name, cmdline.template_boot ? "" : cmdline.machine_id);
  if (!st.ok()) LogError("init", st.message());
}

// While lo is down a loopback listener binds but refuses every connection.
void LoopbackUp() {
  UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  struct ifreq ifr;
  std::memset(&ifr, 0, sizeof ifr);
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (!s.valid() || ::ioctl(s.get(), SIOCGIFFLAGS, &ifr) != 0) {
    LogError("init", ErrnoError("lo: SIOCGIFFLAGS").message());
    return;
  }
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (::ioctl(s.get(), SIOCSIFFLAGS, &ifr) != 0) {
    LogError("init", ErrnoError("lo: SIOCSIFFLAGS").message());
  }
}

}  // namespace

[[noreturn]] void PowerOff() {
  ::sync();
  DrainConsole();
  ::reboot(RB_POWER_OFF);
  // Only reachable if the kernel refused; PID 1 must not exit (that panics the kernel).
  for (;;) ::pause();
}

void UnmountAll() {
  ::sync();
  auto mounts = ReadFileToString("/proc/self/mounts");
  if (mounts.ok()) {
    std::vector<std::string> targets;
    size_t start = 0;
    while (start < mounts->size()) {
      size_t nl = mounts->find('\n', start);
      if (nl == std::string::npos) nl = mounts->size();
      std::string line = mounts->substr(start, nl - start);
      start = nl + 1;
      size_t a = line.find(' ');
      size_t b = a == std::string::npos ? a : line.find(' ', a + 1);
      if (b != std::string::npos) targets.push_back(line.substr(a + 1, b - a - 1));
    }
    for (auto it = targets.rbegin(); it != targets.rend(); ++it) {
      if (*it == "/" || *it == "/proc" || *it == "/sys" || *it == "/dev") continue;
      ::umount2(it->c_str(), 0);
    }
  }
  ::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_RDONLY, nullptr);
  ::sync();
}

BootInfo Boot() {
  Status early = MountEarly();
  AttachConsole();
  if (!early.ok()) Fatal(early);

  BootInfo info;
  auto cmdline = ReadFileToString("/proc/cmdline");
  if (!cmdline.ok()) Fatal(cmdline.status());
  info.cmdline = ParseKernelCmdline(*cmdline);
  if (info.cmdline.probe) Probe();
  for (const auto& p : info.cmdline.problems) LogError("init", p);

  LoadModules(info.cmdline);
  if (Status st = LockDownKernelHelpers(); !st.ok()) Fatal(st);
  UniqueFd upper;
  if (Status st = MountRoot(info.cmdline.layers, &upper); !st.ok()) Fatal(st);
  info.upper_dir = std::make_shared<UniqueFd>(std::move(upper));
  if (Status st = SwitchRoot(); !st.ok()) Fatal(st);
  if (Status st = MountLate(); !st.ok()) Fatal(st);
  if (Status st = RemoveDiskNodes(); !st.ok()) Fatal(st);
  // Not fatal: without it, bulk data takes the control channel.
  auto disk = TransferDisk::Find();
  if (disk.ok()) {
    info.transfer_disk = std::move(disk).value();
  } else {
    LogError("init", "transfer disk: " + disk.status().message());
  }
  // Not fatal either: without it, a workspace goes in and out as a tar.
  auto ws_disk = TransferDisk::Find(kWorkspaceDiskSerial);
  if (ws_disk.ok()) {
    info.workspace_disk = std::move(ws_disk).value();
  } else {
    LogError("init", "workspace disk: " + ws_disk.status().message());
  }
  SetIdentity(info.cmdline);
  LoopbackUp();
  auto cgroup_root = LockDownMounts();
  if (!cgroup_root.ok()) Fatal(cgroup_root.status());
  // Not fatal, as before: without exec cgroups a tree is still killed by process group.
  if (Status st = SetUpCommandCgroups(std::move(cgroup_root).value()); !st.ok()) {
    LogError("init", "command cgroups: " + st.message());
  }

  // The kernel generates boot_id on its first read. A template must leave it unread, or
  // every clone restored from it would share one.
  if (!info.cmdline.template_boot) {
    auto boot_id = ReadBootId();
    if (!boot_id.ok()) Fatal(boot_id.status());
    info.boot_id = *boot_id;
  }
  return info;
}

}  // namespace trybox::guest
