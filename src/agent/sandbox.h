// What trybox-agent does to itself before it reads a byte from tryboxd: the fewest
// privileges the host allows (docs/security.md, "The agent process").
//
//   - new network, mount, IPC and UTS namespaces: no network at all (its one connection is
//     the socket it inherited) and an empty filesystem (chroot into an empty tmpfs);
//   - when started as root, a uid and gid of its own (given by the daemon), no groups;
//     otherwise a user namespace makes the rest possible without privilege;
//   - no_new_privs, no capabilities, and a seccomp filter that refuses execve, ptrace,
//     new sockets, mounts, namespace changes, module and kexec calls, bpf, perf and keyrings.
//
// Every shared library is loaded by then; nothing after needs a file.
#pragma once

#include <sys/types.h>

#include <optional>

#include "util/status.h"

namespace trybox::agent {

struct SandboxReport {
  bool namespaces = false;  // network, mount, IPC, UTS
  bool user_namespace = false;
  bool chroot = false;
  bool uid_dropped = false;
  bool seccomp = false;
};

// `uid`: the uid (and gid) to become when running as root. Fails only where a step that
// must hold could not be done (no_new_privs, seccomp, the uid drop); a host without user
// namespaces leaves the namespaces out and says so in the report.
Result<SandboxReport> EnterSandbox(std::optional<uid_t> uid);

}  // namespace trybox::agent
