// `trybox daemon status|stop|restart|reload` (docs/cli.md, "Managing the daemon"). These
// talk to the daemon without starting one, except `restart`, which starts it again the way
// every other command does when none runs.
#pragma once

#include <CLI/CLI.hpp>
#include <ostream>
#include <string>

#include "cli/cli.h"
#include "util/paths.h"

namespace trybox::cli {

// Registers `daemon` and its four subcommands; each sets inv.command ("daemon-status", ...).
void AddDaemonCommands(CLI::App& app, Invocation& inv);
bool IsDaemonCommand(const std::string& command);
int RunDaemonCommand(const Paths& paths, const Invocation& inv, std::ostream& out,
                     std::ostream& err);

// The text `daemon status` prints for a daemon_status reply.
Result<std::string> RenderDaemonStatus(const nlohmann::json& reply);

}  // namespace trybox::cli
