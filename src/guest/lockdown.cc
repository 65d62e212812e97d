#include "guest/lockdown.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <string>

#include "guest/cgroup.h"
#include "guest/credentials.h"

namespace trybox::guest {
namespace {

Status WriteSysctl(const std::string& path, const std::string& value) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError("open " + path);
  return WriteFull(fd.get(), value).Annotate("write " + path);
}

// A bind of `path` onto itself, made read-only (its other flags kept). Recursive: the copy
// carries every mount below `path` (the cgroup2 mount under /sys), each made read-only too.
Status BindReadOnly(const char* path, bool recursive) {
  if (::mount(path, path, nullptr, MS_BIND | (recursive ? MS_REC : 0), nullptr) != 0) {
    return ErrnoError(std::string("bind ") + path);
  }
  struct mount_attr attr = {};
  attr.attr_set = MOUNT_ATTR_RDONLY;
  if (::mount_setattr(AT_FDCWD, path, recursive ? AT_RECURSIVE : 0, &attr, sizeof attr) != 0) {
    return ErrnoError(std::string("make ") + path + " read-only");
  }
  return Status::Ok();
}

}  // namespace

Status LockDownKernelHelpers() {
  RETURN_IF_ERROR(WriteSysctl("/proc/sys/kernel/modprobe", "\n"));
  // Two 32-bit words, low first (kernel/umh.c).
  const std::string caps = std::to_string(static_cast<uint32_t>(kCommandCapabilities)) + "\t" +
                           std::to_string(static_cast<uint32_t>(kCommandCapabilities >> 32));
  RETURN_IF_ERROR(WriteSysctl("/proc/sys/kernel/usermodehelper/bset", caps));
  return WriteSysctl("/proc/sys/kernel/usermodehelper/inheritable", caps);
}

Status RemoveDiskNodes() {
  for (const char* node : {"/dev/vda", "/dev/vdb"}) {
    if (::unlink(node) != 0) return ErrnoError(std::string("unlink ") + node);
  }
  return Status::Ok();
}

Result<UniqueFd> LockDownMounts() {
  UniqueFd cgroup(::open(kCgroupRoot, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cgroup.valid()) return ErrnoError(std::string("open ") + kCgroupRoot);
  RETURN_IF_ERROR(BindReadOnly("/sys", /*recursive=*/true));
  RETURN_IF_ERROR(BindReadOnly("/proc/sys", /*recursive=*/false));
  return cgroup;
}

}  // namespace trybox::guest
