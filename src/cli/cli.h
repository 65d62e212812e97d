// The trybox command line: parsing (CLI11) and the commands, docker conventions.
//
// Exit codes for run/exec: the command's own code; 128+N when signal N killed it; 124 when
// it timed out; 125 when trybox itself failed (including a lost guest); 126 when the command
// could not be invoked; 127 when it was not found.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/agent_settings.h"
#include "util/status.h"

namespace trybox::cli {

struct VmOptions {
  std::string image = "debian-12";
  int memory_mib = 512;
  int cpus = 1;
  bool cold = false;                  // boot instead of restoring from the template
  bool privileged = false;            // commands keep every capability (docs/security.md)
  std::vector<std::string> allow;     // egress allow-list entries HOST[:PORT], validated
  std::vector<std::string> profiles;  // named allow-lists from the daemon's egress.json
  std::string workspace;              // --workspace DIR: a git working tree copied to /workspace
  std::string workspace_quota;        // --workspace-quota SIZE (default: the daemon's, 1 GiB)
  uint64_t quota_bytes = 0;           // parsed; 0 = the daemon's default
};

struct ExecOptions {
  std::vector<std::string> env;  // K=V, validated
  std::string workdir;
  double timeout_s = 0;      // 0: none
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
  int max_turns = 0;  // 0: the daemon's default
  int timeout_s = 0;  // wall clock per call; 0: the daemon's default
  int64_t max_tokens = 0;
};

struct Invocation {
  std::string
      command;  // run create exec cp rm ls collect diff image-build image-ls doctor audit mcp help
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
  std::string image_name = "debian-12";  // image build
  bool rebuild_rootfs = false;
  std::string help;  // command == "help": the text to print
  ModelFlags model;  // agent, mcp: --provider, --model
  TerminalOptions term;
};

// Parses argv (including argv[0]). Errors carry CLI11's message.
Result<Invocation> Parse(const std::vector<std::string>& args);

// K=V with K a valid environment name.
Status ValidateEnvAssignment(const std::string& kv);

// -e K=V entries (validated) as an exec request's "env" object.
nlohmann::json EnvObject(const std::vector<std::string>& env);

// The exit code for an exec result body from tryboxd, and a message for stderr (may be "").
int ExitCodeFor(const nlohmann::json& result, std::string* message);

// Runs a parsed invocation; returns the process exit code.
int Run(const Invocation& inv);

}  // namespace trybox::cli
