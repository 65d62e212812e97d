// RunState: what the daemon knows of one vm_agent run, typed (docs/agent.md). It is stored
// as the `state` JSON of the agent_runs table (store/store.h) with the keys runs have always
// been stored with, so runs written by earlier daemons load; a key of the wrong type loads
// as absent rather than failing the whole run. Never holds the model's key.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/loop.h"
#include "daemon/requests.h"
#include "daemon/wire.h"

namespace trybox::daemon {

struct RunError {
  std::string kind;  // setup_failed, vm_lost, a model failure's name
  std::string message;
  std::optional<int> http_status;
  std::optional<int> attempts;
};

// A request_network call that waits for a person (docs/agent.md, "Approvals").
struct PendingApproval {
  std::string host;  // canonical
  int port = 443;
  std::string reason;  // the agent's words, capped
  double since = 0;    // seconds since the epoch
};

struct RunClaim {
  std::string summary;
  bool truncated = false;
  std::string status = "unverified";  // unverified | contradicted
};

// One thing that ran in the verification VM before the check (docs/agent.md, "Finishing"),
// in the daemon's words: "copy" (tryboxd wrote the collected tree to /workspace), "chown"
// (tryboxd's own command handing /workspace to the check's account), "setup" (the caller's
// hook, as injected; outcome "none" when there was none).
struct VerifyStep {
  std::string step;
  std::string what;               // the daemon's sentence for it
  std::vector<std::string> argv;  // a command's
  std::string user;               // the account a command ran as
  std::string outcome;            // an exec outcome; "done" for the copy, "none" for no hook
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::optional<int64_t> exec_id;
  std::optional<int64_t> duration_ms;
  std::string error;
  // setup: the hook's git blob id in the caller's repository and its SHA-256, what the
  // collected tree's own .trybox/setup.sh was ("none", "unchanged" or "changed": never run),
  // and the tail of the hook's output (its words).
  std::string blob;
  std::string sha256;
  std::string tree_hook;
  std::optional<std::string> output_tail;
};

// The supervisor's re-run of the verification command.
struct Verification {
  std::string command;
  std::string source;   // "caller" or "agent"
  std::string outcome;  // an exec outcome, or "not_run"
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::optional<int64_t> duration_ms;
  std::optional<int64_t> timeout_ms;
  std::string error;
  std::optional<int64_t> exec_id;
  std::string vm;
  std::string user;  // the account it ran as
  std::optional<std::string> output_tail;
  int64_t output_tail_bytes = 0;
  int64_t output_bytes = 0;
  std::vector<VerifyStep> before;  // everything that ran in its VM before the check, in order
};

struct RunState {
  std::string task;
  std::string image_name;
  std::string image_sha256;
  bool internet = false;
  std::vector<std::string> allow;
  std::vector<std::string> profiles;
  std::vector<std::string> deny;
  std::string caller_verify;
  std::optional<std::string> workspace;
  Json model = Json::object();  // ModelSettings::Describe(): never the key
  agent::RunUsage usage;
  std::map<int64_t, std::string> exec_tools;  // exec id -> the tool that ran it
  std::string repo;
  std::optional<AgentLimits> limits;
  std::vector<agent::TurnTime> turn_times;
  std::optional<RunError> error;
  std::string reason;
  std::optional<std::string> question;
  bool question_truncated = false;
  // While NEEDS_INPUT: the ask call's id and that turn's results.
  std::optional<std::string> pending_ask_call_id;
  // While NEEDS_INPUT for request_network: what it asks for.
  std::optional<PendingApproval> approval;
  std::optional<agent::Entry> pending_results;
  std::vector<std::string> answers;
  std::optional<RunClaim> claim;
  std::string agent_verify;
  std::optional<int64_t> collect_id;
  std::string files_note;
  std::optional<Verification> verification;
  std::string verify_vm;
  std::string verdict;  // VERIFIED | FAILED_VERIFICATION | UNVERIFIED, once DONE
  std::string expired;  // why the run's VM was given back, once it was

  Json ToJson() const;
  static RunState FromJson(const Json& j);
};

Json VerificationJson(const Verification& v);

}  // namespace trybox::daemon
