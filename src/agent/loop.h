// The sub-agent's loop: ask the model, run the tools it calls in the run's VM, feed the
// results back, until it finishes, asks the caller something, or reaches a limit
// (docs/agent.md). It holds no key, no store and no VM: the model client, the VM and the
// caller's side are interfaces, so the same loop runs inside tryboxd or in the unprivileged
// trybox-agent process that reaches the daemon over one restricted connection.
//
// Nothing the model sends is trusted: a malformed call runs nothing and is answered with
// an error; every result is capped; text from the model or the guest is sanitised (UTF-8)
// before it is kept. Thread-compatible: one RunLoop per run at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "agent/model.h"
#include "util/status.h"

namespace trybox::agent {

struct RunUsage {
  int64_t turns = 0;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t model_ms = 0;
};

// One turn's time, split: the model request, the commands' own run time (as the guest
// measured it), and the rest, which is the overhead of the loop and its host.
struct TurnTime {
  int64_t turn = 0;
  double ms = 0;
  double model_ms = 0;
  double command_ms = 0;
  double overhead_ms = 0;
};

struct LoopLimits {
  int max_turns = 40;
  int wall_clock_s = 900;
  int64_t max_tokens = 2'000'000;
};

// What the loop carries from call to call of one run.
struct LoopState {
  std::vector<Entry> transcript;
  RunUsage usage;
  std::vector<TurnTime> turn_times;  // the last 200
};

struct FileContent {
  std::string data;
  bool truncated = false;
  int64_t size = -1;  // -1: unknown
};

// The run's VM, as the loop may use it. Every call acts in that one VM.
struct NetworkDecision {
  std::string decision;  // "granted", "refused" or "ask"
  std::string message;   // for the model
};

// A request for network access that waits for a person (LoopResult::approval).
struct NetworkRequest {
  std::string host;  // canonical
  int port = 443;
  std::string reason;  // the agent's words
};

class RunVm {
 public:
  virtual ~RunVm() = default;
  // OK while the VM can serve; else kUnavailable naming why (it died, it was destroyed).
  virtual Status Check() = 0;
  // Runs `argv` in /workspace, as root, at most `timeout_ms`. The exec result object of
  // docs/protocol/daemon.md; `output` gets stdout and stderr interleaved (a capped tail).
  // `tool` names the calling tool in the record.
  virtual Result<nlohmann::json> Exec(const std::vector<std::string>& argv, int64_t timeout_ms,
                                      const std::string& tool, std::string* output) = 0;
  virtual Status WriteFile(const std::string& path, const std::string& content, int mode) = 0;
  // A directory or other non-file is kFailedPrecondition.
  virtual Result<FileContent> ReadFile(const std::string& path, int64_t max_bytes) = 0;
  // The agent asks for one more host (request_network): the daemon answers "granted" or
  // "refused" at once (the operator's policy, or the VM's own deny entries), with words
  // for the model, or "ask": a person decides, and the run pauses.
  virtual Result<NetworkDecision> RequestNetwork(const std::string& host, int port,
                                                 const std::string& reason) = 0;
};

// The caller's side of a run.
class RunEvents {
 public:
  virtual ~RunEvents() = default;
  virtual void Progress(int turn, int max_turns, const std::string& message) = 0;
  // After each turn: the state to keep (the caller persists it).
  virtual void Save(const LoopState& state) = 0;
  // True once the run must stop where it is (the caller went away, a cancel).
  virtual bool Stopped() = 0;
};

struct LoopResult {
  enum class End { kFinished, kNeedsInput, kInProgress, kError };
  End end = End::kError;
  std::string reason;  // why it stopped, in words
  // kFinished: the agent's claim and its verification command (may be empty).
  std::string summary;
  std::string verify_command;
  // kNeedsInput: the question; the ask call's id; the results of that turn's calls (the
  // answer becomes the ask call's result).
  std::string question;
  bool question_truncated = false;
  std::string ask_call_id;
  Entry pending;
  // Set when the pause is a request_network call waiting for approval (the question then
  // says what is asked, in the daemon's words).
  std::optional<NetworkRequest> approval;
  // kError
  std::string error_kind;  // a model failure's name, or vm_lost
  std::string error_message;
  int http_status = 0;
  int attempts = 0;
};

// Works on the run until it finishes, asks, stops or reaches a limit. The transcript must
// already hold the task (or the answer) as its last entry.
LoopResult RunLoop(ModelClient& model, RunVm& vm, RunEvents& events, LoopState& state,
                   const LoopLimits& limits, const std::string& system_prompt);

// What the model reads back for an exec result: how it ended, then the output (capped).
std::string DescribeExec(const nlohmann::json& result, const std::string& output);

}  // namespace trybox::agent
