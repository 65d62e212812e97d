// Where `trybox agent` and `trybox mcp` find the sub-agent's model: flags, then the
// providers' own environment variables, then $config/agent.json (docs/agent.md).
//
// The result is the "model" object of a daemon agent request. It holds the API key, so it
// is sent to the daemon and never printed, logged or written anywhere.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "util/paths.h"
#include "util/status.h"

namespace trybox::cli {

struct ModelFlags {
  std::string provider;  // --provider anthropic|openai; empty: from env/config
  std::string model;     // --model; empty: from env/config
};

// Reads an environment variable; "" when unset. Tests pass their own.
using EnvLookup = std::function<std::string(const std::string&)>;
EnvLookup ProcessEnv();

// {"provider","base_url","api_key","model"} (plus "ca_file" if configured).
//   provider: --provider, else agent.json "provider", else anthropic if ANTHROPIC_API_KEY is
//             set, else openai if OPENAI_API_KEY or OPENAI_BASE_URL is set.
//   base_url, api_key, model: ANTHROPIC_* / OPENAI_* (model: --model first), else the
//             provider's section of agent.json; base_url defaults to the provider's own.
// NOT_FOUND naming what to set when no provider or no model can be found; INVALID_ARGUMENT
// for an unknown provider or a malformed agent.json (whose message never quotes a key).
// Whether $config/agent.json (if present) is well-formed; the message never quotes a key.
Status CheckAgentConfig(const Paths& paths);

Result<nlohmann::json> ResolveModel(const Paths& paths, const ModelFlags& flags,
                                    const EnvLookup& env);

// The image `trybox agent` boots when --image is not given.
// The developer image (images/debian-12-dev.json), built on first use.
inline constexpr const char* kDefaultAgentImage = "debian-12-dev";

// --image if given, else agent.json "image", else kDefaultAgentImage; a valid image name.
Result<std::string> ResolveAgentImage(const Paths& paths, const std::string& flag);

// Whether an agent run's VM gets internet mode (docs/protocol/egress.md, "Policy"):
// --internet / --no-internet if given, else agent.json "internet", else false (the
// allow-list).
Result<bool> ResolveAgentInternet(const Paths& paths, std::optional<bool> flag);

}  // namespace trybox::cli
