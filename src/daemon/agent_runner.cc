#include "daemon/agent_runner.h"

#include "agent/report.h"
#include "agent/text.h"
#include "util/fd.h"
#include "util/json.h"
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

agent::LoopLimits LoopLimits(const AgentLimits& l) {
  return {l.max_turns, l.wall_clock_s, l.max_tokens};
}

}  // namespace

AgentRunner::AgentRunner(store::Store& store, VmService& vms, WorkspaceService& workspaces,
                         Supervisor& supervisor, UidPool& uids, AgentRunnerOptions opts)
    : store_(store),
      vms_(vms),
      workspaces_(workspaces),
      supervisor_(supervisor),
      uids_(uids),
      reports_(store),
      opts_(std::move(opts)) {
  reaper_ = std::thread([this] { ExpireIdleRuns(); });
}

AgentRunner::~AgentRunner() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  if (reaper_.joinable()) reaper_.join();
}

CallEnv AgentRunner::Env() { return CallEnv{vms_, uids_, opts_.agent_binary}; }

void AgentRunner::Save(LiveRun& run) {
  run.rec.updated_at = store::NowSeconds();
  run.rec.state = run.state.ToJson();
  run.rec.transcript = Json::array();
  for (const auto& e : run.transcript) run.rec.transcript.push_back(agent::EntryToJson(e));
  Status st = store_.PutAgentRun(run.rec);
  if (!st.ok()) LogWarn("agent", "run " + run.id + ": could not save: " + st.message());
}

Json AgentRunner::Reply(LiveRun& run) {
  Json report = reports_.Build(run.rec, run.state);
  return {{"ok", true}, {"report", report}, {"text", agent::RenderReportText(report)}};
}

agent::Outcome AgentRunner::Probe(const agent::ModelSettings& s, CallerWatch& watch) {
  std::string key = s.provider + " " + s.base_url + " " + s.model;
  {
    MutexLock lock(mu_);
    auto it = probes_.find(key);
    if (it != probes_.end()) return it->second;
  }
  AgentCall call(Env(), s, nullptr, nullptr, {}, nullptr);
  watch.Attach(&call);
  agent::Outcome o = call.Probe();
  watch.Detach();
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
  if (auto endpoint = agent::ModelEndpoint(req.model); !endpoint.ok()) {
    return ErrorReply(endpoint.status());
  }
  CreateRequest create;
  create.image = req.image;
  create.memory_mib = req.memory_mib;
  create.cpus = req.cpus;
  create.cold = req.cold;
  create.internet = req.internet;
  create.allow = req.allow;
  create.profiles = req.profiles;
  create.deny = req.deny;
  create.secrets = req.secrets;  // shared: the values stay in their pages
  create.http_rules = req.http_rules;
  // Checked before a VM is booted, and before the probe spends a request, for nothing.
  if (Status st = vms_.Validate(create); !st.ok()) return ErrorReply(st);
  CallerWatch watch(client);
  agent::Outcome probe = Probe(req.model, watch);
  if (watch.gone()) {
    return ErrorReply(trybox::Cancelled("the caller left during the model's start-up probe"));
  }
  if (!probe.ok()) {
    return ErrorReply(
        FailedPrecondition(std::string("the model did not pass the start-up probe (") +
                           agent::FailureName(probe.failure) + "): " + probe.message));
  }

  auto slot = std::make_shared<Slot>();
  LiveRun& run = slot->run;
  run.id = NewId();
  run.settings = req.model;
  run.secrets = req.secrets;
  run.rec.id = run.id;
  run.rec.created_at = store::NowSeconds();
  run.rec.outcome = "RUNNING";
  RunState& s = run.state;
  s.task = agent::SanitizeUtf8(req.task);
  s.image_name = req.image;
  s.internet = req.internet;
  s.allow = req.allow;
  s.profiles = req.profiles;
  s.deny = req.deny;
  s.caller_verify = req.verify;
  if (!req.workspace.empty()) s.workspace = req.workspace;
  s.model = run.settings.Describe();
  auto progress = [&](const std::string& msg) {
    (void)client.SendEvent(
        {{"progress",
          {{"run", run.id}, {"turn", 0}, {"max_turns", req.limits.max_turns}, {"message", msg}}}});
  };

  // The workspace: the caller's working tree, or an empty repository of the run's own.
  s.repo = req.workspace;
  if (s.repo.empty()) {
    s.repo = opts_.state_dir + "/runs/" + run.id + "/repo";
    if (Status st = InitRunRepo(s.repo); !st.ok()) {
      return ErrorReply(st.Annotate("create the run's repository"));
    }
  }

  progress("starting a " + req.image + " VM");
  auto created = vms_.Create(create);
  if (!created.ok()) return ErrorReply(created.status().Annotate("boot a " + req.image + " VM"));
  VmEntry& vm = *created->entry;
  run.rec.vm_id = vm.id();
  s.image_sha256 = vm.record().image_sha256;
  progress("copying the workspace into VM " + vm.id());
  bool written = false;
  auto plan = workspaces_.Plan(vm, s.repo, ws::Quota{}, &written);
  auto recorded = plan.ok() ? workspaces_.Inject(vm, *plan, ws::Quota{}, nullptr, written)
                            : Result<store::WorkspaceRecord>(plan.status());
  if (!recorded.ok()) {
    (void)vms_.Destroy(vm.id());
    return ErrorReply(recorded.status());
  }
  {
    MutexLock lock(mu_);
    slot->busy = true;
    runs_[run.id] = slot;
  }
  (void)client.SendEvent({{"run", run.id}});
  if (plan->manifest.count(ws::kSetupScript)) progress("running " + std::string(ws::kSetupScript));
  auto setup = workspaces_.RunSetup(vm, plan->manifest, kSetupTimeoutMs, nullptr, true);
  if (setup.ok() && *setup) s.exec_tools[(*setup)->exec_id] = "setup";
  if (!setup.ok() || (*setup && !(*setup)->result.Succeeded())) {
    run.rec.outcome = "ERROR";
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
  run.transcript.push_back(first);
  Save(run);
  Json end = run.rec.outcome == "ERROR" ? Reply(run) : Drive(run, client, watch, req.limits);
  Release(slot);
  return end;
}

Json AgentRunner::Continue(const AgentContinueRequest& req, bool answer, channel::Stream& client) {
  const std::string& id = req.run;
  std::shared_ptr<Slot> slot;
  {
    MutexLock lock(mu_);
    auto it = runs_.find(id);
    if (it != runs_.end()) {
      if (it->second->busy) {
        return ErrorReply(FailedPrecondition("run " + id + " is working on another call"));
      }
      slot = it->second;
      slot->busy = true;
    }
  }
  const std::string want = answer ? "NEEDS_INPUT" : "IN_PROGRESS";
  if (!slot) {
    auto rec = store_.GetAgentRun(id);
    if (!rec.ok()) return ErrorReply(rec.status());
    if (!rec->has_value()) {
      return ErrorReply(NotFound("no vm_agent run with id " + QuoteForMessage(id)));
    }
    const store::AgentRunRecord& r = **rec;
    if (r.outcome == "DONE" || r.outcome == "CANCELLED") {
      return ErrorReply(FailedPrecondition("run " + id + " is " + r.outcome + ", not " + want));
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
  LiveRun& run = slot->run;
  auto refuse = [&](const Status& st) {
    Release(slot);
    return ErrorReply(st);
  };
  const std::string& outcome = run.rec.outcome;
  bool resumable =
      answer ? outcome == "NEEDS_INPUT" : (outcome == "IN_PROGRESS" || outcome == "ERROR");
  if (!resumable) {
    std::string hint = outcome == "NEEDS_INPUT" ? " (it asked a question: use agent_answer)"
                       : outcome == "IN_PROGRESS" || outcome == "ERROR" ? " (use agent_resume)"
                                                                        : "";
    return refuse(FailedPrecondition("run " + id + " is " + outcome + ", not " + want + hint));
  }
  RunState& s = run.state;
  if (s.error && s.error->kind == "setup_failed") {
    return refuse(FailedPrecondition("run " + id + " never started: its setup hook failed"));
  }
  if (req.model) {
    if (auto endpoint = agent::ModelEndpoint(*req.model); !endpoint.ok()) {
      return refuse(endpoint.status());
    }
    run.settings = *req.model;
    s.model = run.settings.Describe();
  }
  if (answer && !req.decision.empty() && !s.approval) {
    return refuse(FailedPrecondition("run " + id +
                                     " asked a question, not for network access: answer it "
                                     "with text"));
  }
  std::string content;  // the result of the call that paused the run
  if (answer && s.approval) {
    // A request that can no longer be carried out fails now, with the reason, and the run
    // with it: it must never look like progress.
    const std::string entry = s.approval->host + ":" + std::to_string(s.approval->port);
    Status gone = vms_.GetLive(run.rec.vm_id).status();
    if (gone.ok() && req.decision == "approve") {
      gone = vms_.ChangeEgress(run.rec.vm_id,
                               {{entry}, {}, req.by + ", approving run " + id + "'s request"})
                 .status();
    }
    if (!gone.ok()) {
      const std::string why = "the request for network access to " + entry +
                              " can no longer be carried out: " + gone.message();
      run.rec.outcome = "ERROR";
      s.reason = why;
      s.error = RunError{"vm_lost", gone.message(), std::nullopt, std::nullopt};
      s.approval.reset();
      Save(run);
      return refuse(FailedPrecondition("run " + id + ": " + why));
    }
    if (req.decision == "approve") {
      content = "A person approved: " + entry + " may now be reached through the proxy.";
    } else if (req.decision == "deny") {
      (void)vms_.RefuseNetworkRequest(run.rec.vm_id, entry,
                                      "request_network refused by " + req.by + " (run " + id + ")");
      content = "A person refused network access to " + entry + ".";
    }
    if (!req.decision.empty() && !req.answer.empty()) {
      content += " They added:\n" + agent::SanitizeUtf8(req.answer);
    } else if (req.decision.empty()) {
      content = "A person did not approve network access to " + entry +
                " (it stays refused); they answered:\n" + agent::SanitizeUtf8(req.answer);
    }
  }
  if (answer) {
    // The answer is the result of the call that paused the run (ask or request_network);
    // the calls after it were not run.
    agent::Entry results;
    results.kind = agent::Entry::Kind::kToolResults;
    if (s.pending_results) results = *s.pending_results;
    std::string text = agent::SanitizeUtf8(req.answer);
    if (content.empty()) content = "The caller answered:\n" + text;
    if (text.empty()) text = "(" + req.decision + "d)";
    for (auto& r : results.results) {
      if (s.pending_ask_call_id && r.call_id == *s.pending_ask_call_id) {
        r.content = content;
        r.is_error = false;
      }
    }
    s.approval.reset();
    run.transcript.push_back(results);
    s.pending_ask_call_id.reset();
    s.pending_results.reset();
    s.answers.push_back(text);
    s.question.reset();
  }
  s.reason.clear();
  s.error.reset();
  run.rec.outcome = "RUNNING";
  // Stored now, with the answer: until the call's first save, agent_show and agent_ls would
  // still say NEEDS_INPUT (and show the question) for a run that is working on its answer.
  Save(run);
  (void)client.SendEvent({{"run", run.id}});
  CallerWatch watch(client);
  Json end = Drive(run, client, watch, req.limits);
  Release(slot);
  return end;
}

Json AgentRunner::Drive(LiveRun& run, channel::Stream& client, CallerWatch& watch,
                        const AgentLimits& limits) {
  RunState& s = run.state;
  s.limits = limits;
  run.feed = std::make_shared<RunFeed>();
  auto progress = [&](const std::string& msg) {
    Json ev = {{"progress",
                {{"run", run.id},
                 {"turn", s.usage.turns},
                 {"max_turns", limits.max_turns},
                 {"message", msg}}}};
    run.feed->Push(ev);
    (void)client.SendEvent(ev);
  };
  AgentCall call(Env(), run.settings, &run, &client, LoopLimits(limits),
                 [this](LiveRun& r) { Save(r); });
  std::shared_ptr<Slot> slot;
  {
    MutexLock lock(mu_);
    auto it = runs_.find(run.id);
    if (it != runs_.end()) {
      slot = it->second;
      slot->active = &call;
    }
  }
  watch.Attach(&call);
  auto result = call.Loop();
  watch.Detach();
  {
    MutexLock lock(mu_);
    if (slot) slot->active = nullptr;
  }
  using End = agent::LoopResult::End;
  if (call.cancelled()) {
    progress("cancelled: collecting /workspace");
    Cancelled(run, "cancelled by the caller");
  } else if (!result.ok()) {
    run.rec.outcome = "ERROR";
    s.reason = "the agent process failed";
    s.error = RunError{"agent_process", result.status().message(), std::nullopt, std::nullopt};
  } else {
    const agent::LoopResult& r = *result;
    switch (r.end) {
      case End::kFinished:
        progress("finished: collecting /workspace and re-running the verification");
        supervisor_.Finish(run.id, run.rec.vm_id, s, r.summary, r.verify_command, run.secrets,
                           progress);
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
        s.approval.reset();
        if (r.approval) {
          // The daemon's own record of the request (AgentCall); the question is the agent's
          // reason, its words.
          s.approval = PendingApproval{r.approval->host, r.approval->port, r.approval->reason,
                                       store::NowSeconds()};
          s.question = r.approval->reason;
          s.question_truncated = false;
        }
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
  }
  Save(run);
  Json reply = Reply(run);
  run.feed->Push({{"outcome", run.rec.outcome}, {"reason", s.reason}});
  run.feed->Close();
  return reply;
}

void AgentRunner::Cancelled(LiveRun& run, const std::string& why) {
  supervisor_.Cancel(run.id, run.rec.vm_id, run.state);
  run.rec.outcome = "CANCELLED";
  run.state.reason = why;
  run.state.question.reset();
  run.state.approval.reset();
  run.state.pending_ask_call_id.reset();
  run.state.pending_results.reset();
}

void AgentRunner::Release(const std::shared_ptr<Slot>& slot) {
  MutexLock lock(mu_);
  slot->busy = false;
  slot->last_call_end = Clock::now();
  // A finished run, or one that never started, is only a record now.
  const LiveRun& run = slot->run;
  bool never_started = run.state.error && run.state.error->kind == "setup_failed";
  if (run.rec.outcome == "DONE" || run.rec.outcome == "CANCELLED" || never_started) {
    // Its key and secrets are wiped now (unless the call's request still holds them, until
    // it returns), not whenever the last holder of the slot lets go.
    slot->run.settings.api_key.reset();
    slot->run.secrets.reset();
    runs_.erase(run.id);
  }
  changed_.SignalAll();
}

Json AgentRunner::Cancel(const std::string& run_id) {
  std::shared_ptr<Slot> slot;
  {
    MutexLock lock(mu_);
    auto it = runs_.find(run_id);
    if (it != runs_.end()) {
      slot = it->second;
      if (slot->busy) {
        // A call is working: stop it, and wait until it has recorded how it ended.
        if (slot->active) slot->active->Cancel();
        while (slot->busy) changed_.Wait(mu_);
        slot.reset();
      } else {
        slot->busy = true;
      }
    }
  }
  if (slot) {
    Cancelled(slot->run, "cancelled by " + std::string("agent_cancel"));
    Save(slot->run);
    Json reply = Reply(slot->run);
    Release(slot);
    return reply;
  }
  auto rec = store_.GetAgentRun(run_id);
  if (!rec.ok()) return ErrorReply(rec.status());
  if (!rec->has_value()) {
    return ErrorReply(NotFound("no vm_agent run with id " + QuoteForMessage(run_id)));
  }
  store::AgentRunRecord r = **rec;
  if (r.outcome == "DONE") {
    return ErrorReply(FailedPrecondition("run " + run_id + " is DONE; nothing to cancel"));
  }
  RunState st = RunState::FromJson(r.state);
  if (r.outcome != "CANCELLED") {
    // Its VM is already gone (the daemon that ran it stopped, or it expired).
    r.outcome = "CANCELLED";
    st.reason = "cancelled by agent_cancel (its VM was already gone)";
    r.state = st.ToJson();
    r.updated_at = store::NowSeconds();
    if (Status s = store_.PutAgentRun(r); !s.ok()) return ErrorReply(s);
  }
  Json report = reports_.Build(r, st);
  return {{"ok", true}, {"report", report}, {"text", agent::RenderReportText(report)}};
}

Json AgentRunner::Approvals() {
  struct Waiting {
    std::string run, vm, task, question;
    std::optional<PendingApproval> approval;
    double since = 0;
  };
  std::vector<Waiting> waiting;
  {
    MutexLock lock(mu_);
    for (const auto& [id, slot] : runs_) {
      // A busy run is being answered or resumed right now: it waits for nobody.
      if (slot->busy || slot->run.rec.outcome != "NEEDS_INPUT") continue;
      const RunState& st = slot->run.state;
      waiting.push_back({id, slot->run.rec.vm_id, st.task, st.question.value_or(""), st.approval,
                         st.approval ? st.approval->since : slot->run.rec.updated_at});
    }
  }
  std::sort(waiting.begin(), waiting.end(),
            [](const Waiting& a, const Waiting& b) { return a.since < b.since; });
  Json out = Json::array();
  for (const auto& w : waiting) {
    Json a = {{"kind", w.approval ? "network" : "agent_question"},
              {"run", w.run},
              {"vm", w.vm},
              {"task", w.task},
              {"question", w.question},
              {"since", w.since},
              {"state", "pending"}};
    if (w.approval) {
      a["host"] = w.approval->host;
      a["port"] = w.approval->port;
      a["reason"] = w.approval->reason;
    }
    if (Status gone = vms_.GetLive(w.vm).status(); !gone.ok()) {
      a["state"] = "failed";
      a["why"] = "it can no longer be carried out: " + gone.message();
    }
    out.push_back(std::move(a));
  }
  return out;
}

void AgentRunner::ExpireIdleRuns() {
  for (;;) {
    std::vector<std::shared_ptr<Slot>> expired;
    {
      MutexLock lock(mu_);
      // Sleeps until the first waiting run's time is up, or until a run changes.
      std::optional<Clock::time_point> next;
      for (const auto& [id, slot] : runs_) {
        if (slot->busy) continue;
        auto due = slot->last_call_end + opts_.idle;
        if (!next || due < *next) next = due;
      }
      if (stopping_) return;
      if (!next) {
        changed_.Wait(mu_);
      } else if (Clock::now() < *next) {
        changed_.WaitUntil(mu_, *next);
      }
      if (stopping_) return;
      auto now = Clock::now();
      for (auto it = runs_.begin(); it != runs_.end();) {
        if (!it->second->busy && now - it->second->last_call_end >= opts_.idle) {
          expired.push_back(it->second);
          it = runs_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& slot : expired) {
      LiveRun& r = slot->run;
      std::string why =
          "no call for " + std::to_string(opts_.idle.count()) + " s: its VM was destroyed";
      LogInfo("agent", "run " + r.id + ": " + why);
      (void)vms_.Destroy(r.rec.vm_id);
      r.state.expired = why;
      r.settings.api_key.reset();  // the run cannot continue: its key is wiped
      r.secrets.reset();           // and its secrets
      Save(r);
    }
  }
}

}  // namespace trybox::daemon
