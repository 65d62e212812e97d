// The trybox command line: parsing (CLI11) and the commands, docker conventions.
//
// Exit codes for run/exec: the command's own code; 128+N when signal N killed it; 124 when
// it timed out; 125 when trybox itself failed (including a lost guest); 126 when the command
// could not be invoked; 127 when it was not found.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/agent_settings.h"
#include "cli/http_cmd.h"
#include "util/status.h"

namespace trybox::cli {

class Client;

// The bounds of the numeric flags. Each is parsed as a 64-bit value and refused outside
// its range, naming the flag and the range, before anything is sent.
inline constexpr int64_t kMinMemoryMib = 128;  // --memory: as tryboxd's create
inline constexpr int64_t kMaxMemoryMib = 65536;
inline constexpr int64_t kMaxCpus = 64;                             // --cpus: 1 to 64
inline constexpr int64_t kMaxExecTimeoutMs = 7 * 24 * 3600 * 1000;  // run/exec --timeout: 7 days
inline constexpr int64_t kMaxAgentWallClockS = 86400;  // agent --timeout: a day, as tryboxd
inline constexpr int64_t kMaxAgentTurns = 1000;        // agent --max-turns
inline constexpr int64_t kMinAgentTokens = 1000;       // agent --max-tokens
inline constexpr int64_t kMaxAgentTokens = int64_t{1} << 40;
inline constexpr int64_t kMaxAuditRows = 1000000;                // audit --limit
inline constexpr uint64_t kMaxWorkspaceQuotaBytes = 1ull << 40;  // --workspace-quota: 1 TiB

struct VmOptions {
  std::string image = "debian-12";
  int64_t memory_mib = 512;
  int64_t cpus = 1;
  bool cold = false;                    // boot instead of restoring from the template
  bool privileged = false;              // commands keep every capability (docs/security.md)
  bool internet = false;                // --internet: any public host, any port
  std::optional<bool> agent_internet;   // agent: --internet / --no-internet, else agent.json
  std::vector<std::string> allow;       // egress allow-list entries HOST[:PORT], validated
  std::vector<std::string> profiles;    // named allow-lists from the daemon's egress.json
  std::vector<std::string> deny;        // --deny HOST[:PORT], validated; wins in either mode
  std::vector<std::string> secrets;     // --secret NAME=SOURCE@HOST[,HOST...], syntax checked
  std::vector<std::string> http_rules;  // --http-rule 'ACTION METHODS HOST[/PATH]'
  std::string workspace;                // --workspace DIR: a git working tree copied to /workspace
  std::string workspace_quota;          // --workspace-quota SIZE (default: the daemon's, 1 GiB)
  uint64_t quota_bytes = 0;             // parsed; 0 = the daemon's default
  std::string workspace_quota_entries;  // --workspace-quota-entries N
  int64_t quota_entries = 0;            // parsed; 0 = the daemon's default
};

struct ExecOptions {
  std::vector<std::string> env;  // K=V, validated
  std::string workdir;
  int64_t timeout_ms = 0;    // 0: none; --timeout SECONDS (fractions rounded up to 1 ms)
  bool interactive = false;  // forward our stdin
  bool tty = false;          // -t: on a pseudo-terminal in the guest (cli/terminal.h)
  bool detach = false;       // -d: start it, print its exec id, return
};

// shell, logs, ps, kill, port (cli/terminal.h).
struct TerminalOptions {
  int64_t exec_id = 0;          // logs, kill
  bool follow = false;          // logs --follow
  int64_t offset = 0;           // logs --offset
  bool stderr = false;          // logs --stderr
  std::string signal = "KILL";  // kill --signal
  int guest_port = 0;           // port
  std::string host;             // port --host ADDR:PORT ("" = 127.0.0.1:guest_port)
  bool allow_remote = false;    // port --allow-remote
};

// trybox agent (docs/agent.md).
struct AgentOptions {
  std::string task;
  std::string verify;
  std::string run_id;  // answer, resume, show
  std::string answer;
  std::string decision;      // answer: "approve", "deny" (a request_network) or ""
  int64_t max_turns = 0;     // 0: the daemon's default
  int64_t wall_clock_s = 0;  // --timeout, rounded up to whole seconds; 0: the daemon's default
  int64_t max_tokens = 0;    // 0: the daemon's default
  bool follow = false;       // show --follow
  std::string image;         // --image; "" = agent.json "image", else kDefaultAgentImage
};

struct Invocation {
  // run create exec cp rm ls collect diff image-build image-ls doctor audit mcp help version
  std::string command;
  VmOptions vm;
  ExecOptions exec;
  AgentOptions agent;             // agent, agent-answer, agent-resume, agent-show
  std::vector<std::string> argv;  // run/exec
  std::string id;                 // exec, collect, diff; audit --vm
  std::string into;               // collect --into
  bool no_commit = false;         // collect --no-commit
  int64_t limit = 1000;           // audit
  std::vector<std::string> ids;   // rm
  std::string src, dst;           // cp
  bool json = false;
  bool quiet = false;                    // run, create, image build: no progress on stderr
  bool probe = false;                    // doctor --probe
  bool dry_run = false;                  // prune --dry-run, image prune --dry-run
  bool all = false;                      // image prune --all
  std::string image_name = "debian-12";  // image build
  bool rebuild_rootfs = false;
  std::string recipe_file;         // image build -f RECIPE (cli/image_recipe.h)
  std::string help;                // command == "help" or "version": the text to print
  ModelFlags model;                // agent, mcp: --provider, --model
  std::string mcp_tools;           // mcp --tools: comma-separated names, "" for all
  std::vector<std::string> tools;  // mcp: the tools chosen, in listing order
  TerminalOptions term;
  HttpOptions http;  // serve, api-key
};

// Parses argv (including argv[0]). Errors carry CLI11's message.
Result<Invocation> Parse(const std::vector<std::string>& args);

// K=V with K a valid environment name.
Status ValidateEnvAssignment(const std::string& kv);

// -e K=V entries (validated) as an exec request's "env" object.
nlohmann::json EnvObject(const std::vector<std::string>& env);

// The exit code for an exec result body from tryboxd, and a message for stderr (may be "").
// A malformed result is 125 with a message naming the field.
int ExitCodeFor(const nlohmann::json& result, std::string* message);

// Whether progress goes to stderr: not with --quiet; otherwise only when stderr is a
// terminal, unless TRYBOX_PROGRESS is "always" (or "never").
bool ShowProgress(bool quiet);

// Runs a parsed invocation; returns the process exit code.
int Run(const Invocation& inv);

// Runs a command that talks to tryboxd over `client` (everything but help, version, image
// and mcp): its output goes to `out`, its messages to `err`, except an exec's own output,
// which goes to file descriptors 1 and 2 as it arrives. A malformed reply is exit code 125
// with a message naming the field, never an exception.
int RunWithClient(Client& client, const Invocation& inv, std::ostream& out, std::ostream& err);

// Paged replies (docs/protocol/daemon.md): every page of `audit` (the newest `limit` rows,
// oldest first) and the newest collect of `vm` with every page of its `changes`. A daemon
// that does not page answers in one reply, which is taken as it is.
Result<nlohmann::json> FetchAudit(Client& client, const std::string& vm, int64_t limit);
Result<nlohmann::json> FetchDiff(Client& client, const std::string& vm);

}  // namespace trybox::cli
