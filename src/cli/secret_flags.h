// Secrets as the CLI and the MCP server declare them (docs/secrets.md): `--secret` flags and
// the named secrets of $TRYBOX_CONFIG/secrets.json, resolved into the create request's
// "secrets" array. The CLI reads each value from its source; the daemon never reads a
// caller's environment or files for it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/paths.h"
#include "util/status.h"

namespace trybox::cli {

// One --secret: `NAME=SOURCE@HOST[,HOST...][+target]`, or `NAME` alone for a named secret of
// secrets.json. `+target` puts the value into request targets (path and query) as well as
// headers. SOURCE is env:VAR (this process's environment) or file:PATH (one trailing
// newline dropped). Only the syntax is checked here; no value is read.
struct SecretFlag {
  std::string name;
  std::string source;              // "" for a named secret
  std::vector<std::string> hosts;  // empty for a named secret
  bool target = false;             // "+target"
};
Result<SecretFlag> ParseSecretFlag(const std::string& text);

// The create request's "secrets" array for `flags`: each value read from its source, named
// secrets looked up in `paths.config`/secrets.json. Errors name the secret and its source,
// never a value.
Result<nlohmann::json> ResolveSecrets(const Paths& paths, const std::vector<std::string>& flags);

}  // namespace trybox::cli
