#include "cli/agent_settings.h"

#include <cstdlib>
#include <set>

#include "util/fd.h"
#include "util/names.h"

namespace trybox::cli {
namespace {

using Json = nlohmann::json;

const char* DefaultBaseUrl(const std::string& provider) {
  return provider == "anthropic" ? "https://api.anthropic.com" : "https://api.openai.com/v1";
}

std::string EnvPrefix(const std::string& provider) {
  return provider == "anthropic" ? "ANTHROPIC_" : "OPENAI_";
}

// $config/agent.json: {"provider": "...", "anthropic": {"base_url","api_key","model",
// "ca_file"}, "openai": {...}}. Missing is fine; anything else malformed is an error.
Result<Json> ReadConfig(const Paths& paths) {
  std::string path = paths.config + "/agent.json";
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    if (text.status().code() == Code::kNotFound) return Json::object();
    return text.status();
  }
  Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument(path + " is not a JSON object");
  static const std::set<std::string> kTop = {"provider", "anthropic", "openai", "image",
                                             "internet"};
  static const std::set<std::string> kSection = {"base_url", "api_key", "model", "ca_file"};
  for (auto& [key, value] : j.items()) {
    if (!kTop.count(key)) return InvalidArgument(path + ": unknown key '" + key + "'");
    if (key == "internet") {
      if (!value.is_boolean()) return InvalidArgument(path + ": internet must be true or false");
      continue;
    }
    if (key == "provider" || key == "image") {
      if (!value.is_string()) return InvalidArgument(path + ": " + key + " must be a string");
      continue;
    }
    if (!value.is_object()) return InvalidArgument(path + ": " + key + " must be an object");
    for (auto& [k, v] : value.items()) {
      if (!kSection.count(k)) {
        return InvalidArgument(path + ": unknown key '" + key + "." + k + "'");
      }
      // The value is never quoted: it may be a key.
      if (!v.is_string()) return InvalidArgument(path + ": " + key + "." + k + " must be a string");
    }
  }
  return j;
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const std::string& name) {
    const char* v = std::getenv(name.c_str());
    return std::string(v ? v : "");
  };
}

Status CheckAgentConfig(const Paths& paths) { return ReadConfig(paths).status(); }

Result<Json> ResolveModel(const Paths& paths, const ModelFlags& flags, const EnvLookup& env) {
  ASSIGN_OR_RETURN(Json config, ReadConfig(paths));
  std::string provider = flags.provider;
  if (provider.empty()) provider = config.value("provider", "");
  if (provider.empty()) {
    if (!env("ANTHROPIC_API_KEY").empty()) {
      provider = "anthropic";
    } else if (!env("OPENAI_API_KEY").empty() || !env("OPENAI_BASE_URL").empty()) {
      provider = "openai";
    }
  }
  if (provider.empty()) {
    return NotFound(
        "no model provider is configured: set ANTHROPIC_API_KEY (Anthropic) or OPENAI_BASE_URL "
        "/ OPENAI_API_KEY (OpenAI-compatible, e.g. Ollama), or pass --provider");
  }
  if (provider != "anthropic" && provider != "openai") {
    return InvalidArgument("unknown model provider '" + provider +
                           "': expected anthropic or openai");
  }
  const std::string prefix = EnvPrefix(provider);
  Json section = config.value(provider, Json::object());
  // The flag, else the provider's environment variable, else the config file.
  auto pick = [&](const std::string& flag, const std::string& var, const std::string& key) {
    if (!flag.empty()) return flag;
    std::string v = env(prefix + var);
    return v.empty() ? section.value(key, std::string()) : v;
  };
  Json m = {{"provider", provider},
            {"base_url", pick("", "BASE_URL", "base_url")},
            {"api_key", pick("", "API_KEY", "api_key")},
            {"model", pick(flags.model, "MODEL", "model")}};
  if (m["base_url"].get<std::string>().empty()) m["base_url"] = DefaultBaseUrl(provider);
  if (m["model"].get<std::string>().empty()) {
    return NotFound("no model is configured for provider " + provider + ": set " + prefix +
                    "MODEL, pass --model, or name one in " + paths.config + "/agent.json");
  }
  if (section.contains("ca_file")) m["ca_file"] = section["ca_file"];
  return m;
}

Result<std::string> ResolveAgentImage(const Paths& paths, const std::string& flag) {
  std::string image = flag;
  if (image.empty()) {
    ASSIGN_OR_RETURN(Json config, ReadConfig(paths));
    image = config.value("image", std::string(kDefaultAgentImage));
  }
  RETURN_IF_ERROR(ValidateName("image name", image));
  return image;
}

Result<bool> ResolveAgentInternet(const Paths& paths, std::optional<bool> flag) {
  if (flag) return *flag;
  ASSIGN_OR_RETURN(Json config, ReadConfig(paths));
  return config.value("internet", false);
}

}  // namespace trybox::cli
