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

}  // namespace trybox::vmm
