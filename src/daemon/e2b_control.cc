// The E2B-compatible control plane (docs/protocol/e2b.md): the routes E2B's SDKs call when
// E2B_API_URL names trybox. Handlers parse E2B's JSON, call VmService, and answer in E2B's
// shapes; every refusal is {"code", "message"} with the HTTP status E2B would give.
#include <arpa/inet.h>

#include <nlohmann/json.hpp>

#include "daemon/http_api.h"
#include "util/log.h"
#include "util/names.h"
#include "util/numbers.h"

namespace trybox::daemon {
namespace {

// "0.0.0.0/0", "10.1.2.3", "2001:db8::/32": an address, with or without a prefix length.
bool IsAddressOrCidr(const std::string& s) {
  const std::string addr = s.substr(0, s.find('/'));
  in6_addr buf;
  return ::inet_pton(AF_INET, addr.c_str(), &buf) == 1 ||
         ::inet_pton(AF_INET6, addr.c_str(), &buf) == 1;
}

using api::HttpRequest;
using api::HttpResponse;
using api::JsonError;
using api::PathParams;
using nlohmann::json;

constexpr size_t kMaxMetadataEntries = 64;
constexpr size_t kMaxMetadataKeyBytes = 256;
constexpr size_t kMaxMetadataValueBytes = 4096;
constexpr size_t kMaxEnvEntries = 256;
constexpr size_t kMaxEnvValueBytes = 32768;
constexpr int64_t kDefaultTimeoutS = 15;  // E2B's default when the field is absent
constexpr int64_t kMaxPageLimit = 100;

HttpResponse Reply(int status, const json& j) {
  return api::JsonReply(status, j.dump(-1, ' ', false, json::error_handler_t::replace));
}

HttpResponse NoContent() { return {204, "", {}, ""}; }

HttpResponse FromStatus(const Status& st) { return JsonError(HttpStatusFor(st), st.message()); }

// The body as a JSON object, or the 400 that says why not.
Result<json> ObjectBody(const HttpRequest& req) {
  json j = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("the request body is not valid JSON");
  if (!j.is_object()) return InvalidArgument("the request body must be a JSON object");
  return j;
}

// A string-to-string object field; absent or null gives an empty map.
Result<std::map<std::string, std::string>> StringMap(const json& body, const char* field,
                                                     size_t max_entries, size_t max_key,
                                                     size_t max_value) {
  std::map<std::string, std::string> out;
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return out;
  if (!it->is_object())
    return InvalidArgument(std::string(field) + " must be an object of strings");
  if (it->size() > max_entries) {
    return InvalidArgument(std::string(field) + " has " + std::to_string(it->size()) +
                           " entries; at most " + std::to_string(max_entries));
  }
  for (const auto& [k, v] : it->items()) {
    if (!v.is_string()) return InvalidArgument(std::string(field) + "." + k + " must be a string");
    if (k.empty() || k.size() > max_key) {
      return InvalidArgument(std::string(field) + " has a key of " + std::to_string(k.size()) +
                             " bytes; 1 to " + std::to_string(max_key));
    }
    const std::string& s = v.get_ref<const std::string&>();
    if (s.size() > max_value) {
      return InvalidArgument(std::string(field) + "." + k + " is over " +
                             std::to_string(max_value) + " bytes");
    }
    out[k] = s;
  }
  return out;
}

bool IsEnvName(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  }
  return true;
}

// A non-negative integer field in seconds, at most `max`.
Result<int64_t> Seconds(const json& body, const char* field, int64_t fallback, int64_t max,
                        bool required) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) {
    if (required) return InvalidArgument(std::string(field) + " is required (seconds)");
    return fallback;
  }
  if (!it->is_number_integer() && !it->is_number_unsigned()) {
    return InvalidArgument(std::string(field) + " must be a whole number of seconds");
  }
  if (it->is_number_integer() && it->get<int64_t>() < 0) {
    return InvalidArgument(std::string(field) + " must not be negative");
  }
  const uint64_t v = it->get<uint64_t>();
  if (v > static_cast<uint64_t>(max)) {
    return InvalidArgument(std::string(field) + " is " + std::to_string(v) +
                           " s; this daemon allows at most " + std::to_string(max) + " s");
  }
  return static_cast<int64_t>(v);
}

// A field E2B has and trybox does not do: refused when set to anything but its default, so
// that a caller never believes it got what it did not.
Status Unsupported(const json& body, const char* field, const json& default_value,
                   const std::string& why) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null() || *it == default_value) return Status::Ok();
  return InvalidArgument(std::string(field) + " is not supported by trybox: " + why);
}

struct NewSandbox {
  CreateRequest create;
  std::string template_id;
  int64_t timeout_s = kDefaultTimeoutS;
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> env;
};

Result<NewSandbox> ParseNewSandbox(const json& body, int64_t max_timeout_s) {
  NewSandbox n;
  auto t = body.find("templateID");
  if (t == body.end() || !t->is_string())
    return InvalidArgument("templateID is required (a string)");
  n.template_id = t->get<std::string>();
  // E2B's SDKs name their default template "base": here that is the default image.
  n.create.image = n.template_id == "base" ? kDefaultImage : n.template_id;
  RETURN_IF_ERROR(ValidateName("templateID", n.create.image));
  ASSIGN_OR_RETURN(n.timeout_s, Seconds(body, "timeout", kDefaultTimeoutS, max_timeout_s, false));
  ASSIGN_OR_RETURN(n.metadata, StringMap(body, "metadata", kMaxMetadataEntries,
                                         kMaxMetadataKeyBytes, kMaxMetadataValueBytes));
  ASSIGN_OR_RETURN(n.env, StringMap(body, "envVars", kMaxEnvEntries, 4096, kMaxEnvValueBytes));
  for (const auto& [k, v] : n.env) {
    if (!IsEnvName(k))
      return InvalidArgument("envVars has " + QuoteForMessage(k) + ", not a variable name");
  }
  RETURN_IF_ERROR(Unsupported(body, "autoPause", false, "a sandbox is destroyed at its timeout"));
  RETURN_IF_ERROR(Unsupported(body, "autoResume", json::object(), "nothing is ever paused"));
  RETURN_IF_ERROR(Unsupported(body, "mcp", json::object(), "no MCP gateway runs in the VM"));
  RETURN_IF_ERROR(Unsupported(body, "volumeMounts", json::array(), "there are no volumes"));
  RETURN_IF_ERROR(Unsupported(body, "iam", json::object(), "there are no workload identities"));
  if (auto auto_resume = body.find("autoResume"); auto_resume != body.end() &&
                                                  auto_resume->is_object() &&
                                                  auto_resume->value("enabled", false)) {
    return InvalidArgument("autoResume is not supported by trybox: nothing is ever paused");
  }
  // The network: trybox's allow-list, never wider. allowOut's names join the VM's
  // allow-list (checked as `--allow` entries are); denyOut's are its deny entries (checked
  // as `--deny` entries are, and winning over any allow); rules and proxies are trybox secrets' and
  // the operator's business (docs/protocol/e2b.md, "Network").
  if (auto net = body.find("network"); net != body.end() && !net->is_null()) {
    if (!net->is_object()) return InvalidArgument("network must be an object");
    if (auto allow = net->find("allowOut"); allow != net->end() && !allow->is_null()) {
      if (!allow->is_array())
        return InvalidArgument("network.allowOut must be an array of strings");
      for (const auto& a : *allow) {
        if (!a.is_string()) return InvalidArgument("network.allowOut must be an array of strings");
        n.create.allow.push_back(a.get<std::string>());
      }
    }
    if (auto deny = net->find("denyOut"); deny != net->end() && !deny->is_null()) {
      if (!deny->is_array()) return InvalidArgument("network.denyOut must be an array of strings");
      for (const auto& d : *deny) {
        if (!d.is_string()) return InvalidArgument("network.denyOut must be an array of strings");
        // An address or CIDR (the SDK's ALL_TRAFFIC is 0.0.0.0/0) adds nothing: the proxy
        // refuses every address given as such, and everything off the allow-list.
        if (IsAddressOrCidr(d.get<std::string>())) continue;
        n.create.deny.push_back(d.get<std::string>());
      }
    }
    RETURN_IF_ERROR(Unsupported(*net, "rules", json::object(),
                                "use trybox secrets for credentials (docs/secrets.md)"));
    RETURN_IF_ERROR(Unsupported(*net, "egressProxy", json::object(),
                                "the VM's only way out is trybox's own proxy"));
    RETURN_IF_ERROR(Unsupported(*net, "maskRequestHost", "", "the VM serves no public URL"));
  }
  // trybox's own fields, under one key of its own: those of the socket's `create` that a
  // sandbox may set (docs/protocol/e2b.md, "Creating a sandbox"), parsed by the same code.
  if (auto tb = body.find("trybox"); tb != body.end() && !tb->is_null()) {
    if (!tb->is_object()) return InvalidArgument("trybox must be an object");
    for (const auto& [key, value] : tb->items()) {
      if (key != "memory_mib" && key != "cpus" && key != "profiles" && key != "secrets") {
        return InvalidArgument("trybox." + key +
                               " is not a field a sandbox takes (memory_mib, cpus, profiles, "
                               "secrets)");
      }
    }
    ASSIGN_OR_RETURN(CreateRequest own, ParseCreate(*tb, "trybox."));
    n.create.memory_mib = own.memory_mib;
    n.create.cpus = own.cpus;
    n.create.profiles = std::move(own.profiles);
    n.create.secrets = std::move(own.secrets);
  }
  return n;
}

// The body of timeout and connect: {"timeout": SECONDS}, required.
Result<int64_t> TimeoutBody(const HttpRequest& req, int64_t max_s) {
  ASSIGN_OR_RETURN(json body, ObjectBody(req));
  return Seconds(body, "timeout", 0, max_s, true);
}

json SandboxJson(const SandboxInfo& s) {
  return {{"templateID", s.template_id},
          {"sandboxID", s.id},
          {"alias", s.template_id},
          {"clientID", "trybox"},
          {"envdVersion", kEnvdVersion},
          {"envdAccessToken", s.access_token},
          {"domain", nullptr}};
}

json ListedJson(const SandboxInfo& s) {
  return {{"templateID", s.template_id},
          {"alias", s.template_id},
          {"sandboxID", s.id},
          {"clientID", "trybox"},
          {"startedAt", Rfc3339(s.started)},
          {"endAt", Rfc3339(EndAt(s.deadline, WallClock::now(), SteadyClock::now()))},
          {"cpuCount", s.cpus},
          {"memoryMB", s.memory_mib},
          {"diskSizeMB", 0},
          {"metadata", s.metadata},
          {"state", "running"},
          {"envdVersion", kEnvdVersion}};
}

}  // namespace

void HttpApi::AddE2bRoutes() {
  router_.Add("POST", "/sandboxes", [this](const HttpRequest& req, const PathParams&) {
    auto body = ObjectBody(req);
    if (!body.ok()) return FromStatus(body.status());
    auto n = ParseNewSandbox(*body, settings_.max_sandbox_timeout_s);
    // Parsed: the values are held in pages of their own, and the body's copies go now.
    if (auto tb = body->find("trybox"); tb != body->end()) WipeSecretValues(&*tb);
    if (!n.ok()) return FromStatus(n.status());
    auto created = vms_.Create(n->create);
    if (!created.ok()) {
      // E2B names an unknown template 404 too; a VM that could not be placed is 503.
      return FromStatus(created.status());
    }
    SandboxInfo s;
    s.id = created->entry->id();
    s.owner = req.principal;
    s.template_id = n->template_id;
    s.metadata = std::move(n->metadata);
    s.env = std::move(n->env);
    s.access_token = RandomHex(20);
    s.started = WallClock::now();
    s.deadline = SteadyClock::now() + std::chrono::seconds(n->timeout_s);
    s.memory_mib = n->create.memory_mib;
    s.cpus = n->create.cpus;
    json reply = SandboxJson(s);
    book_.Add(std::move(s));
    WakeReaper();
    return Reply(201, reply);
  });

  // A booked sandbox whose VM has ended some other way (`trybox rm`, a crash) is dropped
  // from the book when next asked for.
  auto live = [this](const std::optional<SandboxInfo>& s) {
    if (!s) return false;
    if (vms_.Get(s->id).ok()) return true;
    (void)book_.Remove(s->id);
    return false;
  };

  router_.Add("GET", "/sandboxes/{id}", [this, live](const HttpRequest& req, const PathParams& p) {
    auto s = book_.Get(req.principal, p.at("id"));
    if (!live(s)) return JsonError(404, "sandbox " + p.at("id") + " not found");
    json j = ListedJson(*s);
    j["envdAccessToken"] = s->access_token;
    j["domain"] = nullptr;
    return Reply(200, j);
  });

  auto list = [this, live](const HttpRequest& req, bool v2) {
    std::map<std::string, std::string> filter;
    if (auto m = req.query.find("metadata"); m != req.query.end()) {
      auto parsed = ParseMetadataQuery(m->second);
      if (!parsed)
        return JsonError(400, "metadata must be key=value pairs joined by &, URL-encoded");
      filter = std::move(*parsed);
    }
    int64_t limit = kMaxPageLimit;
    std::string after;
    bool want_running = true;
    if (v2) {
      if (auto l = req.query.find("limit"); l != req.query.end()) {
        auto n = ParseBoundedInt(l->second, 1, kMaxPageLimit, "limit");
        if (!n.ok()) return FromStatus(n.status());
        limit = *n;
      }
      if (auto t = req.query.find("nextToken"); t != req.query.end()) after = t->second;
      if (auto st = req.query.find("state"); st != req.query.end()) {
        want_running = false;
        size_t start = 0;
        const std::string& states = st->second;
        while (start <= states.size()) {
          size_t comma = states.find(',', start);
          if (comma == std::string::npos) comma = states.size();
          const std::string one = states.substr(start, comma - start);
          if (one == "running") {
            want_running = true;
          } else if (one != "paused") {
            return JsonError(400, "state must be running or paused, not " + QuoteForMessage(one));
          }
          start = comma + 1;
        }
      }
    }
    json items = json::array();
    SandboxPage page;
    if (want_running) {
      page = book_.List(req.principal, filter, after, limit);
      for (const SandboxInfo& s : page.items) {
        if (live(s)) items.push_back(ListedJson(s));
      }
    }
    HttpResponse r = Reply(200, items);
    if (v2) {
      if (!page.next_token.empty()) r.headers.emplace_back("X-Next-Token", page.next_token);
      r.headers.emplace_back("X-Total-Running", std::to_string(page.total));
    }
    return r;
  };
  router_.Add("GET", "/sandboxes",
              [list](const HttpRequest& req, const PathParams&) { return list(req, false); });
  router_.Add("GET", "/v2/sandboxes",
              [list](const HttpRequest& req, const PathParams&) { return list(req, true); });

  router_.Add("DELETE", "/sandboxes/{id}", [this](const HttpRequest& req, const PathParams& p) {
    const std::string& id = p.at("id");
    if (!book_.Get(req.principal, id)) return JsonError(404, "sandbox " + id + " not found");
    (void)book_.Remove(id);
    WakeReaper();
    auto report = vms_.Destroy(id);
    if (!report.ok())
      return JsonError(404, "sandbox " + id + " not found: " + report.status().message());
    LogInfo("http", "sandbox " + id + " destroyed: killed by key " + req.principal);
    return NoContent();
  });

  router_.Add("POST", "/sandboxes/{id}/timeout",
              [this, live](const HttpRequest& req, const PathParams& p) {
                const std::string& id = p.at("id");
                auto t = TimeoutBody(req, settings_.max_sandbox_timeout_s);
                if (!t.ok()) return FromStatus(t.status());
                if (!live(book_.Get(req.principal, id)) ||
                    !book_.SetEnd(req.principal, id, SteadyClock::now() + std::chrono::seconds(*t),
                                  /*extend_only=*/false)) {
                  return JsonError(404, "sandbox " + id + " not found");
                }
                WakeReaper();
                return NoContent();
              });

  router_.Add("POST", "/sandboxes/{id}/connect",
              [this, live](const HttpRequest& req, const PathParams& p) {
                const std::string& id = p.at("id");
                auto t = TimeoutBody(req, settings_.max_sandbox_timeout_s);
                if (!t.ok()) return FromStatus(t.status());
                auto s = book_.Get(req.principal, id);
                if (!live(s)) return JsonError(404, "sandbox " + id + " not found");
                // Connect only ever extends the end, as E2B's does.
                (void)book_.SetEnd(req.principal, id, SteadyClock::now() + std::chrono::seconds(*t),
                                   /*extend_only=*/true);
                WakeReaper();
                return Reply(200, SandboxJson(*s));
              });
}

}  // namespace trybox::daemon
