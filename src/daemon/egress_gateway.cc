#include "daemon/egress_gateway.h"

#include <thread>

#include "agent/text.h"
#include "util/log.h"
#include "util/names.h"
#include "util/numbers.h"

namespace trybox::daemon {
namespace {

// The audit record of egress decisions is the store's egress table.
class StoreAudit : public egress::AuditSink {
 public:
  explicit StoreAudit(store::Store& store) : store_(store) {}

  int64_t Decided(const egress::Decision& d) override {
    LogInfo("egress", "vm " + d.vm_id + " " + d.method + " " + d.host + ":" +
                          std::to_string(d.port) + " -> " + d.verdict + ": " + d.reason);
    auto id = store_.InsertEgress(Record(d));
    if (!id.ok()) LogError("egress", "audit insert failed: " + id.status().message());
    return id.ok() ? *id : -1;
  }

  void Closed(int64_t id, const egress::Decision& d) override {
    if (id < 0) return;
    store::EgressRecord r = Record(d);
    r.id = id;
    r.ended_at = store::NowSeconds();
    Status st = store_.FinishEgress(r);
    if (!st.ok()) LogError("egress", "audit update failed: " + st.message());
  }

 private:
  static store::EgressRecord Record(const egress::Decision& d) {
    store::EgressRecord r;
    r.vm_id = d.vm_id;
    r.started_at = d.started_at;
    r.method = d.method;
    r.host = d.host;
    r.port = d.port;
    r.address = d.address;
    r.verdict = d.verdict;
    r.reason = d.reason;
    r.override_used = d.override_used;
    r.status = d.status;
    r.bytes_up = d.bytes_up;
    r.bytes_down = d.bytes_down;
    r.duration_ms = d.duration_ms;
    return r;
  }

  store::Store& store_;
};

}  // namespace

Json EgressJson(const store::EgressRecord& e) {
  // Method, host and reason may quote what a guest sent: whatever its bytes, the row is JSON.
  return {{"id", e.id},
          {"vm", e.vm_id},
          {"started_at", e.started_at},
          {"ended_at", e.ended_at},
          {"method", agent::SanitizeUtf8(e.method)},
          {"host", agent::SanitizeUtf8(e.host)},
          {"port", e.port},
          {"address", e.address},
          {"verdict", e.verdict},
          {"reason", agent::SanitizeUtf8(e.reason)},
          {"override", e.override_used},
          {"status", e.status},
          {"bytes_up", e.bytes_up},
          {"bytes_down", e.bytes_down},
          {"duration_ms", e.duration_ms}};
}

Json EgressPolicyJson(const egress::Reach& r) {
  return {{"mode", egress::EgressModeName(r.mode)},
          {"allow", r.allow.ToStrings()},
          {"deny", r.DenyStrings()}};
}

namespace {

Result<std::shared_ptr<const EgressSettings>> ReadSettings(const std::string& path) {
  auto s = std::make_shared<EgressSettings>();
  ASSIGN_OR_RETURN(s->json, egress::LoadConfigJson(path));
  auto config = egress::ParseConfig(s->json);
  if (!config.ok()) return config.status().Annotate(path);
  s->config = std::move(*config);
  if (s->config.resolve.is_null()) {
    s->resolver = std::make_shared<egress::SystemResolver>();
  } else {
    ASSIGN_OR_RETURN(s->resolver, egress::MapResolver::FromJson(s->config.resolve));
    LogInfo("daemon", "egress resolves names through the configured map, never DNS");
  }
  for (const auto& o : s->config.internal_allow) {
    LogWarn("daemon", "egress may reach internal address " + o.text + " (internal_allow)");
  }
  if (s->config.model_route) {
    LogInfo("daemon", std::string("guests reach the model route ") + s->config.model_route->text +
                          " as http://" + egress::kModelHost);
  }
  std::optional<std::string> ca_file;
  if (!s->config.upstream_ca_file.empty()) ca_file = s->config.upstream_ca_file;
  auto tls = egress::UpstreamTls::Create(ca_file);
  if (!tls.ok()) return tls.status().Annotate(path + ": upstream_ca_file");
  s->upstream_tls = std::move(*tls);
  return std::shared_ptr<const EgressSettings>(std::move(s));
}

}  // namespace

Status CheckEgressConfig(const std::string& path) { return ReadSettings(path).status(); }

Result<std::unique_ptr<EgressGateway>> EgressGateway::Make(const std::string& config_path,
                                                           store::Store& store) {
  ASSIGN_OR_RETURN(auto settings, ReadSettings(config_path));
  std::unique_ptr<EgressGateway> g(new EgressGateway(config_path, store));
  {
    MutexLock lock(g->mu_);
    g->settings_ = std::move(settings);
  }
  g->audit_ = std::make_unique<egress::RateLimitedAudit>(std::make_unique<StoreAudit>(store),
                                                         egress::RateLimitedAudit::Options{});
  return g;
}

std::shared_ptr<const EgressSettings> EgressGateway::settings() const {
  MutexLock lock(mu_);
  return settings_;
}

Result<EgressReload> EgressGateway::Reload() {
  ASSIGN_OR_RETURN(auto next, ReadSettings(path_));
  MutexLock lock(mu_);
  EgressReload r;
  r.changed = egress::ConfigChanges(settings_->json, next->json);
  for (const auto& key : r.changed) {
    if (egress::NeedsRestart(key)) r.restart_required.push_back(key);
  }
  settings_ = std::move(next);
  return r;
}

void EgressGateway::VmGone(const std::string& vm_id) { audit_->FlushVm(vm_id); }

void EgressGateway::Housekeeping() {
  audit_->FlushExpired();
  auto now = settings();
  auto pruned = store_.PruneEgress(now->config.audit_max_age.count(), now->config.audit_max_rows);
  if (!pruned.ok()) {
    LogWarn("egress", "audit retention: " + pruned.status().message());
  } else if (*pruned > 0) {
    LogInfo("egress", "audit retention removed " + std::to_string(*pruned) + " rows");
  }
}

EgressGateway::~EgressGateway() {
  // Handlers use the store and the resolver; their streams died with the VMs, so they end
  // promptly (an upstream dial is bounded by connect_timeout).
  auto give_up = std::chrono::steady_clock::now() + settings()->config.connect_timeout +
                 std::chrono::seconds(5);
  while (in_flight_ > 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  audit_->Flush();
}

std::shared_ptr<const egress::Policy> EgressVm::policy() const {
  MutexLock lock(mu_);
  return policy_;
}

void EgressVm::set_policy(std::shared_ptr<const egress::Policy> p) {
  MutexLock lock(mu_);
  policy_ = std::move(p);
}

bool EgressVm::Change(const std::function<bool(egress::Reach&)>& change) {
  MutexLock lock(mu_);
  auto next = std::make_shared<egress::Policy>(*policy_);
  if (!change(next->reach)) return false;
  policy_ = std::move(next);
  return true;
}

Result<egress::Reach> EgressGateway::Reach(bool internet, const std::vector<std::string>& allow,
                                           const std::vector<std::string>& profiles,
                                           const std::vector<std::string>& deny) const {
  std::vector<std::string> entries = allow;
  auto now = settings();
  for (const auto& name : profiles) {
    auto p = now->config.profiles.find(name);
    if (p == now->config.profiles.end()) {
      return NotFound("no egress profile " + QuoteForMessage(name) +
                      " in the config file (egress.json)");
    }
    entries.insert(entries.end(), p->second.begin(), p->second.end());
  }
  egress::Reach r;
  r.mode = internet ? egress::EgressMode::kInternet : egress::EgressMode::kAllowList;
  ASSIGN_OR_RETURN(r.allow, egress::AllowList::Parse(entries));
  for (const auto& d : deny) {
    ASSIGN_OR_RETURN(auto e, egress::ParseDenyEntry(d));
    r.Deny(e);
  }
  return r;
}

Result<egress::Reach> EgressGateway::Change(const std::string& vm_id, EgressVm& vm,
                                            const EgressChange& c) {
  std::vector<egress::AllowEntry> allow, deny;
  for (const auto& a : c.allow) {
    ASSIGN_OR_RETURN(auto e, egress::ParseAllowEntry(a));
    allow.push_back(std::move(e));
  }
  for (const auto& d : c.deny) {
    ASSIGN_OR_RETURN(auto e, egress::ParseDenyEntry(d));
    deny.push_back(std::move(e));
  }
  if (allow.empty() && deny.empty()) {
    return InvalidArgument("nothing to change: name at least one host to allow or deny");
  }
  const std::string asked = " on the running VM, asked by " + c.by;
  for (const auto& e : allow) {
    if (vm.Change([&](egress::Reach& r) { return r.Allow(e); })) {
      RecordEntryRow(vm_id, "ALLOW", e, "policy", "allowed " + e.ToString() + asked);
    }
  }
  for (const auto& e : deny) {
    if (vm.Change([&](egress::Reach& r) { return r.Deny(e); })) {
      RecordEntryRow(vm_id, "DENY", e, "policy", "denied " + e.ToString() + asked);
    }
  }
  return vm.policy()->reach;
}

void EgressGateway::RecordRow(const std::string& vm_id, const char* method, std::string host,
                              int port, const char* verdict, const std::string& reason) {
  egress::Decision d;
  d.vm_id = vm_id;
  d.started_at = store::NowSeconds();
  d.method = method;
  d.host = std::move(host);
  d.port = port;
  d.verdict = verdict;
  d.reason = reason;
  audit_->Closed(audit_->Decided(d), d);
}

void EgressGateway::RecordEntryRow(const std::string& vm_id, const char* method,
                                   const egress::AllowEntry& e, const char* verdict,
                                   const std::string& reason) {
  RecordRow(vm_id, method, (e.wildcard ? "*." : "") + e.host, e.port, verdict, reason);
}

void EgressGateway::RecordRefusedRequest(const std::string& vm_id, const egress::AllowEntry& e,
                                         const std::string& why) {
  RecordEntryRow(vm_id, "REQUEST", e, "refused", why);
}

Result<EgressGateway::RequestAnswer> EgressGateway::AnswerRequest(const std::string& vm_id,
                                                                  EgressVm& vm,
                                                                  const std::string& text,
                                                                  const std::string& who) {
  ASSIGN_OR_RETURN(egress::AllowEntry e, egress::ParseAllowEntry(text));
  if (e.wildcard) {
    return InvalidArgument("request_network takes one host, not a pattern: " + text);
  }
  RequestAnswer a;
  a.entry = e;
  const std::string target = e.ToString();
  const egress::Reach reach = vm.policy()->reach;
  const std::string why_not = reach.Check(e.host, e.port);
  if (why_not.empty()) {
    a.decision = "granted";
    a.message = target + " is already allowed for this VM: nothing changed";
    return a;
  }
  if (!reach.DeniedBy(e.host, e.port).empty()) {
    a.decision = "refused";
    a.message = "refused: " + why_not + "; only a person can lift it (trybox allow)";
    RecordRefusedRequest(vm_id, e, "request_network refused: " + why_not);
    return a;
  }
  size_t index = 0;
  const auto& rules = settings()->config.network_requests;
  const egress::RequestRule* rule = egress::MatchRequest(rules, e.host, e.port, &index);
  const std::string named = rule ? "the operator's policy (network_requests[" +
                                       std::to_string(index) + "]: " + rule->text + ")"
                                 : "";
  if (rule && rule->action == egress::RequestRule::Action::kAllow) {
    RETURN_IF_ERROR(Change(vm_id, vm, {{target}, {}, named + ", for " + who}).status());
    a.decision = "granted";
    a.message = "granted by " + named + ": " + target + " may now be reached";
    return a;
  }
  if (rule && rule->action == egress::RequestRule::Action::kDeny) {
    a.decision = "refused";
    a.message = "refused by " + named + ": " + target + " stays out of reach";
    RecordRefusedRequest(vm_id, e, "request_network " + a.message);
    return a;
  }
  a.decision = "ask";
  a.message = "May the VM reach " + target + "? (" +
              (rule ? named + " says ask" : "no rule of the operator's policy answers it") + ")";
  return a;
}

Result<std::shared_ptr<EgressVm>> EgressGateway::NewVm(
    egress::Reach reach, std::shared_ptr<const egress::SecretSet> secrets,
    std::shared_ptr<const egress::HttpRules> rules) const {
  auto now = settings();
  auto vm = std::make_shared<EgressVm>(now->config.max_tunnels_per_vm);
  vm->settings = now;
  auto policy = std::make_shared<egress::Policy>();
  policy->reach = std::move(reach);
  policy->overrides = now->config.internal_allow;
  policy->model_route = now->config.model_route;
  policy->head_timeout = now->config.head_timeout;
  policy->connect_timeout = now->config.connect_timeout;
  vm->set_policy(std::move(policy));
  const bool has_secrets = secrets && !secrets->empty();
  const bool has_rules = rules && !rules->empty();
  if (has_secrets || has_rules) {
    ASSIGN_OR_RETURN(vm->ca, egress::CertAuthority::Create("trybox egress CA"));
  }
  if (has_secrets) vm->secrets = std::move(secrets);
  if (has_rules) vm->rules = std::move(rules);
  return vm;
}

channel::Mux::OpenHandler EgressGateway::GuestHandler(const std::string& vm_id,
                                                      std::shared_ptr<EgressVm> vm) {
  return [this, vm_id, vm](std::shared_ptr<channel::Stream> s, Json req) {
    Serve(vm_id, *vm, *s, req);
  };
}

void EgressGateway::Serve(const std::string& vm_id, EgressVm& eg, channel::Stream& s,
                          const Json& req) {
  ++in_flight_;
  ++eg.streams;
  struct Done {
    std::atomic<int>& a;
    std::atomic<int>& b;
    ~Done() {
      --b;
      --a;
    }
  } done{in_flight_, eg.streams};
  // The guest is untrusted: it may open egress streams, ask its resolver's questions and
  // report dropped datagrams, nothing else (docs/protocol/egress.md).
  const std::string op = req.is_object() && req.contains("op") && req["op"].is_string()
                             ? req["op"].get<std::string>()
                             : "";
  if (op == "resolve") return Resolve(vm_id, eg, s, req);
  if (op == "udp") return RecordUdp(vm_id, s, req);
  if (op != "egress") {
    (void)s.End({{"ok", false},
                 {"error", "bad_request"},
                 {"message", "the host serves only egress, resolve and udp"}});
    return;
  }
  std::optional<egress::TransparentTarget> transparent;
  if (req.contains("target")) {
    const Json& t = req["target"];
    if (!t.is_object() || !t.contains("host") || !t["host"].is_string() || !t.contains("port") ||
        !t["port"].is_number_integer()) {
      (void)s.Reset("target must be {\"host\": string, \"port\": integer}");
      return;
    }
    transparent = egress::TransparentTarget{t["host"].get<std::string>(),
                                            static_cast<int>(t["port"].get<int64_t>())};
  }
  // Undecided connections hold a thread each; beyond four times the tunnel cap they are
  // refused before their request head is even read.
  if (eg.streams > 4 * eg.slots.max()) {
    egress::Decision d;
    d.vm_id = vm_id;
    d.started_at = store::NowSeconds();
    d.method = transparent ? "TCP" : "";
    d.verdict = "refused";
    d.status = transparent ? 0 : 503;
    d.reason = "too many open egress connections for this VM (" +
               std::to_string(4 * eg.slots.max()) + ", undecided ones included)";
    audit_->Closed(audit_->Decided(d), d);
    if (transparent) {
      (void)s.Reset(d.reason);
      return;
    }
    egress::StreamClient client(s);
    (void)client.Write(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: "
        "close\r\nX-Trybox-Reason: " +
        d.reason + "\r\n\r\n");
    (void)client.CloseWrite();
    (void)s.End({{"ok", true}, {"verdict", d.verdict}, {"status", d.status}});
    return;
  }
  egress::StreamClient client(s);
  const std::shared_ptr<const egress::Policy> policy = eg.policy();  // this connection's
  egress::Decision d = egress::ServeConnection(
      client,
      {policy.get(), eg.settings->resolver.get(), &eg.slots, audit_.get(), vm_id, eg.secrets.get(),
       eg.ca.get(), eg.settings->upstream_tls.get(), eg.rules.get()},
      transparent);
  (void)s.End({{"ok", true},
               {"verdict", d.verdict},
               {"status", d.status},
               {"bytes_up", d.bytes_up},
               {"bytes_down", d.bytes_down}});
}

void EgressGateway::Resolve(const std::string& vm_id, EgressVm& eg, channel::Stream& s,
                            const Json& req) {
  if (!req.contains("host") || !req["host"].is_string()) {
    (void)s.End({{"ok", false}, {"error", "bad_request"}, {"message", "host must be a string"}});
    return;
  }
  const std::string host = req["host"].get<std::string>();
  std::string why = egress::NameRefusal(*eg.policy(), host);
  if (why.empty()) {
    (void)s.End({{"ok", true}, {"allowed", true}});
    return;
  }
  (void)s.End({{"ok", true}, {"allowed", false}, {"reason", why}});
  RecordRow(vm_id, "DNS", host.substr(0, egress::kMaxAuditHost), 0, "refused",
            "name lookup answered NXDOMAIN: " + why);
}

void EgressGateway::RecordUdp(const std::string& vm_id, channel::Stream& s, const Json& req) {
  const Json* dropped =
      req.contains("dropped") && req["dropped"].is_array() ? &req["dropped"] : nullptr;
  if (!dropped) {
    (void)s.End({{"ok", false}, {"error", "bad_request"}, {"message", "dropped must be an array"}});
    return;
  }
  size_t n = 0;
  for (const Json& e : *dropped) {
    if (++n > kMaxUdpRowsPerReport) break;
    if (!e.is_object() || !e.contains("to") || !e["to"].is_string() || !e.contains("datagrams") ||
        !e["datagrams"].is_number_unsigned()) {
      continue;
    }
    std::string to = e["to"].get<std::string>().substr(0, egress::kMaxAuditHost);
    // "ip:port" as the guest saw it; a port that does not parse is recorded as 0.
    size_t colon = to.rfind(':');
    int port = 0;
    if (colon != std::string::npos) {
      port = static_cast<int>(
          ParseBoundedInt(std::string_view(to).substr(colon + 1), 0, 65535, "port").value_or(0));
    }
    RecordRow(vm_id, "UDP", to.substr(0, colon), port, "refused",
              std::to_string(e["datagrams"].get<uint64_t>()) +
                  " UDP datagram(s) dropped in the guest: only TCP leaves the VM (DNS is "
                  "answered by trybox-init)");
  }
  (void)s.End({{"ok", true}});
}

Result<AuditPage> EgressGateway::Audit(const std::string& vm_id, int64_t limit,
                                       std::optional<int64_t> before_id) const {
  AuditPage page;
  int64_t n = std::min(limit, kMaxPageRows);
  ASSIGN_OR_RETURN(page.rows, store_.ListEgress(vm_id, n, before_id.value_or(0)));
  // A full page may have older rows behind it, which the caller fetches by id.
  if (static_cast<int64_t>(page.rows.size()) == n && limit > n && !page.rows.empty()) {
    page.next_before_id = page.rows.front().id;
  }
  return page;
}

}  // namespace trybox::daemon
