// The operator's egress settings: $TRYBOX_CONFIG/egress.json (docs/protocol/egress.md).
// Read by tryboxd at start-up and again by `trybox daemon reload` (new VMs get the new
// settings, running ones keep theirs); the CLI and guests cannot change them.
#pragma once

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "egress/allowlist.h"
#include "util/status.h"

namespace trybox::egress {

// One rule of the operator's answers to network requests (a vm_agent's request_network):
// docs/protocol/egress.md, "Requests for more network".
struct RequestRule {
  enum class Action { kAllow, kAsk, kDeny };
  Action action = Action::kAsk;
  bool any_host = false;  // "*"
  AllowEntry pattern;     // else: HOST or *.DOMAIN; port 0 = every port
  std::string text;       // as written: "allow *.pythonhosted.org"

  bool Matches(const std::string& canonical_host, int port) const;
};

// The first rule matching `host`:`port`, or null: ask (the default).
const RequestRule* MatchRequest(const std::vector<RequestRule>& rules,
                                const std::string& canonical_host, int port, size_t* index);

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
  // Where the proxy looks for the CAs it trusts when it opens TLS to a secret's host
  // (docs/secrets.md): "" is the host's system store; a PEM file replaces it (tests' local
  // upstreams). Read at start and reload.
  std::string upstream_ca_file;
  // How a vm_agent's requests for another host are answered without asking a person:
  // evaluated in order, the first match decides; none: ask.
  std::vector<RequestRule> network_requests;
  // The operator's model server ("127.0.0.1:11434"): guests reach it as
  // http://model.trybox.internal (port 80), in either mode, without internal_allow.
  std::optional<AddressOverride> model_route;
};

// A missing file gives the defaults. Unknown keys, wrong types and invalid entries fail,
// naming the key.
Result<Config> LoadConfig(const std::string& path);
// The file's JSON object as it is ({} when the file is missing), unchecked.
Result<nlohmann::json> LoadConfigJson(const std::string& path);
// What differs between two config objects: each top-level key whose value changed, added
// or removed, and for "profiles" each profile by name ("profiles.NAME"). Sorted.
std::vector<std::string> ConfigChanges(const nlohmann::json& before, const nlohmann::json& after);
// Keys only a daemon restart applies (QEMU's netns and uid are set up at start).
bool NeedsRestart(const std::string& changed_key);
Result<Config> ParseConfig(const nlohmann::json& j);

}  // namespace trybox::egress
