// What trybox-init closes during boot so that no command reaches the control channel or a
// kernel route to a fully privileged process. Each layer and why: docs/security.md,
// "Inside the guest". Called by Boot() on the main thread, before any command exists; a
// failure is a failed boot (the guest powers off rather than serve unprotected).
#pragma once

#include "util/fd.h"
#include "util/status.h"

namespace trybox::guest {

// After trybox-init has loaded its modules itself (finit_module): kernel.modprobe = "", so
// the kernel never runs a rootfs program for request_module; and the usermode-helper
// capability sets (kernel.usermodehelper.bset/inheritable) cut to a root command's, so any
// helper the kernel still starts (a core_pattern pipe, /sbin/request-key, ...) holds no
// more than a command does. /proc must be mounted.
Status LockDownKernelHelpers();

// Removes /dev nodes the guest never opens again after boot: the two disks (mounted by
// now; their raw blocks under a mounted ext4 are a route into the kernel's filesystem
// code). Commands cannot make new nodes (CAP_MKNOD is dropped).
Status RemoveDiskNodes();

// Read-only bind mounts over /proc/sys, /sys and /sys/fs/cgroup, in
// the one mount namespace trybox-init and the commands share. Returns a read-write
// directory fd of the cgroup2 root, opened before: trybox-init keeps making exec cgroups
// through it. Commands, lacking CAP_SYS_ADMIN, can neither remount nor unmount these.
Result<UniqueFd> LockDownMounts();

}  // namespace trybox::guest
