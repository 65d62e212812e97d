#include "agent/sandbox.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

// In a sanitized build (TRYBOX_SANITIZE): LeakSanitizer checks at exit by stopping the process's
// threads with ptrace, which the sandbox denies, and reads /proc, which its empty root lacks;
// the check would fail every sandboxed run. The code these binaries share is leak-checked
// in unit_tests.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
extern "C" int __lsan_is_turned_off() { return 1; }
#endif
#endif

namespace trybox::agent {
namespace {

Status WriteProcFile(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + path);
  ssize_t n = ::write(fd, text.data(), text.size());
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size())) return ErrnoError("write " + path, err);
  return Status::Ok();
}

// An empty, read-only root: a fresh tmpfs with nothing in it.
Status EmptyRoot() {
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return ErrnoError("make the mounts private");
  }
  const char* dir = "/tmp";
  if (::mount("trybox-agent", dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=4k,mode=0555") != 0) {
    return ErrnoError("mount an empty tmpfs");
  }
  if (::chdir(dir) != 0 || ::chroot(".") != 0 || ::chdir("/") != 0) {
    return ErrnoError("chroot into the empty tmpfs");
  }
  if (::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0) {
    return ErrnoError("make the empty root read-only");
  }
  return Status::Ok();
}

Status Seccomp() {
  scmp_filter_ctx ctx = ::seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return Internal("seccomp_init failed");
  const int denied[] = {
      SCMP_SYS(execve),
      SCMP_SYS(execveat),
      SCMP_SYS(ptrace),
      SCMP_SYS(process_vm_readv),
      SCMP_SYS(process_vm_writev),
      SCMP_SYS(socket),
      SCMP_SYS(socketpair),
      SCMP_SYS(connect),
      SCMP_SYS(bind),
      SCMP_SYS(listen),
      SCMP_SYS(accept),
      SCMP_SYS(accept4),
      SCMP_SYS(mount),
      SCMP_SYS(umount2),
      SCMP_SYS(pivot_root),
      SCMP_SYS(chroot),
      SCMP_SYS(unshare),
      SCMP_SYS(setns),
      SCMP_SYS(init_module),
      SCMP_SYS(finit_module),
      SCMP_SYS(delete_module),
      SCMP_SYS(kexec_load),
      SCMP_SYS(kexec_file_load),
      SCMP_SYS(reboot),
      SCMP_SYS(bpf),
      SCMP_SYS(perf_event_open),
      SCMP_SYS(keyctl),
      SCMP_SYS(add_key),
      SCMP_SYS(request_key),
      SCMP_SYS(userfaultfd),
      SCMP_SYS(io_uring_setup),
      SCMP_SYS(pidfd_getfd),
      SCMP_SYS(pidfd_open),
      SCMP_SYS(open_by_handle_at),
      SCMP_SYS(name_to_handle_at),
      SCMP_SYS(swapon),
      SCMP_SYS(swapoff),
      SCMP_SYS(setuid),
      SCMP_SYS(setgid),
      SCMP_SYS(setresuid),
      SCMP_SYS(setresgid),
      SCMP_SYS(setgroups),
  };
  for (int nr : denied) {
    if (::seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0) != 0) {
      ::seccomp_release(ctx);
      return Internal("seccomp_rule_add failed");
    }
  }
  int rc = ::seccomp_load(ctx);
  ::seccomp_release(ctx);
  if (rc != 0) return Status(Code::kInternal, "seccomp_load failed: " + std::to_string(rc));
  return Status::Ok();
}

}  // namespace

Result<SandboxReport> EnterSandbox(std::optional<uid_t> uid) {
  SandboxReport r;
  const bool root = ::geteuid() == 0;
  int flags = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS;
  if (root) {
    r.namespaces = ::unshare(flags) == 0;
  } else {
    uid_t my_uid = ::geteuid();
    gid_t my_gid = ::getegid();
    if (::unshare(flags | CLONE_NEWUSER) == 0) {
      r.namespaces = r.user_namespace = true;
      // Map only ourselves: nothing in this namespace can become anyone else.
      (void)WriteProcFile("/proc/self/setgroups", "deny");
      RETURN_IF_ERROR(WriteProcFile("/proc/self/uid_map",
                                    std::to_string(my_uid) + " " + std::to_string(my_uid) + " 1"));
      RETURN_IF_ERROR(WriteProcFile("/proc/self/gid_map",
                                    std::to_string(my_gid) + " " + std::to_string(my_gid) + " 1"));
    }
  }
  if (r.namespaces) r.chroot = EmptyRoot().ok();
  if (root) {
    if (!uid) return FailedPrecondition("running as root without a uid to become");
    if (::setgroups(0, nullptr) != 0) return ErrnoError("setgroups");
    if (::setresgid(*uid, *uid, *uid) != 0) return ErrnoError("setresgid");
    if (::setresuid(*uid, *uid, *uid) != 0) return ErrnoError("setresuid");
    r.uid_dropped = true;
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return ErrnoError("no_new_privs");
  // No core files: they would hold whatever the process read.
  (void)::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  RETURN_IF_ERROR(Seccomp());
  r.seccomp = true;
  return r;
}

}  // namespace trybox::agent
