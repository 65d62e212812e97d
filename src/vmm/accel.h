// The acceleration probe's result, kept across daemon restarts (docs/templates.md,
// "Acceleration").
//
// A probe boots a guest under KVM, which costs a second where KVM works and up to the probe's
// timeout where it hangs; its answer only changes with the host kernel, QEMU, the CPU, access
// to /dev/kvm and the kernel the probe boots. So the answer is written to accel.json with
// those inputs (the key), and reused while they match.
//
// File (JSON): {"accel": "kvm"|"tcg", "reason": text, "probed_at": ISO date,
//               "key": {"host_kernel", "qemu_version", "cpu_flags_sha256", "kvm_device",
//                       "probe_kernel_sha256"}}
#pragma once

#include <sys/types.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "util/status.h"
#include "vmm/qemu.h"

namespace trybox::vmm {

// The inputs a probe's answer depends on, read from this host: `uname -srv`, QEMU's
// version line, a hash of the first CPU's flags in /proc/cpuinfo, whether /dev/kvm is
// absent, unopenable or openable, and the sha256 of the probe image's kernel (from its
// manifest).
Result<nlohmann::json> AccelKey(const std::string& qemu, const std::string& image_dir);

// The cached choice if `path` holds one made under `key`; nullopt if there is none, it is
// malformed, or any input changed.
std::optional<AccelChoice> LoadCachedAccel(const std::string& path, const nlohmann::json& key);

// Writes `choice` with `key` and the date (atomically).
Status SaveAccel(const std::string& path, const nlohmann::json& key, const AccelChoice& choice);

// Boots the image's kernel under KVM with trybox.probe=1 and looks for the guest's marker on
// the console. KVM is chosen only if a standard guest actually runs; /dev/kvm existing is
// not enough (nested hosts can fail the first MSR write). A probe guest that has not ended
// within `timeout` is killed and counts as a failure (under working KVM it ends in well
// under a second).
//
// The probe's QEMU is named like a VM's (-name trybox-probe-TOKEN, a fresh random token)
// and recorded in `work_dir`/probe.pid ("PID TOKEN"; PID 0 until it is known) for as long
// as it runs, so that a daemon killed during the probe leaves it to the next one:
// ReapProbe.
inline constexpr std::chrono::milliseconds kProbeTimeout{5000};
inline constexpr const char* kProbePidFile = "probe.pid";
AccelChoice ProbeAccel(const std::string& image_dir, const std::string& work_dir,
                       const std::string& qemu = "qemu-system-x86_64",
                       std::chrono::milliseconds timeout = kProbeTimeout);

// At daemon start: kills the probe QEMU a dead daemon recorded in `work_dir`/probe.pid, if
// that process is still the probe (its command line names the recorded token; a reused pid
// is left alone), and removes the file. Returns the pid killed, or 0.
pid_t ReapProbe(const std::string& work_dir);

}  // namespace trybox::vmm
