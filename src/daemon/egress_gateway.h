// EgressGateway: the daemon's side of guest egress (docs/protocol/egress.md). It owns the
// operator's egress config, the resolver, the audit sink (the store's egress table), and
// each VM's policy and tunnel count; it serves the streams guests open, deciding each
// connection with egress::ServeConnection, and answers the `audit` verb.
//
// Reload() reads egress.json again: VMs created afterwards get the new settings; each
// running VM keeps the settings it was created with (its EgressVm holds them), so a reload
// never changes what a running VM may reach.
//
// Thread-safe: guest streams are served on their own threads, concurrently; per-VM state is
// an EgressVm shared with that VM's open handler; the current settings are swapped under mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "channel/mux.h"
#include "egress/audit_limit.h"
#include "egress/config.h"
#include "egress/proxy.h"
#include "egress/secrets.h"
#include "egress/tls.h"
#include "store/store.h"
#include "util/mutex.h"

namespace trybox::daemon {

using Json = nlohmann::json;

// One reading of egress.json: the parsed config, the object as written (to tell what a
// reload changed), and the resolver it configures. Immutable once made.
struct EgressSettings {
  egress::Config config;
  Json json;
  std::shared_ptr<egress::Resolver> resolver;
  // TLS toward secrets' hosts, trusting config.upstream_ca_file or the system store.
  std::shared_ptr<egress::UpstreamTls> upstream_tls;
};

// What a reload changed (egress::ConfigChanges) and which of those only apply after a
// daemon restart.
struct EgressReload {
  std::vector<std::string> changed;
  std::vector<std::string> restart_required;
};

// One VM's egress policy and counts; shared with its guest-open handler.
struct EgressVm {
  std::shared_ptr<const EgressSettings> settings;  // as of the VM's create
  egress::TunnelSlots slots;
  // The VM's secrets and the CA whose certificates its guest trusts (docs/secrets.md); both
  // null when the VM has no secret. The CA's key never leaves this process.
  std::shared_ptr<const egress::SecretSet> secrets;
  std::unique_ptr<egress::CertAuthority> ca;
  // The VM's HTTP rules (egress/http_rules.h); null without any. The CA exists for
  // them too: the hosts they cover are intercepted.
  std::shared_ptr<const egress::HttpRules> rules;
  // Streams the guest has open, decided or not: bounds the threads a guest can hold.
  std::atomic<int> streams{0};
  explicit EgressVm(int max_tunnels) : slots(max_tunnels) {}

  // The policy in force. Each connection takes it when it starts, so a change (Change)
  // applies from the next connection on and never to one already decided.
  std::shared_ptr<const egress::Policy> policy() const EXCLUDES(mu_);
  void set_policy(std::shared_ptr<const egress::Policy> p) EXCLUDES(mu_);
  // Runs `change` on a copy of the policy and puts the copy in force, all under the lock,
  // so two changes at once both apply. Returns what `change` returned.
  bool Change(const std::function<bool(egress::Reach&)>& change) EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::shared_ptr<const egress::Policy> policy_ GUARDED_BY(mu_);
};

// A change to a running VM's list (the egress verb; `trybox allow` / `trybox deny`).
struct EgressChange {
  std::vector<std::string> allow;  // HOST[:PORT]
  std::vector<std::string> deny;   // HOST[:PORT], no port: every port
  std::string by;                  // who asked, for the audit ("uid 1000")
};

struct AuditPage {
  std::vector<store::EgressRecord> rows;  // oldest first
  std::optional<int64_t> next_before_id;  // set when older rows remain past this page
};

// Reads and checks the egress.json at `path` as a daemon starting, or a reload, would,
// without applying it: the error either would give.
Status CheckEgressConfig(const std::string& path);

class EgressGateway {
 public:
  // Reads `config_path` (egress.json; defaults when missing).
  static Result<std::unique_ptr<EgressGateway>> Make(const std::string& config_path,
                                                     store::Store& store);
  // Waits (bounded by the connect timeout) for guest handlers still running.
  ~EgressGateway();

  // The current settings (those a new VM gets).
  std::shared_ptr<const EgressSettings> settings() const EXCLUDES(mu_);
  // Reads egress.json again. On an error (naming the file and the key) the settings in
  // force stay.
  Result<EgressReload> Reload() EXCLUDES(mu_);
  // A new VM's reach: internet mode or the allow-list of `allow` entries plus the named
  // profiles', less the `deny` entries; errors name the entry.
  Result<egress::Reach> Reach(bool internet, const std::vector<std::string>& allow,
                              const std::vector<std::string>& profiles,
                              const std::vector<std::string>& deny) const;
  // A VM's egress state; with secrets, a CA of its own for the guest to trust.
  Result<std::shared_ptr<EgressVm>> NewVm(egress::Reach reach,
                                          std::shared_ptr<const egress::SecretSet> secrets,
                                          std::shared_ptr<const egress::HttpRules> rules) const;
  // Changes running VM `vm_id`'s reach: every entry is checked before any applies. Each
  // entry that changed something is an audit row (verdict "policy", who asked in the
  // reason). Returns the reach now in force.
  Result<egress::Reach> Change(const std::string& vm_id, EgressVm& vm, const EgressChange& c);
  // A vm_agent's request_network for `entry` (HOST[:PORT] as --allow takes it): "granted"
  // (the operator's network_requests rule allows it, and it is added; or the VM reaches it
  // already), "refused" (a deny rule, or the VM's own deny entry) or "ask" (no rule, or an
  // ask rule: a person decides). Granted and refused answers are audit rows.
  struct RequestAnswer {
    std::string decision;
    std::string message;  // for the model and the person
    egress::AllowEntry entry;
  };
  Result<RequestAnswer> AnswerRequest(const std::string& vm_id, EgressVm& vm,
                                      const std::string& entry, const std::string& who);
  // A request a person refused: an audit row (verdict "refused", method "REQUEST").
  void RecordRefusedRequest(const std::string& vm_id, const egress::AllowEntry& e,
                            const std::string& why);
  // The handler for streams VM `vm_id`'s guest opens: egress tunnels, or refusals.
  channel::Mux::OpenHandler GuestHandler(const std::string& vm_id, std::shared_ptr<EgressVm> vm);

  // At most `max_rows` per page (a reply stays under the frame limit).
  // A VM is gone: the audit's counts for it are written now.
  void VmGone(const std::string& vm_id);
  // Now and then: summaries of refusal windows that have ended; audit rows past their age.
  void Housekeeping();

  static constexpr int64_t kMaxPageRows = 1000;
  Result<AuditPage> Audit(const std::string& vm_id, int64_t limit,
                          std::optional<int64_t> before_id) const;

 private:
  EgressGateway(std::string path, store::Store& store) : path_(std::move(path)), store_(store) {}
  void Serve(const std::string& vm_id, EgressVm& eg, channel::Stream& s, const Json& req);
  // The guest resolver's question ({"op":"resolve"}): answered by the VM's policy, a refusal
  // recorded (method "DNS").
  void Resolve(const std::string& vm_id, EgressVm& eg, channel::Stream& s, const Json& req);
  // The guest's report of UDP datagrams it dropped ({"op":"udp"}): a row per destination
  // (method "UDP"), at most kMaxUdpRowsPerReport of them.
  void RecordUdp(const std::string& vm_id, channel::Stream& s, const Json& req);
  static constexpr size_t kMaxUdpRowsPerReport = 17;
  // An audit row that is not a connection, written whole at once.
  void RecordRow(const std::string& vm_id, const char* method, std::string host, int port,
                 const char* verdict, const std::string& reason);
  // RecordRow for an entry: a change of the VM's list ("ALLOW"/"DENY", verdict "policy") or
  // a refused request_network ("REQUEST", verdict "refused").
  void RecordEntryRow(const std::string& vm_id, const char* method, const egress::AllowEntry& e,
                      const char* verdict, const std::string& reason);

  const std::string path_;
  store::Store& store_;
  mutable Mutex mu_;
  std::shared_ptr<const EgressSettings> settings_ GUARDED_BY(mu_);
  // The store's egress table behind a rate limit on refusals (egress/audit_limit.h).
  std::unique_ptr<egress::RateLimitedAudit> audit_;
  std::atomic<int> in_flight_{0};
};

// An audit row as the `audit` verb sends it.
Json EgressJson(const store::EgressRecord& e);
// A VM's policy by name: {"mode", "allow", "deny"} (docs/protocol/daemon.md).
Json EgressPolicyJson(const egress::Reach& r);

}  // namespace trybox::daemon
