// The kernel command line as trybox-init reads it: the trybox.* parameters the host sets,
// and `module.param=value` entries, which the kernel leaves to whoever loads the module
// (modprobe normally; trybox-init here, since it loads modules itself).
//
// Pure parsing, no I/O. Parameter meanings: docs/protocol/guest.md.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trybox::guest {

struct KernelCmdline {
  // trybox.probe=1: print the probe marker and power off.
  bool probe = false;
  // trybox.template=1: this boot will be saved as a template and restored as many clones.
  // The guest takes no identity from the command line, never reads boot_id, and refuses
  // exec/put/get until an identity request (docs/protocol/guest.md) has given it one.
  bool template_boot = false;
  // trybox.layers=N (1..16): the image's read-only layers, disks with serials
  // trybox-layer-1..N, stacked over the root (docs/images.md, "Derived images").
  int layers = 0;
  // trybox.hostname=NAME, validated; empty when absent or invalid.
  std::string hostname;
  // trybox.machine_id=32HEX, lowercased; empty when absent or invalid.
  std::string machine_id;
  // Every `key=value` (or bare `key`, value empty) before a lone "--", in order.
  std::vector<std::pair<std::string, std::string>> params;
  // One line per trybox.* parameter that was present but rejected, for the console.
  std::vector<std::string> problems;
};

// Splits on whitespace; double quotes group (`a="b c"` is one parameter, quotes removed),
// as the kernel's own parser does.
KernelCmdline ParseKernelCmdline(std::string_view text);

// The `module.param=value` entries for `module`, joined the way finit_module(2) expects
// ("p1=v1 p2=v2"). '-' and '_' are the same in module names.
std::string ModuleParams(const KernelCmdline& cmdline, std::string_view module);

// "virtio-rng.ko" / "kernel/fs/ext4/ext4.ko.xz" -> "virtio_rng" / "ext4".
std::string ModuleNameFromPath(std::string_view path);

// A hostname the guest will accept: 1..64 characters, dot-separated labels of [A-Za-z0-9-]
// that neither start nor end with '-'.
bool ValidHostname(std::string_view name);

// A machine-id as /etc/machine-id holds it: 32 hex digits, not all zero, lowercased.
// nullopt if `value` is not one.
std::optional<std::string> NormalizeMachineId(std::string_view value);

}  // namespace trybox::guest
