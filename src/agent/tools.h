// The sub-agent's tools: their specs as the model sees them, and strict parsing of the
// arguments a model sends. Every tool acts only inside the run's VM; the daemon carries
// them out (daemon/agent_runs.cc). Parsing never throws: a malformed call becomes an error
// message for the model, and the run goes on.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "agent/model.h"

namespace trybox::agent {

// Caps (docs/agent.md). Tool results are capped and the cut is marked in the text.
constexpr size_t kMaxToolResultBytes = 16 * 1024;
constexpr size_t kMaxReadBytes = 64 * 1024;
constexpr size_t kMaxWriteBytes = 1024 * 1024;
constexpr size_t kMaxSummaryChars = 4000;
constexpr size_t kMaxQuestionChars = 2000;
constexpr int kDefaultRunTimeoutS = 120;
constexpr int kMaxRunTimeoutS = 1800;
constexpr size_t kMaxListEntries = 500;

struct RunArgs {
  std::string command;  // a shell command line, run as /bin/sh -c COMMAND
  int timeout_s = kDefaultRunTimeoutS;
};
struct WriteArgs {
  std::string path;  // relative paths are under /workspace
  std::string content;
  int mode = 0644;
};
struct ReadArgs {
  std::string path;
  int64_t max_bytes = kMaxReadBytes;
};
struct ListArgs {
  std::string path;
};
struct AskArgs {
  std::string question;
};
struct FinishArgs {
  std::string summary;
  std::string verify_command;  // may be empty
};
constexpr size_t kMaxNetworkReasonChars = 500;
struct NetworkArgs {  // request_network
  std::string host;   // as the model wrote it; the daemon checks it as an --allow entry
  int port = 443;
  std::string reason;  // the agent's words, capped
};
using ToolArgs =
    std::variant<RunArgs, WriteArgs, ReadArgs, ListArgs, AskArgs, FinishArgs, NetworkArgs>;

// The tool list sent to the model.
const std::vector<ToolSpec>& AgentTools();

// What the prompt says about the VM's image (image::DescribeImage).
struct ImageFacts {
  std::string name;                     // "debian-12-dev"; "" = unknown
  std::string distribution = "Debian";  // "Debian 12 (bookworm)"
  std::vector<std::string> checks;      // commands known to pass in it (its recipe's checks)
};

// The system prompt: what the sub-agent is, where it works, what each tool does.
std::string SystemPrompt(const ImageFacts& image = {});

// The typed arguments of `call`, or an INVALID_ARGUMENT whose message is written for the
// model ("run: 'command' must be a non-empty string").
Result<ToolArgs> ParseToolCall(const ToolCall& call);

// An absolute guest path for a tool's `path`: relative to /workspace, normalised lexically;
// INVALID_ARGUMENT for an empty path or a NUL byte.
Result<std::string> GuestPath(const std::string& path);

}  // namespace trybox::agent
