#include "daemon/agent_runner.h"

#include "agent/report.h"
#include "agent/text.h"
#include "agent/tools.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/names.h"
#include "util/process.h"
#include "workspace/workspace.h"

namespace trybox::daemon {
namespace {

namespace ws = trybox::workspace;
using Clock = std::chrono::steady_clock;

constexpr int64_t kSetupTimeoutMs = 600'000;

// An empty git repository of the run's own, for a run without a workspace: the agent still
// works in /workspace and its files still come back, are diffed and committed, the same way.
Status InitRunRepo(const std::string& dir) {
  RETURN_IF_ERROR(MakeDirs(dir, 0700));
  return RunChecked({"/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "GIT_CONFIG_GLOBAL=/dev/null",
                     "GIT_CONFIG_NOSYSTEM=1", "git", "-c", "init.templateDir=", "init", "-q", dir});
}

}  // namespace

struct AgentRunner::Run {
  std::string id;
  agent::ModelSettings settings;  // holds the key: never serialised
  std::unique_ptr<agent::ModelClient> client;
  std::vector<agent::Entry> transcript;
  RunState state;
  store::AgentRunRecord rec;        // as stored: id, times, outcome, vm_id (state from `state`)
  bool busy = false;                // GUARDED_BY(AgentRunner::mu_)
  Clock::time_point last_call_end;  // GUARDED_BY(AgentRunner::mu_)
};

// The run's VM for the loop, through the VmService: every exec recorded, tagged with its tool.
class AgentRunner::InProcessVm : public agent::RunVm {
 public:
  InProcessVm(VmService& vms, Run& run) : vms_(vms), run_(run) {}

  Status Check() override {
    auto vm = vms_.Get(run_.rec.vm_id);
    if (!vm.ok()) return Unavailable(vm.status().message());
    if (!(*vm)->alive()) return Unavailable("the VM died: " + (*vm)->death_reason());
    return Status::Ok();
  }

  Result<Json> Exec(const std::vector<std::string>& argv, int64_t timeout_ms,
                    const std::string& tool, std::string* output) override {
    ASSIGN_OR_RETURN(auto vm, vms_.Get(run_.rec.vm_id));
    ExecSpec spec;
    spec.argv = argv;
    spec.cwd = ws::kGuestPath;
    spec.timeout_ms = timeout_ms;
    spec.privileged = vm->privileged();
    ExecIo io;
    io.capture = output;
    int64_t exec_id = 0;
    ASSIGN_OR_RETURN(ExecResult r, vms_.Exec(*vm, spec, io, &exec_id));
    if (exec_id) run_.state.exec_tools[exec_id] = tool;
    return r.ToJson();
  }

  Status WriteFile(const std::string& path, const std::string& content, int mode) override {
    ASSIGN_OR_RETURN(auto vm, vms_.Get(run_.rec.vm_id));
    return daemon::WriteFile(*vm, path, content, mode, /*mkdirs=*/true);
  }

  Result<agent::FileContent> ReadFile(const std::string& path, int64_t max_bytes) override {
    ASSIGN_OR_RETURN(auto vm, vms_.Get(run_.rec.vm_id));
    ASSIGN_OR_RETURN(FileRead r, daemon::ReadFile(*vm, path, max_bytes));
    return agent::FileContent{std::move(r.data), r.truncated, r.size};
  }

 private:
  VmService& vms_;
  Run& run_;
};

class AgentRunner::ClientEvents : public agent::RunEvents {
 public:
  ClientEvents(AgentRunner& runner, Run& run, channel::Stream& client)
      : runner_(runner), run_(run), client_(client) {}

  void Progress(int turn, int max_turns, const std::string& message) override {
    if (!client_
             .SendEvent({{"progress",
                          {{"run", run_.id},
                           {"turn", turn},
                           {"max_turns", max_turns},
                           {"message", message}}}})
             .ok()) {
      LogInfo("agent", "run " + run_.id + ": the caller is gone");
    }
  }

  void Save(const agent::LoopState& state) override {
    run_.transcript = state.transcript;
    run_.state.usage = state.usage;
    run_.state.turn_times = state.turn_times;
    runner_.Save(run_);
  }

  bool Stopped() override { return client_.finished(); }

 private:
  AgentRunner& runner_;
  Run& run_;
  channel::Stream& client_;
};

AgentRunner::AgentRunner(store::Store& store, VmService& vms, WorkspaceService& workspaces,
                         Supervisor& supervisor, std::string state_dir, std::chrono::seconds idle)
    : store_(store),
      vms_(vms),
      workspaces_(workspaces),
      supervisor_(supervisor),
      reports_(store),
      state_dir_(std::move(state_dir)),
      idle_(idle) {
  reaper_ = std::thread([this] { ExpireIdleRuns(); });
}

AgentRunner::~AgentRunner() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    reaper_cv_.SignalAll();
  }
  if (reaper_.joinable()) reaper_.join();
}

void AgentRunner::Save(Run& run) {
  run.rec.updated_at = store::NowSeconds();
  run.rec.state = run.state.ToJson();
  run.rec.transcript = Json::array();
  for (const auto& e : run.transcript) run.rec.transcript.push_back(agent::EntryToJson(e));
  Status st = store_.PutAgentRun(run.rec);
  if (!st.ok()) LogWarn("agent", "run " + run.id + ": could not save: " + st.message());
}

Json AgentRunner::Reply(Run& run) {
  Json report = reports_.Build(run.rec, run.state);
  return {{"ok", true}, {"report", report}, {"text", agent::RenderReportText(report)}};
}

agent::Outcome AgentRunner::Probe(agent::ModelClient& client) {
  const auto& s = client.settings();
  std::string key = s.provider + " " + s.base_url + " " + s.model;
  {
    MutexLock lock(mu_);
    auto it = probes_.find(key);
    if (it != probes_.end()) return it->second;
  }
  agent::Outcome o = client.Probe(Clock::now() + std::chrono::minutes(5));
  LogInfo("agent", "context probe of " + s.provider + " model " + QuoteForMessage(s.model) + ": " +
                       (o.ok() ? "passed" : agent::FailureName(o.failure)));
  // A pass, or a window shown too small, is a fact about the model; anything else (the
  // server down, a 429) says nothing and is asked again next time.
  if (o.ok() || o.failure == agent::Failure::kContextTruncated) {
    MutexLock lock(mu_);
    probes_[key] = o;
  }
  return o;
}

Json AgentRunner::Start(const AgentRequest& req, channel::Stream& client) {
  auto mclient = agent::ModelClient::Make(req.model);
  if (!mclient.ok()) return ErrorReply(mclient.status());
  CreateRequest create;
  create.image = req.image;
  create.memory_mib = req.memory_mib;
  create.cpus = req.cpus;
  create.cold = req.cold;
  create.allow = req.allow;
  create.profiles = req.profiles;
  // Checked before a VM is booted, and before the probe spends a request, for nothing.
  if (Status st = vms_.Validate(create); !st.ok()) return ErrorReply(st);
  agent::Outcome probe = Probe(**mclient);
  if (!probe.ok()) {
    return ErrorReply(
        FailedPrecondition(std::string("the model did not pass the start-up probe (") +
                           agent::FailureName(probe.failure) + "): " + probe.message));
  }

  auto run = std::make_shared<Run>();
  run->id = NewId();
  run->settings = req.model;
  run->client = std::move(*mclient);
  run->rec.id = run->id;
  run->rec.created_at = store::NowSeconds();
  run->rec.outcome = "RUNNING";
  RunState& s = run->state;
  s.task = agent::SanitizeUtf8(req.task);
  s.image_name = req.image;
  s.allow = req.allow;
  s.profiles = req.profiles;
  s.caller_verify = req.verify;
  if (!req.workspace.empty()) s.workspace = req.workspace;
  s.model = run->settings.Describe();
  auto progress = [&](const std::string& msg) {
    (void)client.SendEvent(
        {{"progress",
          {{"run", run->id}, {"turn", 0}, {"max_turns", req.limits.max_turns}, {"message", msg}}}});
  };

  // The workspace: the caller's working tree, or an empty repository of the run's own.
  s.repo = req.workspace;
  if (s.repo.empty()) {
    s.repo = state_dir_ + "/runs/" + run->id + "/repo";
    if (Status st = InitRunRepo(s.repo); !st.ok()) {
      return ErrorReply(st.Annotate("create the run's repository"));
    }
  }

  progress("starting a " + req.image + " VM");
  auto created = vms_.Create(create);
  if (!created.ok()) return ErrorReply(created.status().Annotate("boot a " + req.image + " VM"));
  VmEntry& vm = *created->entry;
  run->rec.vm_id = vm.id();
  s.image_sha256 = vm.record().image_sha256;
  progress("copying the workspace into VM " + vm.id());
  auto plan = ws::PlanInject(s.repo, ws::kDefaultQuotaBytes);
  auto recorded = plan.ok() ? workspaces_.Inject(vm, *plan, ws::kDefaultQuotaBytes)
                            : Result<store::WorkspaceRecord>(plan.status());
  if (!recorded.ok()) {
    (void)vms_.Destroy(vm.id());
    return ErrorReply(recorded.status());
  }
  {
    MutexLock lock(mu_);
    run->busy = true;
    runs_[run->id] = run;
  }
  (void)client.SendEvent({{"run", run->id}});
  if (plan->manifest.count(ws::kSetupScript)) progress("running " + std::string(ws::kSetupScript));
  auto setup = workspaces_.RunSetup(vm, plan->manifest, kSetupTimeoutMs, nullptr, true);
  if (setup.ok() && *setup) s.exec_tools[(*setup)->exec_id] = "setup";
  if (!setup.ok() || (*setup && !(*setup)->result.Succeeded())) {
    run->rec.outcome = "ERROR";
    s.error = RunError{"setup_failed",
                       setup.ok() ? agent::DescribeExec((*setup)->result.ToJson(), (*setup)->output)
                                  : setup.status().message(),
                       std::nullopt, std::nullopt};
    s.reason = std::string(ws::kSetupScript) + " failed; the agent was not started";
    (void)vms_.Destroy(vm.id());
  }

  agent::Entry first;
  first.kind = agent::Entry::Kind::kUser;
  first.text = "Task:\n" + s.task;
  if (!s.caller_verify.empty()) {
    first.text +=
        "\n\nThe caller will check the result with this command, run from /workspace in a "
        "fresh VM: " +
        s.caller_verify;
  }
  run->transcript.push_back(first);
  Save(*run);
  Json end = run->rec.outcome == "ERROR" ? Reply(*run) : Drive(*run, client, req.limits);
  Release(run);
  return end;
}

Json AgentRunner::Continue(const AgentContinueRequest& req, bool answer, channel::Stream& client) {
  const std::string& id = req.run;
  std::shared_ptr<Run> run;
  {
    MutexLock lock(mu_);
    auto it = runs_.find(id);
    if (it != runs_.end()) {
      if (it->second->busy) {
        return ErrorReply(FailedPrecondition("run " + id + " is working on another call"));
      }
      run = it->second;
      run->busy = true;
    }
  }
  const std::string want = answer ? "NEEDS_INPUT" : "IN_PROGRESS";
  if (!run) {
    auto rec = store_.GetAgentRun(id);
    if (!rec.ok()) return ErrorReply(rec.status());
    if (!rec->has_value()) {
      return ErrorReply(NotFound("no vm_agent run with id " + QuoteForMessage(id)));
    }
    const store::AgentRunRecord& r = **rec;
    if (r.outcome == "DONE") {
      return ErrorReply(FailedPrecondition("run " + id + " is DONE, not " + want));
    }
    RunState st = RunState::FromJson(r.state);
    if (!st.expired.empty()) {
      return ErrorReply(FailedPrecondition("run " + id + " is " + r.outcome + " and expired (" +
                                           st.expired + "); start a new run"));
    }
    return ErrorReply(FailedPrecondition("run " + id + " is " + r.outcome +
                                         " and its VM did not outlive the daemon that ran it; "
                                         "start a new run"));
  }
  auto refuse = [&](const Status& st) {
    Release(run);
    return ErrorReply(st);
  };
  const std::string& outcome = run->rec.outcome;
  bool resumable =
      answer ? outcome == "NEEDS_INPUT" : (outcome == "IN_PROGRESS" || outcome == "ERROR");
  if (!resumable) {
    std::string hint = outcome == "NEEDS_INPUT" ? " (it asked a question: use agent_answer)"
                       : outcome == "IN_PROGRESS" || outcome == "ERROR" ? " (use agent_resume)"
                                                                        : "";
    return refuse(FailedPrecondition("run " + id + " is " + outcome + ", not " + want + hint));
  }
  RunState& s = run->state;
  if (s.error && s.error->kind == "setup_failed") {
    return refuse(FailedPrecondition("run " + id + " never started: its setup hook failed"));
  }
  if (req.model) {
    auto mclient = agent::ModelClient::Make(*req.model);
    if (!mclient.ok()) return refuse(mclient.status());
    run->settings = *req.model;
    run->client = std::move(*mclient);
    s.model = run->settings.Describe();
  }
  if (answer) {
    // The answer is the result of the `ask` call; the calls after it were not run.
    agent::Entry results;
    results.kind = agent::Entry::Kind::kToolResults;
    if (s.pending_results) results = *s.pending_results;
    std::string text = agent::SanitizeUtf8(req.answer);
    for (auto& r : results.results) {
      if (s.pending_ask_call_id && r.call_id == *s.pending_ask_call_id) {
        r.content = "The caller answered:\n" + text;
        r.is_error = false;
      }
    }
    run->transcript.push_back(results);
    s.pending_ask_call_id.reset();
    s.pending_results.reset();
    s.answers.push_back(text);
    s.question.reset();
  }
  s.reason.clear();
  s.error.reset();
  run->rec.outcome = "RUNNING";
  (void)client.SendEvent({{"run", run->id}});
  Json end = Drive(*run, client, req.limits);
  Release(run);
  return end;
}

Json AgentRunner::Show(const std::string& run_id) {
  auto rec = store_.GetAgentRun(run_id);
  if (!rec.ok()) return ErrorReply(rec.status());
  if (!rec->has_value()) {
    return ErrorReply(NotFound("no vm_agent run with id " + QuoteForMessage(run_id)));
  }
  Json report = reports_.Build(**rec, RunState::FromJson((*rec)->state));
  return {{"ok", true}, {"report", report}, {"text", agent::RenderReportText(report)}};
}

Json AgentRunner::Drive(Run& run, channel::Stream& client, const AgentLimits& limits) {
  RunState& s = run.state;
  s.limits = limits;
  InProcessVm vm(vms_, run);
  ClientEvents events(*this, run, client);
  agent::LoopState loop{run.transcript, s.usage, s.turn_times};
  agent::LoopResult r = agent::RunLoop(*run.client, vm, events, loop,
                                       {limits.max_turns, limits.wall_clock_s, limits.max_tokens},
                                       agent::SystemPrompt());
  run.transcript = std::move(loop.transcript);
  s.usage = loop.usage;
  s.turn_times = std::move(loop.turn_times);
  using End = agent::LoopResult::End;
  switch (r.end) {
    case End::kFinished:
      events.Progress(static_cast<int>(s.usage.turns), limits.max_turns,
                      "finished: collecting /workspace and re-running the verification");
      supervisor_.Finish(run.id, run.rec.vm_id, s, r.summary, r.verify_command,
                         [&](const std::string& msg) {
                           events.Progress(static_cast<int>(s.usage.turns), limits.max_turns, msg);
                         });
      run.rec.outcome = "DONE";
      s.reason.clear();
      break;
    case End::kNeedsInput:
      run.rec.outcome = "NEEDS_INPUT";
      s.reason = r.reason;
      s.question = r.question;
      s.question_truncated = r.question_truncated;
      s.pending_ask_call_id = r.ask_call_id;
      s.pending_results = r.pending;
      break;
    case End::kInProgress:
      run.rec.outcome = "IN_PROGRESS";
      s.reason = r.reason;
      break;
    case End::kError:
      run.rec.outcome = "ERROR";
      s.reason = r.reason;
      s.error = RunError{r.error_kind, r.error_message, std::nullopt, std::nullopt};
      if (r.error_kind != "vm_lost") {
        s.error->http_status = r.http_status;
        s.error->attempts = r.attempts;
      }
      break;
  }
  Save(run);
  return Reply(run);
}

void AgentRunner::Release(const std::shared_ptr<Run>& run) {
  MutexLock lock(mu_);
  run->busy = false;
  run->last_call_end = Clock::now();
  // A finished run, or one that never started, is only a record now.
  bool never_started = run->state.error && run->state.error->kind == "setup_failed";
  if (run->rec.outcome == "DONE" || never_started) runs_.erase(run->id);
  reaper_cv_.SignalAll();
}

void AgentRunner::ExpireIdleRuns() {
  for (;;) {
    std::vector<std::shared_ptr<Run>> expired;
    {
      MutexLock lock(mu_);
      // Sleeps until the first waiting run's time is up, or until a run changes.
      std::optional<Clock::time_point> next;
      for (const auto& [id, r] : runs_) {
        if (r->busy) continue;
        auto due = r->last_call_end + idle_;
        if (!next || due < *next) next = due;
      }
      if (stopping_) return;
      if (!next) {
        reaper_cv_.Wait(mu_);
      } else if (Clock::now() < *next) {
        reaper_cv_.WaitUntil(mu_, *next);
      }
      if (stopping_) return;
      auto now = Clock::now();
      for (auto it = runs_.begin(); it != runs_.end();) {
        Run& r = *it->second;
        if (!r.busy && now - r.last_call_end >= idle_) {
          expired.push_back(it->second);
          it = runs_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& r : expired) {
      std::string why = "no call for " + std::to_string(idle_.count()) + " s: its VM was destroyed";
      LogInfo("agent", "run " + r->id + ": " + why);
      if (r->rec.outcome != "DONE") (void)vms_.Destroy(r->rec.vm_id);
      r->state.expired = why;
      Save(*r);
    }
  }
}

}  // namespace trybox::daemon
