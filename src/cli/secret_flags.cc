#include "cli/secret_flags.h"

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "egress/allowlist.h"
#include "util/fd.h"
#include "util/names.h"

namespace trybox::cli {
namespace {

using Json = nlohmann::json;

constexpr char kUsage[] =
    "--secret takes NAME=SOURCE@HOST[,HOST...][+target] (SOURCE: env:VAR or file:PATH; "
    "+target: put the value into request paths and queries too), or the NAME of a secret in "
    "secrets.json";

Status CheckName(const std::string& name) {
  bool ok = !name.empty() && !(name[0] >= '0' && name[0] <= '9') &&
            std::all_of(name.begin(), name.end(), [](char c) {
              return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                     (c >= '0' && c <= '9');
            });
  if (ok) return Status::Ok();
  return InvalidArgument("secret name " + QuoteForMessage(name) +
                         " is not a valid environment variable name");
}

Status CheckSource(const std::string& name, const std::string& source) {
  bool env = source.rfind("env:", 0) == 0, file = source.rfind("file:", 0) == 0;
  if ((env && source.size() > 4) || (file && source.size() > 5)) return Status::Ok();
  return InvalidArgument("secret " + name + ": the source must be env:VAR or file:PATH");
}

Status CheckHost(const std::string& name, const std::string& host) {
  auto e = egress::ParseAllowEntry(host);
  if (!e.ok()) return InvalidArgument("secret " + name + ": " + e.status().message());
  if (host.find(':') != std::string::npos) {
    return InvalidArgument("secret " + name + ": " + QuoteForMessage(host) +
                           " has a port; a secret is bound to host names only");
  }
  return Status::Ok();
}

Result<std::string> ReadValue(const std::string& name, const std::string& source) {
  if (source.rfind("env:", 0) == 0) {
    const char* v = std::getenv(source.substr(4).c_str());
    if (v == nullptr) {
      return NotFound("secret " + name + ": the variable " + source.substr(4) +
                      " is not set in this environment");
    }
    return std::string(v);
  }
  auto v = ReadFileToString(source.substr(5));
  if (!v.ok()) return v.status().Annotate("secret " + name + ": read " + source);
  std::string value = std::move(*v);
  if (!value.empty() && value.back() == '\n') value.pop_back();
  if (!value.empty() && value.back() == '\r') value.pop_back();
  return value;
}

// secrets.json: {"NAME": {"source": "env:VAR", "hosts": ["api.example.com"],
// "body": false, "keep_cookies": false, "target": false}}. Every entry is checked, so a mistake is
// found the first time any secret is used.
Result<Json> ReadNamedSecrets(const Paths& paths) {
  const std::string path = paths.config + "/secrets.json";
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    if (text.status().code() == Code::kNotFound) return Json::object();
    return text.status().Annotate("read " + path);
  }
  Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument(path + ": must be a JSON object of named secrets");
  for (const auto& [name, e] : j.items()) {
    RETURN_IF_ERROR(CheckName(name).Annotate(path));
    if (!e.is_object()) return InvalidArgument(path + ": " + name + " must be an object");
    for (const auto& [key, v] : e.items()) {
      bool flag = key == "body" || key == "keep_cookies" || key == "target";
      bool known = key == "source" || key == "hosts" || flag;
      if (!known) return InvalidArgument(path + ": " + name + ": unknown key '" + key + "'");
      if (flag && !v.is_boolean()) {
        return InvalidArgument(path + ": " + name + "." + key + " must be true or false");
      }
    }
    if (!e.contains("source") || !e["source"].is_string()) {
      return InvalidArgument(path + ": " + name + ".source must be env:VAR or file:PATH");
    }
    RETURN_IF_ERROR(CheckSource(name, e["source"].get<std::string>()).Annotate(path));
    if (!e.contains("hosts") || !e["hosts"].is_array() || e["hosts"].empty()) {
      return InvalidArgument(path + ": " + name + ".hosts must be a non-empty array of hosts");
    }
    for (const auto& h : e["hosts"]) {
      if (!h.is_string()) return InvalidArgument(path + ": " + name + ".hosts must be strings");
      RETURN_IF_ERROR(CheckHost(name, h.get<std::string>()).Annotate(path));
    }
  }
  return j;
}

}  // namespace

Result<SecretFlag> ParseSecretFlag(const std::string& text) {
  SecretFlag f;
  size_t eq = text.find('=');
  if (eq == std::string::npos) {
    f.name = text;
    RETURN_IF_ERROR(CheckName(f.name));
    return f;
  }
  size_t at = text.rfind('@');
  if (eq == 0 || at == std::string::npos || at < eq) return InvalidArgument(kUsage);
  f.name = text.substr(0, eq);
  RETURN_IF_ERROR(CheckName(f.name));
  f.source = text.substr(eq + 1, at - eq - 1);
  RETURN_IF_ERROR(CheckSource(f.name, f.source));
  std::string hosts = text.substr(at + 1);
  static constexpr std::string_view kTarget = "+target";
  if (hosts.size() > kTarget.size() &&
      hosts.compare(hosts.size() - kTarget.size(), kTarget.size(), kTarget) == 0) {
    f.target = true;
    hosts.resize(hosts.size() - kTarget.size());
  }
  for (size_t i = 0; i <= hosts.size();) {
    size_t comma = std::min(hosts.find(',', i), hosts.size());
    std::string h = hosts.substr(i, comma - i);
    RETURN_IF_ERROR(CheckHost(f.name, h));
    f.hosts.push_back(h);
    i = comma + 1;
  }
  return f;
}

Result<Json> ResolveSecrets(const Paths& paths, const std::vector<std::string>& flags) {
  Json out = Json::array();
  std::optional<Json> named;
  for (const auto& text : flags) {
    ASSIGN_OR_RETURN(SecretFlag f, ParseSecretFlag(text));
    Json entry = {{"name", f.name}};
    if (f.source.empty()) {
      if (!named) {
        ASSIGN_OR_RETURN(named, ReadNamedSecrets(paths));
      }
      if (!named->contains(f.name)) {
        return NotFound("no secret named " + f.name + " in " + paths.config +
                        "/secrets.json; declare it there, or give NAME=SOURCE@HOST");
      }
      const Json& e = (*named)[f.name];
      f.source = e["source"].get<std::string>();
      entry["hosts"] = e["hosts"];
      entry["body"] = e.value("body", false);
      entry["keep_cookies"] = e.value("keep_cookies", false);
      entry["target"] = e.value("target", false);
    } else {
      entry["hosts"] = f.hosts;
      entry["target"] = f.target;
    }
    ASSIGN_OR_RETURN(std::string value, ReadValue(f.name, f.source));
    entry["value"] = std::move(value);
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace trybox::cli
