// The operator's egress settings: $TRYBOX_CONFIG/egress.json (docs/protocol/egress.md).
// Read once by tryboxd at start-up; the CLI and guests cannot change them.
#pragma once

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "egress/allowlist.h"
#include "util/status.h"

namespace trybox::egress {

struct Config {
  // Named allow-lists: `trybox run --profile NAME`.
  std::map<std::string, std::vector<std::string>> profiles;
  int max_tunnels_per_vm = 64;
  std::chrono::milliseconds head_timeout{10000};
  std::chrono::milliseconds connect_timeout{10000};
  // Internal addresses egress may reach anyway (a local model server). Empty by default.
  std::vector<AddressOverride> internal_allow;
  // Fixed name -> addresses map used instead of DNS (tests). Null: the system resolver.
  nlohmann::json resolve;
  // Layer 1. false starts QEMU in the daemon's own network namespace and uid: only for the
  // test that shows the proxy holds on its own.
  bool qemu_netns = true;
  bool qemu_drop_uid = true;
  uint32_t qemu_uid_base = 2000000000;  // root daemons run each VM's QEMU as base + slot
  // Retention of the audit (docs/store.md): rows of connections older than this, and the
  // oldest beyond this many, are pruned. 0 keeps everything.
  std::chrono::seconds audit_max_age{30 * 86400};
  int64_t audit_max_rows = 1'000'000;
};

// A missing file gives the defaults. Unknown keys, wrong types and invalid entries fail,
// naming the key.
Result<Config> LoadConfig(const std::string& path);
Result<Config> ParseConfig(const nlohmann::json& j);

}  // namespace trybox::egress
