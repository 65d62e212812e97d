// `trybox serve` and `trybox api-key` (docs/protocol/http.md): start or stop the daemon's
// HTTP API, and make, list and remove its keys.
#pragma once

#include <CLI/CLI.hpp>
#include <iosfwd>
#include <string>

#include "cli/client.h"

namespace trybox::cli {

struct HttpOptions {
  std::string listen = "127.0.0.1:0";
  bool stop = false;
  std::string key_name;
  bool key_operator = false;  // api-key create --operator
};

struct Invocation;
void AddHttpCommands(CLI::App& app, Invocation& inv);
bool IsHttpCommand(const std::string& command);  // serve, api-key-*
int RunHttpCommand(Client& client, const Invocation& inv, std::ostream& out, std::ostream& err);

}  // namespace trybox::cli
