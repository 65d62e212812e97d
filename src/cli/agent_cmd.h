// `trybox agent`: hands a task to the daemon's vm_agent loop and prints its report.
#pragma once

#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/client.h"

namespace trybox::cli {

// Exit codes of `trybox agent` (docs/agent.md).
constexpr int kAgentVerified = 0;
constexpr int kAgentFailedVerification = 1;
constexpr int kAgentUnverified = 2;
constexpr int kAgentNeedsInput = 3;
constexpr int kAgentInProgress = 4;
constexpr int kAgentError = 5;
constexpr int kAgentCancelled = 130;  // as a command stopped by Ctrl-C

// Runs an agent verb (`request` names it) and returns its END body, passing each EVENT to
// `on_event` as it arrives; an error from `on_event` (a malformed event) resets the stream
// and is returned. An error END is returned as a Status.
Result<nlohmann::json> CallAgentVerb(Client& client, const nlohmann::json& request,
                                     const std::function<Status(const nlohmann::json&)>& on_event);

// The exit code for a report (kAgentError for one without a string `outcome`).
int AgentExitCode(const nlohmann::json& report);

// The report to `out` (text, or JSON with --json), progress to `err`. Ctrl-C (SIGINT) or
// SIGTERM during a run cancels it (agent_cancel) and prints the cancelled report.
int CmdAgent(Client& client, const Invocation& inv, std::ostream& out, std::ostream& err);

}  // namespace trybox::cli
