#include "egress/config.h"

#include <algorithm>
#include <map>
#include <set>

#include "egress/proxy.h"
#include "util/fd.h"
#include "util/names.h"

namespace trybox::egress {

namespace {

// "allow *.pythonhosted.org", "deny evil.test:22", "ask *": an action, then `*` or a host
// pattern as `--deny` takes it (no port: every port).
Result<RequestRule> ParseRequestRule(const nlohmann::json& j) {
  if (!j.is_string()) {
    return InvalidArgument("a rule is a string: \"allow|ask|deny HOST[:PORT]\" or \"... *\"");
  }
  const std::string text = j.get<std::string>();
  RequestRule r;
  r.text = text;
  const size_t space = text.find(' ');
  const std::string action = text.substr(0, space);
  if (action == "allow") {
    r.action = RequestRule::Action::kAllow;
  } else if (action == "deny") {
    r.action = RequestRule::Action::kDeny;
  } else if (action == "ask") {
    r.action = RequestRule::Action::kAsk;
  } else {
    return InvalidArgument("'" + text + "': a rule starts with allow, ask or deny");
  }
  if (space == std::string::npos || space + 1 >= text.size()) {
    return InvalidArgument("'" + text + "': name a host pattern or * after " + action);
  }
  const std::string host = text.substr(space + 1);
  if (host == "*") {
    r.any_host = true;
    return r;
  }
  ASSIGN_OR_RETURN(r.pattern, ParseDenyEntry(host));
  return r;
}

const char* TypeName(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number with a fraction";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Each key's JSON type, checked before any is read: a wrong one is named with the type it
// must be, never as a JSON library's exception.
Status CheckTypes(const nlohmann::json& j) {
  enum Want { kObject, kInteger, kBool, kString, kStringArray, kArray };
  static const std::map<std::string, Want> kTypes = {{"profiles", kObject},
                                                     {"max_tunnels_per_vm", kInteger},
                                                     {"head_timeout_ms", kInteger},
                                                     {"connect_timeout_ms", kInteger},
                                                     {"internal_allow", kStringArray},
                                                     {"resolve", kObject},
                                                     {"qemu_netns", kBool},
                                                     {"qemu_drop_uid", kBool},
                                                     {"qemu_uid_base", kInteger},
                                                     {"audit_max_age_days", kInteger},
                                                     {"audit_max_rows", kInteger},
                                                     {"upstream_ca_file", kString},
                                                     {"network_requests", kArray},
                                                     {"model_route", kString}};
  auto strings = [](const nlohmann::json& v) {
    if (!v.is_array()) return false;
    for (const auto& e : v) {
      if (!e.is_string()) return false;
    }
    return true;
  };
  for (const auto& [key, want] : kTypes) {
    auto it = j.find(key);
    if (it == j.end()) continue;
    const nlohmann::json& v = *it;
    bool ok = false;
    const char* name = "";
    switch (want) {
      case kObject:
        ok = v.is_object();
        name = "an object";
        break;
      case kInteger:
        ok = v.is_number_integer();
        name = "an integer";
        break;
      case kBool:
        ok = v.is_boolean();
        name = "true or false";
        break;
      case kString:
        ok = v.is_string();
        name = "a string";
        break;
      case kStringArray:
        ok = strings(v);
        name = "an array of strings";
        break;
      case kArray:
        ok = v.is_array();
        name = "an array";
        break;
    }
    if (!ok) {
      return InvalidArgument("egress config: '" + key + "' must be " + name + ", not " +
                             (want == kStringArray && v.is_array() ? std::string("an array with "
                                                                                 "other values")
                                                                   : std::string(TypeName(v))));
    }
  }
  if (auto p = j.find("profiles"); p != j.end()) {
    for (const auto& [name, entries] : p->items()) {
      if (!strings(entries)) {
        return InvalidArgument("egress config: 'profiles." + name +
                               "' must be an array of strings (allow entries), not " +
                               (entries.is_array() ? std::string("an array with other values")
                                                   : std::string(TypeName(entries))));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<Config> ParseConfig(const nlohmann::json& j) {
  Config c;
  if (!j.is_object()) return InvalidArgument("egress config must be a JSON object");
  static const std::set<std::string> kKeys = {
      "profiles",           "max_tunnels_per_vm", "head_timeout_ms",
      "connect_timeout_ms", "internal_allow",     "resolve",
      "qemu_netns",         "qemu_drop_uid",      "qemu_uid_base",
      "audit_max_age_days", "audit_max_rows",     "upstream_ca_file",
      "network_requests",   "model_route"};
  for (const auto& [key, value] : j.items()) {
    if (!kKeys.count(key)) return InvalidArgument("egress config: unknown key '" + key + "'");
  }
  RETURN_IF_ERROR(CheckTypes(j));
  try {
    if (j.contains("profiles")) {
      for (const auto& [name, entries] : j.at("profiles").items()) {
        RETURN_IF_ERROR(ValidateName("profile name", name));
        std::vector<std::string> list = entries.get<std::vector<std::string>>();
        auto parsed = AllowList::Parse(list);
        if (!parsed.ok()) return parsed.status().Annotate("egress config: profile " + name);
        c.profiles[name] = list;
      }
    }
    c.max_tunnels_per_vm = j.value("max_tunnels_per_vm", c.max_tunnels_per_vm);
    if (c.max_tunnels_per_vm < 1) {
      return InvalidArgument("egress config: max_tunnels_per_vm must be at least 1");
    }
    c.head_timeout = std::chrono::milliseconds(j.value("head_timeout_ms", int64_t{10000}));
    c.connect_timeout = std::chrono::milliseconds(j.value("connect_timeout_ms", int64_t{10000}));
    if (c.head_timeout.count() <= 0 || c.connect_timeout.count() <= 0) {
      return InvalidArgument("egress config: timeouts must be positive");
    }
    for (const auto& text : j.value("internal_allow", std::vector<std::string>{})) {
      auto o = AddressOverride::Parse(text);
      if (!o.ok()) return o.status().Annotate("egress config: internal_allow");
      c.internal_allow.push_back(*o);
    }
    if (j.contains("resolve")) {
      auto r = MapResolver::FromJson(j.at("resolve"));
      if (!r.ok()) return r.status().Annotate("egress config");
      c.resolve = j.at("resolve");
    }
    c.qemu_netns = j.value("qemu_netns", true);
    c.qemu_drop_uid = j.value("qemu_drop_uid", true);
    c.qemu_uid_base = j.value("qemu_uid_base", c.qemu_uid_base);
    int64_t days = j.value("audit_max_age_days", int64_t{30});
    c.audit_max_rows = j.value("audit_max_rows", c.audit_max_rows);
    if (days < 0 || c.audit_max_rows < 0) {
      return InvalidArgument(
          "egress config: audit_max_age_days and audit_max_rows must not be "
          "negative (0 keeps everything)");
    }
    c.audit_max_age = std::chrono::seconds(days * 86400);
    c.upstream_ca_file = j.value("upstream_ca_file", std::string());
    if (!c.upstream_ca_file.empty() && c.upstream_ca_file[0] != '/') {
      return InvalidArgument("egress config: upstream_ca_file must be an absolute path");
    }
    if (j.contains("model_route")) {
      auto o = AddressOverride::Parse(j.at("model_route").get<std::string>());
      if (!o.ok()) return o.status().Annotate("egress config: model_route");
      c.model_route = *o;
    }
    if (j.contains("network_requests")) {
      const auto& rules = j.at("network_requests");
      if (!rules.is_array()) {
        return InvalidArgument("egress config: network_requests must be an array of rules");
      }
      for (size_t i = 0; i < rules.size(); ++i) {
        auto rule = ParseRequestRule(rules[i]);
        if (!rule.ok()) {
          return rule.status().Annotate("egress config: network_requests[" + std::to_string(i) +
                                        "]");
        }
        c.network_requests.push_back(std::move(*rule));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    // CheckTypes covers every key; what is left is said without the library's prefix.
    std::string what = e.what();
    if (size_t at = what.find("] "); what.rfind("[json.exception.", 0) == 0 && at != what.npos) {
      what = what.substr(at + 2);
    }
    return InvalidArgument("egress config: " + what);
  }
  return c;
}

bool RequestRule::Matches(const std::string& host, int port) const {
  return any_host || pattern.Covers(host, port);
}

const RequestRule* MatchRequest(const std::vector<RequestRule>& rules, const std::string& host,
                                int port, size_t* index) {
  for (size_t i = 0; i < rules.size(); ++i) {
    if (rules[i].Matches(host, port)) {
      if (index) *index = i;
      return &rules[i];
    }
  }
  return nullptr;
}

Result<nlohmann::json> LoadConfigJson(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    if (text.status().code() == Code::kNotFound) return nlohmann::json::object();
    return text.status();
  }
  try {
    return nlohmann::json::parse(*text);
  } catch (const nlohmann::json::parse_error& e) {
    // Where it broke, as line and column (1-based) of the byte the parser stopped at.
    const size_t at = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text->size());
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at; ++i) {
      if ((*text)[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string what = e.what();
    if (size_t s = what.find("syntax error"); s != what.npos) {
      what = what.substr(s);
    } else if (size_t c = what.find(": "); c != what.npos) {
      what = what.substr(c + 2);
    }
    return InvalidArgument(path + ": not valid JSON at line " + std::to_string(line) + ", column " +
                           std::to_string(column) + ": " + what);
  }
}

Result<Config> LoadConfig(const std::string& path) {
  ASSIGN_OR_RETURN(nlohmann::json j, LoadConfigJson(path));
  auto c = ParseConfig(j);
  if (!c.ok()) return c.status().Annotate(path);
  return c;
}

std::vector<std::string> ConfigChanges(const nlohmann::json& before, const nlohmann::json& after) {
  static const nlohmann::json kNull;
  auto member = [](const nlohmann::json& j, const std::string& key) -> const nlohmann::json& {
    return j.is_object() && j.contains(key) ? j[key] : kNull;
  };
  std::set<std::string> keys;
  for (const auto* j : {&before, &after}) {
    if (!j->is_object()) continue;
    for (auto it = j->begin(); it != j->end(); ++it) keys.insert(it.key());
  }
  std::set<std::string> out;
  for (const auto& key : keys) {
    const auto& a = member(before, key);
    const auto& b = member(after, key);
    if (a == b) continue;
    if (key != "profiles" || !(a.is_object() || a.is_null()) || !(b.is_object() || b.is_null())) {
      out.insert(key);
      continue;
    }
    std::set<std::string> names;
    for (const auto* p : {&a, &b}) {
      if (!p->is_object()) continue;
      for (auto it = p->begin(); it != p->end(); ++it) names.insert(it.key());
    }
    for (const auto& name : names) {
      if (member(a, name) != member(b, name)) out.insert("profiles." + name);
    }
  }
  return {out.begin(), out.end()};
}

bool NeedsRestart(const std::string& changed_key) {
  return changed_key == "qemu_netns" || changed_key == "qemu_drop_uid" ||
         changed_key == "qemu_uid_base";
}

}  // namespace trybox::egress
