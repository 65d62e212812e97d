// AgentCall: one call of a vm_agent run carried out by a trybox-agent process
// (agent_process.h), and the verbs that process may use, each bound to this run: hello,
// model, exec, write_file, read_file, check, progress, stopped, save, done
// (docs/protocol/agent.md). Everything the process sends is parsed strictly; it names no VM
// (a request naming one that is not the run's own is PERMISSION_DENIED) and never sees the
// key: its model requests are sent on by the daemon, which adds the credential.
//
// LiveRun: what the daemon holds for a run between its calls. RunFeed: the run's events for
// `agent show --follow`. CallerWatch: a verb's caller watched for as long as the verb works,
// so that its leaving stops the probe or the call working for it. Thread-safety: a LiveRun's
// fields belong to the one call that holds it busy (the runner's rule); RunFeed, CallerWatch
// and AgentCall::Cancel are safe from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/http.h"
#include "agent/loop.h"
#include "agent/model.h"
#include "channel/mux.h"
#include "daemon/agent_process.h"
#include "daemon/run_state.h"
#include "daemon/uid_pool.h"
#include "daemon/vm_service.h"
#include "util/mutex.h"

namespace trybox::daemon {

class RunFeed {
 public:
  void Push(Json event) EXCLUDES(mu_);
  void Close() EXCLUDES(mu_);
  // The events from index `from` on; blocks until there is one or the feed is closed
  // (then *closed is set and what is left is returned).
  std::vector<Json> Next(size_t from, bool* closed) EXCLUDES(mu_);

 private:
  Mutex mu_;
  CondVar cv_;
  std::vector<Json> events_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
};

struct LiveRun {
  std::string id;
  // Holds the key (shared pages, wiped when the run ends or expires): never serialised,
  // never sent to the agent.
  agent::ModelSettings settings;
  // The run's secrets (AgentRequest::secrets), for its verification VM: memory only, in
  // pages of their own, wiped when the run goes.
  std::shared_ptr<const egress::HeldSecrets> secrets;
  std::vector<agent::Entry> transcript;
  RunState state;
  store::AgentRunRecord rec;  // as stored: id, times, outcome, vm_id (state from `state`)
  std::shared_ptr<RunFeed> feed = std::make_shared<RunFeed>();
};

// Where a call's process runs and what it may reach.
struct CallEnv {
  VmService& vms;
  UidPool& uids;
  std::string agent_binary;
};

class AgentCall;

// Reads a verb's client stream (its only reader) from construction to destruction: the
// client's RESET, END or loss (the CLI killed, Ctrl-C, the socket closed) cancels the
// AgentCall attached then, and any attached later. A verb that probes the model and then
// works on a run attaches each call in turn to one watch: a stream's Interrupt() is final,
// so one reader serves the whole verb.
class CallerWatch {
 public:
  explicit CallerWatch(channel::Stream& client);
  // Stops reading (Interrupt) and joins the reader; the stream can still be ended.
  ~CallerWatch();
  CallerWatch(const CallerWatch&) = delete;
  CallerWatch& operator=(const CallerWatch&) = delete;

  // Until Detach, the caller's leaving cancels `call` (at once if it has already left).
  void Attach(AgentCall* call) EXCLUDES(mu_);
  void Detach() EXCLUDES(mu_);
  // The caller has left.
  bool gone() const EXCLUDES(mu_);

 private:
  void Read();

  channel::Stream& client_;
  mutable Mutex mu_;
  AgentCall* call_ GUARDED_BY(mu_) = nullptr;
  bool gone_ GUARDED_BY(mu_) = false;
  std::thread reader_;
};

class AgentCall {
 public:
  // `run` is null for a probe (only hello, model and done are served then). `client` (may be
  // null) gets progress events; the call does not read it (a CallerWatch does, and cancels
  // the call when the caller leaves).
  AgentCall(CallEnv env, const agent::ModelSettings& settings, LiveRun* run,
            channel::Stream* client, agent::LoopLimits limits, std::function<void(LiveRun&)> save);

  // Probe mode: the model's start-up probe, run by the agent process.
  agent::Outcome Probe();
  // Loop mode: works on the run until the loop ends; the error names how the process
  // failed when it reported no end (killed, crashed, a protocol fault).
  Result<agent::LoopResult> Loop();
  // Stops the call from any thread: the process is killed, a command or a model request in
  // flight too.
  void Cancel();
  bool cancelled() const { return cancelled_; }

 private:
  void AddVerbs(bool loop);
  Result<std::string> ReadUpload(channel::Stream& s, size_t max);
  Status OwnVm(const Json& req) const;
  Result<std::shared_ptr<VmEntry>> Vm();
  // Runs the process to its end (and reaps it).
  ExitInfo RunProcess();
  void Progress(const std::string& message, int turn, int max_turns);

  CallEnv env_;
  const agent::ModelSettings& settings_;
  LiveRun* run_;
  channel::Stream* client_;
  const agent::LoopLimits limits_;
  std::function<void(LiveRun&)> save_;
  VerbTable verbs_;
  std::unique_ptr<agent::HttpTransport> http_;
  std::atomic<bool> cancelled_{false};
  // Set when the call was cancelled or its process ended: a command opened after is stopped,
  // and a model request in flight is dropped (nobody is left to read its reply).
  std::atomic<bool> stop_work_{false};
  Mutex mu_;
  std::unique_ptr<AgentProcess> process_ GUARDED_BY(mu_);
  std::shared_ptr<channel::Stream> exec_in_flight_ GUARDED_BY(mu_);
  std::optional<agent::LoopResult> result_ GUARDED_BY(mu_);
  // The last request_network this call left to a person.
  std::optional<agent::NetworkRequest> asked_ GUARDED_BY(mu_);
  std::optional<agent::Outcome> probe_ GUARDED_BY(mu_);
  std::string protocol_error_ GUARDED_BY(mu_);
};

}  // namespace trybox::daemon
