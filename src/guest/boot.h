// The boot sequence trybox-init runs as /init of the initramfs, before it serves anything:
// early mounts, the probe, kernel modules, the overlay root and the switch into it, the
// late mounts, identity and loopback. Order and rules: docs/protocol/guest.md.
//
// Runs on the main thread before any other thread exists. Failures are written to the
// console (the only output a healthy boot makes is none at all).
#pragma once

#include <memory>
#include <string>

#include "guest/cmdline.h"
#include "guest/transfer_disk.h"
#include "util/fd.h"

namespace trybox::guest {

struct BootInfo {
  KernelCmdline cmdline;
  std::string boot_id;  // /proc/sys/kernel/random/boot_id
  // The transfer disk, opened once (its node removed); null if the machine has none.
  std::shared_ptr<TransferDisk> transfer_disk;
  std::shared_ptr<TransferDisk> workspace_disk;  // serial kWorkspaceDiskSerial, or null
  // The overlay's upper dir (the VM's own writes), read by a commit (layer.h).
  std::shared_ptr<UniqueFd> upper_dir;
};

// Runs the whole sequence. A probe boot prints the marker and powers off; a fatal failure
// (no root disk, a mount that fails) is logged and powers off: never a half-booted guest
// that looks alive. Returns only when the guest is ready to serve.
BootInfo Boot();

// sync, then power off. Never returns.
[[noreturn]] void PowerOff();

// Best-effort: unmounts what can be unmounted and syncs, for an orderly power-off.
void UnmountAll();

}  // namespace trybox::guest
