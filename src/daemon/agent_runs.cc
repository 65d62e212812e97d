// vm_agent runs: the model loop, the tools, the supervisor's re-run, and the report
// (docs/agent.md, docs/protocol/daemon.md). The daemon is the only holder of the model
// credentials; they live in AgentRun::settings, in memory, and nowhere else.
#include <sys/stat.h>

#include "agent/report.h"
#include "agent/text.h"
#include "daemon/daemon.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/names.h"
#include "util/process.h"
#include "workspace/exclude.h"
#include "workspace/workspace.h"

namespace trybox::daemon {

namespace ws = trybox::workspace;
using agent::Entry;
using agent::ToolCall;
using agent::ToolResult;

struct Daemon::AgentRun {
  std::string id;
  agent::ModelSettings settings;  // holds the key: never serialised
  std::unique_ptr<agent::ModelClient> client;
  std::vector<Entry> transcript;
  store::AgentRunRecord rec;        // state and transcript as stored (no key)
  bool busy = false;                // GUARDED_BY(Daemon::mu_): a call is working on the run
  Clock::time_point last_call_end;  // GUARDED_BY(Daemon::mu_)
  // Set by RunTool when a command was killed because the call's wall clock ran out.
  bool hit_wall_clock = false;
  // The guest-reported run time of the commands of the current turn (docs/performance.md).
  double command_ms = 0;
};

namespace {

using Kind = channel::Stream::Message::Kind;

constexpr int kDefaultMaxTurns = 40;
constexpr int kDefaultWallClockS = 900;
constexpr int64_t kDefaultMaxTokens = 2'000'000;
constexpr int kVerifyTimeoutS = 900;
constexpr size_t kVerifyTailBytes = 4096;
constexpr int kAgentMemoryMib = 1024;

Status CheckOptionalString(const Json& req, const char* field) {
  if (req.contains(field) && !req[field].is_string()) {
    return InvalidArgument(std::string("'") + field + "' must be a string");
  }
  return Status::Ok();
}

// The limits of one call, from the request's "limits" object.
struct Limits {
  int max_turns = kDefaultMaxTurns;
  int wall_clock_s = kDefaultWallClockS;
  int64_t max_tokens = kDefaultMaxTokens;
};

Result<Limits> ParseLimits(const Json& j) {
  Limits l;
  if (j.is_null()) return l;
  if (!j.is_object()) return InvalidArgument("'limits' must be an object");
  auto get = [&](const char* k, int64_t lo, int64_t hi, int64_t* out) -> Status {
    if (!j.contains(k)) return Status::Ok();
    if (!j[k].is_number_integer())
      return InvalidArgument(std::string("limits.") + k + " must be an integer");
    int64_t v = j[k];
    if (v < lo || v > hi) {
      return InvalidArgument(std::string("limits.") + k + " must be between " + std::to_string(lo) +
                             " and " + std::to_string(hi));
    }
    *out = v;
    return Status::Ok();
  };
  int64_t turns = l.max_turns, wall = l.wall_clock_s;
  RETURN_IF_ERROR(get("max_turns", 1, 1000, &turns));
  RETURN_IF_ERROR(get("wall_clock_s", 1, 86400, &wall));
  RETURN_IF_ERROR(get("max_tokens", 1000, int64_t{1} << 40, &l.max_tokens));
  l.max_turns = static_cast<int>(turns);
  l.wall_clock_s = static_cast<int>(wall);
  return l;
}

Json LimitsJson(const Limits& l) {
  return {
      {"max_turns", l.max_turns}, {"wall_clock_s", l.wall_clock_s}, {"max_tokens", l.max_tokens}};
}

std::string FirstLine(const std::string& s, size_t max = 72) {
  std::string line = s.substr(0, s.find('\n'));
  return agent::CapHead(line, max);
}

// What the model reads back for an exec result: how it ended, then the output.
std::string DescribeExec(const Json& result, const std::string& output) {
  std::string o = result.value("outcome", "");
  std::string head;
  if (o == "exited") {
    head = "exit code " + std::to_string(result.value("exit_code", -1));
  } else if (o == "signaled") {
    head = "killed by signal " + std::to_string(result.value("signal", 0));
  } else if (o == "timed_out") {
    head = "timed out after " + std::to_string(result.value("timeout_ms", 0) / 1000) +
           " s and was killed";
  } else if (o == "error") {
    head = "could not run: " + result.value("error", std::string()) + ": " +
           result.value("message", std::string());
  } else {
    head = o + ": " + result.value("message", std::string());
  }
  if (result.contains("duration_ms")) {
    head += " (" + std::to_string(result.value("duration_ms", int64_t{0})) + " ms)";
  }
  bool cut = false;
  std::string body = agent::CapMiddle(output, agent::kMaxToolResultBytes, &cut);
  return head + "\n--- output (stdout and stderr" +
         (cut ? ", " + std::to_string(output.size()) + " bytes, middle cut" : "") + ") ---\n" +
         body;
}

Json ExecJson(const store::ExecRecord& e, const std::string& tool) {
  Json c = {{"exec_id", e.id},
            {"tool", tool},
            {"argv", e.argv},
            {"cwd", e.cwd},
            {"outcome", e.outcome},
            {"duration_ms", static_cast<int64_t>((e.ended_at - e.started_at) * 1000)},
            {"stdout_bytes", e.stdout_bytes},
            {"stderr_bytes", e.stderr_bytes}};
  if (e.exit_code) c["exit_code"] = *e.exit_code;
  if (e.signal) c["signal"] = *e.signal;
  if (!e.error.empty()) c["error"] = agent::SanitizeUtf8(e.error);
  if (e.outcome == "running") c["duration_ms"] = nullptr;
  return c;
}

// An empty git repository of the run's own, for a run without a workspace: the agent still
// works in /workspace and its files still come back, are diffed and committed, the same way.
Status InitRunRepo(const std::string& dir) {
  RETURN_IF_ERROR(MakeDirs(dir, 0700));
  return RunChecked({"/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "GIT_CONFIG_GLOBAL=/dev/null",
                     "GIT_CONFIG_NOSYSTEM=1", "git", "-c", "init.templateDir=", "init", "-q", dir});
}

bool CallerGone(channel::Stream& client) { return client.finished(); }

}  // namespace

void Daemon::ExpireIdleRuns() {
  for (;;) {
    std::vector<std::shared_ptr<AgentRun>> expired;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto tick = std::min<Clock::duration>(opts_.agent_idle, std::chrono::seconds(10));
      reaper_cv_.wait_for(lock, tick, [&] { return stopping_; });
      if (stopping_) return;
      auto now = Clock::now();
      for (auto it = runs_.begin(); it != runs_.end();) {
        AgentRun& r = *it->second;
        if (!r.busy && now - r.last_call_end >= opts_.agent_idle) {
          expired.push_back(it->second);
          it = runs_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& r : expired) {
      std::string why =
          "no call for " + std::to_string(opts_.agent_idle.count()) + " s: its VM was destroyed";
      LogInfo("agent", "run " + r->id + ": " + why);
      if (r->rec.outcome != "DONE") (void)DoDestroy({{"vm", r->rec.vm_id}});
      r->rec.state["expired"] = why;
      SaveRun(*r);
    }
  }
}

agent::Outcome Daemon::ProbeModel(agent::ModelClient& client) {
  const auto& s = client.settings();
  std::string key = s.provider + " " + s.base_url + " " + s.model;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = probes_.find(key);
    if (it != probes_.end()) return it->second;
  }
  agent::Outcome o = client.Probe(Clock::now() + std::chrono::minutes(5));
  LogInfo("agent", "context probe of " + s.provider + " model " + QuoteForMessage(s.model) + ": " +
                       (o.ok() ? "passed" : agent::FailureName(o.failure)));
  // A pass, or a window shown too small, is a fact about the model; anything else (the
  // server down, a 429) says nothing and is asked again next time.
  if (o.ok() || o.failure == agent::Failure::kContextTruncated) {
    std::lock_guard<std::mutex> lock(mu_);
    probes_[key] = o;
  }
  return o;
}

void Daemon::SaveRun(AgentRun& run) {
  run.rec.updated_at = store::NowSeconds();
  run.rec.transcript = Json::array();
  for (const auto& e : run.transcript) run.rec.transcript.push_back(agent::EntryToJson(e));
  Status st = store_->PutAgentRun(run.rec);
  if (!st.ok()) LogWarn("agent", "run " + run.id + ": could not save: " + st.message());
}

void Daemon::DoAgent(channel::Stream& client, const Json& req) {
  auto fail = [&](const Status& st) { (void)client.End(ErrorReply(st)); };
  for (const char* f : {"task", "image", "workspace", "verify"}) {
    Status st = CheckOptionalString(req, f);
    if (!st.ok()) return fail(st);
  }
  std::string task = req.value("task", "");
  if (task.empty()) return fail(InvalidArgument("'task' must be a non-empty string"));
  std::string image_name = req.value("image", "debian-12");
  Status st = ValidateName("image name", image_name);
  if (!st.ok()) return fail(st);
  std::string workspace = req.value("workspace", "");
  if (!workspace.empty() && workspace[0] != '/') {
    return fail(InvalidArgument("'workspace' must be an absolute path"));
  }
  auto limits = ParseLimits(req.value("limits", Json()));
  if (!limits.ok()) return fail(limits.status());
  auto settings = agent::ModelSettings::FromJson(req.value("model", Json()));
  if (!settings.ok()) return fail(settings.status().Annotate("model"));
  auto mclient = agent::ModelClient::Make(*settings);
  if (!mclient.ok()) return fail(mclient.status());
  // Checked before a VM is booted for nothing; the create checks again.
  auto allow = EgressAllowList(req);
  if (!allow.ok()) return fail(allow.status());

  agent::Outcome probe = ProbeModel(**mclient);
  if (!probe.ok()) {
    return fail(FailedPrecondition(std::string("the model did not pass the start-up probe (") +
                                   agent::FailureName(probe.failure) + "): " + probe.message));
  }

  auto run = std::make_shared<AgentRun>();
  run->id = NewId();
  run->settings = *settings;
  run->client = std::move(*mclient);
  run->rec.id = run->id;
  run->rec.created_at = store::NowSeconds();
  run->rec.outcome = "RUNNING";
  run->rec.state = {
      {"task", agent::SanitizeUtf8(task)},
      {"image", {{"name", image_name}}},
      {"allow", req.value("allow", Json::array())},
      {"profiles", req.value("profiles", Json::array())},
      {"caller_verify", req.value("verify", "")},
      {"workspace", workspace.empty() ? Json(nullptr) : Json(workspace)},
      {"model", run->settings.Describe()},
      {"usage", {{"turns", 0}, {"input_tokens", 0}, {"output_tokens", 0}, {"model_ms", 0}}},
      {"exec_tools", Json::object()}};
  auto progress = [&](const std::string& msg) {
    (void)client.SendEvent(
        {{"progress",
          {{"run", run->id}, {"turn", 0}, {"max_turns", limits->max_turns}, {"message", msg}}}});
  };

  // The workspace: the caller's working tree, or an empty repository of the run's own.
  std::string repo = workspace;
  if (repo.empty()) {
    repo = opts_.paths.state + "/runs/" + run->id + "/repo";
    st = InitRunRepo(repo);
    if (!st.ok()) return fail(st.Annotate("create the run's repository"));
  }
  run->rec.state["repo"] = repo;

  progress("starting a " + image_name + " VM");
  // Only the VM's fields: the request also holds the model key.
  Json create = {{"image", image_name},
                 {"memory_mib", req.value("memory_mib", kAgentMemoryMib)},
                 {"cpus", req.value("cpus", 1)},
                 {"cold", req.value("cold", false)},
                 {"allow", req.value("allow", Json::array())},
                 {"profiles", req.value("profiles", Json::array())}};
  Json created = DoCreate(create);
  if (!created.value("ok", false)) return (void)client.End(created);
  std::string vm_id = created["vm"]["id"];
  run->rec.vm_id = vm_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = vms_.find(vm_id);
    if (it != vms_.end()) run->rec.state["image"]["sha256"] = it->second->record.image_sha256;
  }
  progress("copying the workspace into VM " + vm_id);
  // The inject writes setup output to a stream; the caller sees progress events instead.
  auto e = Lookup({{"vm", vm_id}});
  if (!e.ok()) return fail(e.status());
  auto plan = ws::PlanInject(repo, ws::kDefaultQuotaBytes);
  auto recorded = plan.ok() ? InjectPlanned(**e, *plan, ws::kDefaultQuotaBytes)
                            : Result<store::WorkspaceRecord>(plan.status());
  if (!recorded.ok()) {
    (void)DoDestroy({{"vm", vm_id}});
    return fail(recorded.status());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    run->busy = true;
    runs_[run->id] = run;
  }
  (void)client.SendEvent({{"run", run->id}});
  auto setup = plan->manifest.find(ws::kSetupScript);
  if (setup != plan->manifest.end() && !setup->second.symlink) {
    progress("running " + std::string(ws::kSetupScript));
    Json greq = {{"op", "exec"},
                 {"argv", {"/bin/sh", std::string(ws::kGuestPath) + "/" + ws::kSetupScript}},
                 {"env", Json::object()},
                 {"cwd", ws::kGuestPath},
                 {"timeout_ms", 600000},
                 {"stdin", false}};
    std::string output;
    int64_t exec_id = 0;
    Json result = RunGuestExec(**e, greq, nullptr, false, &output, &exec_id);
    run->rec.state["exec_tools"][std::to_string(exec_id)] = "setup";
    (void)store_->SetWorkspaceSetup(vm_id, static_cast<int>(exec_id), output);
    if (result.value("outcome", "") != "exited" || result.value("exit_code", -1) != 0) {
      run->rec.outcome = "ERROR";
      run->rec.state["error"] = {{"kind", "setup_failed"},
                                 {"message", DescribeExec(result, output)}};
      run->rec.state["reason"] =
          std::string(ws::kSetupScript) + " failed; the agent was not started";
      (void)DoDestroy({{"vm", vm_id}});
    }
  }

  Entry first;
  first.kind = Entry::Kind::kUser;
  first.text = "Task:\n" + agent::SanitizeUtf8(task);
  if (!run->rec.state["caller_verify"].get<std::string>().empty()) {
    first.text +=
        "\n\nThe caller will check the result with this command, run from "
        "/workspace in a fresh VM: " +
        run->rec.state["caller_verify"].get<std::string>();
  }
  run->transcript.push_back(first);
  SaveRun(*run);
  Json end;
  if (run->rec.outcome == "ERROR") {
    end = {{"ok", true}, {"report", BuildReport(run->rec)}};
  } else {
    end = DriveRun(*run, client, req.value("limits", Json()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    run->busy = false;
    run->last_call_end = Clock::now();
    // A finished run, or one that never started, is only a record now.
    const Json& error = run->rec.state.contains("error") ? run->rec.state["error"] : Json();
    bool never_started = error.is_object() && error.value("kind", "") == "setup_failed";
    if (run->rec.outcome == "DONE" || never_started) runs_.erase(run->id);
  }
  end["text"] = agent::RenderReportText(end["report"]);
  (void)client.End(end);
}

void Daemon::DoAgentContinue(channel::Stream& client, const Json& req, bool answer) {
  auto fail = [&](const Status& st) { (void)client.End(ErrorReply(st)); };
  Status st = CheckOptionalString(req, "run");
  if (st.ok() && !req.contains("run")) st = InvalidArgument("missing field 'run'");
  std::string id = req.value("run", "");
  if (st.ok()) st = ValidateName("run id", id);
  if (st.ok() && answer) {
    st = CheckOptionalString(req, "answer");
    if (st.ok() && req.value("answer", "").empty()) {
      st = InvalidArgument("'answer' must be a non-empty string");
    }
  }
  if (!st.ok()) return fail(st);
  auto limits = ParseLimits(req.value("limits", Json()));
  if (!limits.ok()) return fail(limits.status());

  std::shared_ptr<AgentRun> run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(id);
    if (it != runs_.end()) {
      if (it->second->busy) {
        return fail(FailedPrecondition("run " + id + " is working on another call"));
      }
      run = it->second;
      run->busy = true;
    }
  }
  if (!run) {
    auto rec = store_->GetAgentRun(id);
    if (!rec.ok()) return fail(rec.status());
    if (!rec->has_value()) return fail(NotFound("no vm_agent run with id " + QuoteForMessage(id)));
    const store::AgentRunRecord& r = **rec;
    std::string want = answer ? "NEEDS_INPUT" : "IN_PROGRESS";
    if (r.outcome == "DONE") {
      return fail(FailedPrecondition("run " + id + " is DONE, not " + want));
    }
    if (r.state.contains("expired")) {
      return fail(FailedPrecondition("run " + id + " is " + r.outcome + " and expired (" +
                                     r.state["expired"].get<std::string>() + "); start a new run"));
    }
    return fail(FailedPrecondition("run " + id + " is " + r.outcome +
                                   " and its VM did not outlive the daemon that ran it; start a "
                                   "new run"));
  }
  auto release = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    run->busy = false;
    run->last_call_end = Clock::now();
  };
  const std::string& outcome = run->rec.outcome;
  std::string want = answer ? "NEEDS_INPUT" : "IN_PROGRESS";
  bool resumable =
      answer ? outcome == "NEEDS_INPUT" : (outcome == "IN_PROGRESS" || outcome == "ERROR");
  if (!resumable) {
    release();
    std::string hint = outcome == "NEEDS_INPUT" ? " (it asked a question: use agent_answer)"
                       : outcome == "IN_PROGRESS" || outcome == "ERROR" ? " (use agent_resume)"
                                                                        : "";
    return fail(FailedPrecondition("run " + id + " is " + outcome + ", not " + want + hint));
  }
  if (run->rec.state.contains("error") &&
      run->rec.state["error"].value("kind", "") == "setup_failed") {
    release();
    return fail(FailedPrecondition("run " + id + " never started: its setup hook failed"));
  }
  if (req.contains("model") && !req["model"].is_null()) {
    auto settings = agent::ModelSettings::FromJson(req["model"]);
    if (!settings.ok()) {
      release();
      return fail(settings.status().Annotate("model"));
    }
    auto mclient = agent::ModelClient::Make(*settings);
    if (!mclient.ok()) {
      release();
      return fail(mclient.status());
    }
    run->settings = *settings;
    run->client = std::move(*mclient);
    run->rec.state["model"] = run->settings.Describe();
  }
  if (answer) {
    // The answer is the result of the `ask` call; the calls after it were not run.
    Json pending = run->rec.state.value("pending", Json());
    Entry results;
    results.kind = Entry::Kind::kToolResults;
    auto parsed = agent::EntryFromJson(pending.value("results", Json()));
    if (parsed.ok()) results = *parsed;
    for (auto& r : results.results) {
      if (r.call_id == pending.value("ask_call_id", "")) {
        r.content =
            "The caller answered:\n" + agent::SanitizeUtf8(req["answer"].get<std::string>());
        r.is_error = false;
      }
    }
    run->transcript.push_back(results);
    run->rec.state.erase("pending");
    run->rec.state["answers"].push_back(agent::SanitizeUtf8(req["answer"].get<std::string>()));
    run->rec.state.erase("question");
  }
  run->rec.state.erase("reason");
  run->rec.state.erase("error");
  run->rec.outcome = "RUNNING";
  (void)client.SendEvent({{"run", run->id}});
  Json end = DriveRun(*run, client, req.value("limits", Json()));
  release();
  if (run->rec.outcome == "DONE") {
    std::lock_guard<std::mutex> lock(mu_);
    runs_.erase(run->id);
  }
  end["text"] = agent::RenderReportText(end["report"]);
  (void)client.End(end);
}

Json Daemon::DoAgentShow(const Json& req) {
  Status st = CheckOptionalString(req, "run");
  if (st.ok() && !req.contains("run")) st = InvalidArgument("missing field 'run'");
  std::string id = req.value("run", "");
  if (st.ok()) st = ValidateName("run id", id);
  if (!st.ok()) return ErrorReply(st);
  auto rec = store_->GetAgentRun(id);
  if (!rec.ok()) return ErrorReply(rec.status());
  if (!rec->has_value())
    return ErrorReply(NotFound("no vm_agent run with id " + QuoteForMessage(id)));
  Json report = BuildReport(**rec);
  return {{"ok", true}, {"report", report}, {"text", agent::RenderReportText(report)}};
}

Json Daemon::DriveRun(AgentRun& run, channel::Stream& client, const Json& limits_json) {
  Limits limits = *ParseLimits(limits_json);  // validated by the caller
  run.rec.state["limits"] = LimitsJson(limits);
  run.hit_wall_clock = false;
  const auto started = Clock::now();
  const auto deadline = started + std::chrono::seconds(limits.wall_clock_s);
  Json& usage = run.rec.state["usage"];
  int turns = 0;
  int64_t tokens = 0;
  auto progress = [&](const std::string& msg) {
    if (!client
             .SendEvent({{"progress",
                          {{"run", run.id},
                           {"turn", turns},
                           {"max_turns", limits.max_turns},
                           {"message", msg}}}})
             .ok()) {
      LogInfo("agent", "run " + run.id + ": the caller is gone");
    }
  };
  // Each turn's time, split: the model request, the commands' own run time (as the guest
  // measured it), and the rest, which is the daemon's overhead (tools' plumbing, the store,
  // the transcript). A turn ends where the next begins, so the saves between are counted.
  std::optional<Clock::time_point> turn_start;
  double turn_model_ms = 0;
  auto close_turn = [&] {
    if (!turn_start) return;
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - *turn_start).count();
    Json& log = run.rec.state["turn_times"];
    if (!log.is_array()) log = Json::array();
    log.push_back({{"turn", usage["turns"]},
                   {"ms", ms},
                   {"model_ms", turn_model_ms},
                   {"command_ms", run.command_ms},
                   {"overhead_ms", ms - turn_model_ms - run.command_ms}});
    if (log.size() > 200) log.erase(log.begin());
    turn_start.reset();
  };
  auto stop = [&](const std::string& outcome, const std::string& reason) {
    close_turn();
    run.rec.outcome = outcome;
    run.rec.state["reason"] = reason;
    SaveRun(run);
    return Json{{"ok", true}, {"report", BuildReport(run.rec)}};
  };

  for (;;) {
    close_turn();
    auto vm = Lookup({{"vm", run.rec.vm_id}});
    if (!vm.ok() || !(*vm)->vm->alive()) {
      run.rec.state["error"] = {{"kind", "vm_lost"},
                                {"message", vm.ok() ? "the VM died: " + (*vm)->vm->death_reason()
                                                    : vm.status().message()}};
      return stop("ERROR", "the run's VM is gone");
    }
    if (CallerGone(client)) {
      return stop("IN_PROGRESS", "the caller went away; resume to continue");
    }
    if (turns >= limits.max_turns) {
      return stop("IN_PROGRESS", "reached the limit of " + std::to_string(limits.max_turns) +
                                     " model turns for this call");
    }
    if (tokens >= limits.max_tokens) {
      return stop("IN_PROGRESS", "used " + std::to_string(tokens) + " tokens, the limit for " +
                                     "this call is " + std::to_string(limits.max_tokens));
    }
    if (Clock::now() >= deadline || run.hit_wall_clock) {
      run.hit_wall_clock = false;
      return stop("IN_PROGRESS", "ran past the wall clock of " +
                                     std::to_string(limits.wall_clock_s) + " s for this call");
    }

    ++turns;
    turn_start = Clock::now();
    run.command_ms = 0;
    progress("turn " + std::to_string(turns) + ": asking the model");
    auto t0 = Clock::now();
    agent::Outcome o =
        run.client->Send(agent::SystemPrompt(), run.transcript, agent::AgentTools(), deadline);
    turn_model_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    int64_t model_ms = static_cast<int64_t>(turn_model_ms);
    usage["turns"] = usage["turns"].get<int64_t>() + 1;
    usage["model_ms"] = usage["model_ms"].get<int64_t>() + model_ms;
    if (!o.ok()) {
      if (o.failure == agent::Failure::kTimeout && Clock::now() >= deadline) {
        return stop("IN_PROGRESS", "ran past the wall clock of " +
                                       std::to_string(limits.wall_clock_s) +
                                       " s while waiting for the model");
      }
      run.rec.state["error"] = {{"kind", agent::FailureName(o.failure)},
                                {"message", agent::SanitizeUtf8(o.message)},
                                {"http_status", o.http_status},
                                {"attempts", o.attempts}};
      return stop("ERROR",
                  std::string("the model request failed (") + agent::FailureName(o.failure) + ")");
    }
    usage["input_tokens"] = usage["input_tokens"].get<int64_t>() + o.reply.usage.input_tokens;
    usage["output_tokens"] = usage["output_tokens"].get<int64_t>() + o.reply.usage.output_tokens;
    tokens += o.reply.usage.input_tokens + o.reply.usage.output_tokens;

    Entry reply;
    reply.kind = Entry::Kind::kAssistant;
    reply.text = agent::SanitizeUtf8(o.reply.text);
    reply.calls = o.reply.calls;
    run.transcript.push_back(reply);
    if (reply.calls.empty()) {
      // A model that answers in prose without finishing is told how to end, once per turn.
      Entry nudge;
      nudge.kind = Entry::Kind::kUser;
      nudge.text =
          "Use the tools to work in the VM. When you are done, call finish with a summary "
          "and a verification command; to ask the caller something, call ask.";
      run.transcript.push_back(nudge);
      SaveRun(run);
      continue;
    }

    Entry results;
    results.kind = Entry::Kind::kToolResults;
    bool paused = false, finished = false;
    std::string ask_call, question, summary, agent_verify;
    for (const auto& call : reply.calls) {
      ToolResult r{call.id, call.name, "", false};
      if (paused || finished) {
        r.content = "not run: an earlier call in this turn (" +
                    std::string(paused ? "ask" : "finish") + ") ended the turn";
        r.is_error = true;
        results.results.push_back(r);
        continue;
      }
      auto args = agent::ParseToolCall(call);
      if (!args.ok()) {
        progress("turn " + std::to_string(turns) + ": malformed " + QuoteForMessage(call.name) +
                 " call, told the model");
        r.content = args.status().message();
        r.is_error = true;
      } else if (auto* ask = std::get_if<agent::AskArgs>(&*args)) {
        paused = true;
        ask_call = call.id;
        question = ask->question;
        r.content = "(waiting for the caller's answer)";
      } else if (auto* fin = std::get_if<agent::FinishArgs>(&*args)) {
        finished = true;
        summary = fin->summary;
        agent_verify = fin->verify_command;
        r.content = "finished";
      } else {
        progress("turn " + std::to_string(turns) + ": " + call.name);
        r = RunTool(run, **vm, call, *args, deadline);
      }
      results.results.push_back(r);
    }
    if (paused) {
      bool cut = false;
      run.rec.state["question"] = {
          {"text", agent::CapChars(question, agent::kMaxQuestionChars, &cut)}, {"truncated", cut}};
      run.rec.state["pending"] = {{"ask_call_id", ask_call},
                                  {"results", agent::EntryToJson(results)}};
      return stop("NEEDS_INPUT", "the agent asked a question");
    }
    run.transcript.push_back(results);
    if (finished) {
      close_turn();
      progress("finished: collecting /workspace and re-running the verification");
      FinishRun(run, client, summary, agent_verify);
      run.rec.state.erase("reason");
      SaveRun(run);
      return {{"ok", true}, {"report", BuildReport(run.rec)}};
    }
    SaveRun(run);
  }
}

ToolResult Daemon::RunTool(AgentRun& run, VmEntry& vm, const ToolCall& call,
                           const agent::ToolArgs& args, Clock::time_point deadline) {
  ToolResult r{call.id, call.name, "", false};
  auto exec = [&](const Json& argv, int timeout_s, const std::string& tool, std::string* out) {
    // A command never runs past the call's wall clock; one cut there ends the call.
    int64_t left_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    int64_t timeout_ms = int64_t{timeout_s} * 1000;
    bool capped = left_ms < timeout_ms;
    if (capped) timeout_ms = std::max<int64_t>(left_ms, 100);
    Json greq = {{"op", "exec"},
                 {"argv", argv},
                 {"env", Json::object()},
                 {"cwd", ws::kGuestPath},
                 {"timeout_ms", timeout_ms},
                 {"stdin", false}};
    int64_t exec_id = 0;
    Json result = RunGuestExec(vm, greq, nullptr, false, out, &exec_id);
    run.rec.state["exec_tools"][std::to_string(exec_id)] = tool;
    if (capped && result.value("outcome", "") == "timed_out") run.hit_wall_clock = true;
    if (result.contains("duration_ms") && result["duration_ms"].is_number()) {
      run.command_ms += result["duration_ms"].get<double>();
    }
    return result;
  };
  if (auto* a = std::get_if<agent::RunArgs>(&args)) {
    std::string out;
    Json result = exec({"/bin/sh", "-c", a->command}, a->timeout_s, "run", &out);
    r.content = DescribeExec(result, out);
    r.is_error = result.value("outcome", "") != "exited";
    return r;
  }
  if (auto* a = std::get_if<agent::ListArgs>(&args)) {
    auto path = agent::GuestPath(a->path);
    if (!path.ok()) return {call.id, call.name, "list_dir: " + path.status().message(), true};
    std::string out;
    Json result = exec({"ls", "-la", "--", *path}, 30, "list_dir", &out);
    // `ls` output of a huge directory is capped like any other result.
    r.content = DescribeExec(result, out);
    r.is_error = result.value("outcome", "") != "exited" || result.value("exit_code", 1) != 0;
    return r;
  }
  if (auto* a = std::get_if<agent::WriteArgs>(&args)) {
    auto path = agent::GuestPath(a->path);
    if (!path.ok()) return {call.id, call.name, "write_file: " + path.status().message(), true};
    auto guest = vm.vm->Open(
        {{"op", "put"}, {"path", *path}, {"kind", "file"}, {"mode", a->mode}, {"mkdirs", true}});
    Status st = guest.ok() ? Status::Ok() : guest.status();
    if (st.ok()) st = (*guest)->Write(channel::kChanIn, a->content);
    if (st.ok()) st = (*guest)->CloseWrite(channel::kChanIn);
    Json end;
    while (st.ok()) {
      auto m = (*guest)->Next();
      if (!m.ok()) {
        st = m.status();
      } else if (m->kind == Kind::kEnd) {
        end = NormalizeGuestEnd(m->body);
        break;
      } else if (m->kind == Kind::kReset) {
        st = Unavailable("the guest aborted the write");
      }
    }
    if (!st.ok()) return {call.id, call.name, "write_file: " + st.message(), true};
    if (!end.value("ok", false)) {
      return {call.id, call.name,
              "write_file " + *path + ": " +
                  agent::SanitizeUtf8(end["error"].value("message", std::string("failed"))),
              true};
    }
    r.content = "wrote " + std::to_string(a->content.size()) + " bytes to " + *path;
    return r;
  }
  if (auto* a = std::get_if<agent::ReadArgs>(&args)) {
    auto path = agent::GuestPath(a->path);
    if (!path.ok()) return {call.id, call.name, "read_file: " + path.status().message(), true};
    auto guest = vm.vm->Open({{"op", "get"}, {"path", *path}});
    if (!guest.ok()) return {call.id, call.name, "read_file: " + guest.status().message(), true};
    std::string data;
    int64_t size = -1;
    std::string kind;
    bool cut = false;
    for (;;) {
      auto m = (*guest)->Next();
      if (!m.ok()) return {call.id, call.name, "read_file: " + m.status().message(), true};
      if (m->kind == Kind::kEvent && m->body.contains("meta")) {
        size = m->body["meta"].value("size", int64_t{-1});
        kind = m->body["meta"].value("kind", "");
        if (kind != "file") {
          (void)(*guest)->Reset("not a file");
          return {call.id, call.name,
                  "read_file: " + *path + " is a " + (kind.empty() ? "non-file" : kind) +
                      ", not a regular file (use list_dir for a directory)",
                  true};
        }
      } else if (m->kind == Kind::kData) {
        data += m->data;
        if (static_cast<int64_t>(data.size()) > a->max_bytes) {
          cut = true;
          data.resize(static_cast<size_t>(a->max_bytes));
          (void)(*guest)->Reset("read cap reached");
          break;
        }
      } else if (m->kind == Kind::kEnd) {
        Json end = NormalizeGuestEnd(m->body);
        if (!end.value("ok", false)) {
          return {call.id, call.name,
                  "read_file " + *path + ": " +
                      agent::SanitizeUtf8(end["error"].value("message", std::string("failed"))),
                  true};
        }
        break;
      } else if (m->kind == Kind::kReset) {
        return {call.id, call.name, "read_file: the guest aborted the read", true};
      }
    }
    r.content = agent::SanitizeUtf8(data);
    if (cut) {
      r.content += "\n[... cut at " + std::to_string(a->max_bytes) + " bytes of " +
                   (size >= 0 ? std::to_string(size) : std::string("more")) + " ...]";
    }
    return r;
  }
  return {call.id, call.name, "this tool is not run here", true};
}

void Daemon::FinishRun(AgentRun& run, channel::Stream& client, const std::string& summary,
                       const std::string& agent_verify) {
  Json& state = run.rec.state;
  bool cut = false;
  state["claim"] = {{"summary", agent::CapChars(summary, agent::kMaxSummaryChars, &cut)},
                    {"truncated", cut},
                    {"status", "unverified"}};
  std::string caller_verify = state.value("caller_verify", "");
  std::string verify = caller_verify.empty() ? agent_verify : caller_verify;
  state["agent_verify"] = agent_verify;

  // 1. The agent's /workspace comes back, is diffed and committed on trybox/<run-id>.
  std::string collected = opts_.paths.state + "/runs/" + run.id + "/collected";
  (void)RemoveTree(collected);
  (void)MakeDirs(opts_.paths.state + "/runs/" + run.id, 0700);
  Json c = DoCollect({{"vm", run.rec.vm_id},
                      {"into", collected},
                      {"commit", true},
                      {"branch_id", run.id},
                      {"command", "vm_agent run " + run.id + ": " + FirstLine(state["task"])}});
  bool have_tree = c.value("ok", false);
  if (have_tree) {
    state["collect_id"] = c["collect"]["id"];
  } else {
    state["files_note"] = c["error"].value("message", std::string("the collect failed"));
  }
  // 2. The agent's VM is done with.
  Json d = DoDestroy({{"vm", run.rec.vm_id}});
  (void)d;

  // 3. The supervisor re-runs the verification in a fresh VM from the collected tree.
  if (verify.empty()) {
    state["verdict"] = "UNVERIFIED";
  } else if (!have_tree) {
    state["verdict"] = "FAILED_VERIFICATION";
    state["verification"] = {{"command", verify},
                             {"source", caller_verify.empty() ? "agent" : "caller"},
                             {"outcome", "not_run"},
                             {"error",
                              "the workspace could not be collected, so there was "
                              "nothing to re-run the verification on"}};
  } else {
    (void)client.SendEvent({{"progress",
                             {{"run", run.id},
                              {"turn", state["usage"]["turns"]},
                              {"message", "verifying in a fresh VM"}}}});
    Json v = {{"command", verify}, {"source", caller_verify.empty() ? "agent" : "caller"}};
    Json create = {{"image", state["image"]["name"]},
                   {"memory_mib", kAgentMemoryMib},
                   {"allow", state.value("allow", Json::array())},
                   {"profiles", state.value("profiles", Json::array())}};
    Json created = DoCreate(create);
    if (!created.value("ok", false)) {
      v["outcome"] = "not_run";
      v["error"] = "could not start the verification VM: " +
                   created["error"].value("message", std::string());
    } else {
      std::string vid = created["vm"]["id"];
      v["vm"] = vid;
      state["verify_vm"] = vid;
      auto e = Lookup({{"vm", vid}});
      auto excludes = ws::ExcludesFromLines({});
      Status st = e.ok() ? Status::Ok() : e.status();
      Result<ws::Manifest> m = ws::Manifest();
      if (st.ok()) m = ws::ManifestFromTree(collected, *excludes);
      if (st.ok() && !m.ok()) st = m.status();
      if (st.ok()) st = SendTree(**e, collected, *m);
      if (!st.ok()) {
        v["outcome"] = "not_run";
        v["error"] = "could not copy the collected workspace in: " + st.message();
      } else {
        std::string out;
        if (m->count(ws::kSetupScript)) {
          Json sreq = {{"op", "exec"},
                       {"argv", {"/bin/sh", std::string(ws::kGuestPath) + "/" + ws::kSetupScript}},
                       {"env", Json::object()},
                       {"cwd", ws::kGuestPath},
                       {"timeout_ms", kVerifyTimeoutS * 1000},
                       {"stdin", false}};
          (void)RunGuestExec(**e, sreq, nullptr, false, &out, nullptr);
          out.clear();
        }
        Json greq = {{"op", "exec"},
                     {"argv", {"/bin/sh", "-c", verify}},
                     {"env", Json::object()},
                     {"cwd", ws::kGuestPath},
                     {"timeout_ms", kVerifyTimeoutS * 1000},
                     {"stdin", false}};
        int64_t exec_id = 0;
        Json result = RunGuestExec(**e, greq, nullptr, false, &out, &exec_id);
        for (const char* k : {"outcome", "exit_code", "signal", "duration_ms", "timeout_ms"}) {
          if (result.contains(k)) v[k] = result[k];
        }
        if (result.contains("message"))
          v["error"] = agent::SanitizeUtf8(result.value("message", std::string()));
        if (result.contains("error") && result["error"].is_string()) {
          v["error"] = agent::SanitizeUtf8(result["error"].get<std::string>() + ": " +
                                           result.value("message", std::string()));
        }
        v["exec_id"] = exec_id;
        bool tcut = false;
        std::string tail = agent::CapTail(out, kVerifyTailBytes, &tcut);
        v["output_tail"] = tail;
        v["output_tail_bytes"] = std::min(out.size(), kVerifyTailBytes);
        v["output_bytes"] = out.size();
      }
      (void)DoDestroy({{"vm", vid}});
    }
    bool passed = v.value("outcome", "") == "exited" && v.value("exit_code", -1) == 0;
    state["verification"] = v;
    state["verdict"] = passed ? "VERIFIED" : "FAILED_VERIFICATION";
    if (!passed) state["claim"]["status"] = "contradicted";
  }
  (void)RemoveTree(collected);
  run.rec.outcome = "DONE";
}

Json Daemon::BuildReport(const store::AgentRunRecord& rec) {
  const Json& s = rec.state;
  Json r = {{"schema", agent::kReportSchema},
            {"run", rec.id},
            {"outcome", rec.outcome},
            {"task", s.value("task", "")},
            {"image", s.value("image", Json::object())},
            {"model", s.value("model", Json::object())},
            {"usage", s.value("usage", Json::object())},
            {"limits", s.value("limits", Json())},
            {"created_at", rec.created_at},
            {"updated_at", rec.updated_at}};
  if (rec.outcome == "DONE") r["verdict"] = s.value("verdict", "UNVERIFIED");
  if (s.contains("reason")) r["reason"] = s["reason"];
  if (s.contains("error")) r["error"] = s["error"];
  // The VM's state as the daemon knows it now.
  std::string vm_state = "unknown";
  if (auto v = store_->GetVm(rec.vm_id); v.ok() && v->has_value()) vm_state = (*v)->state;
  r["vm"] = {{"id", rec.vm_id}, {"state", vm_state}};

  Json commands = Json::array();
  const Json& tools = s.value("exec_tools", Json::object());
  if (auto execs = store_->ListExecs(rec.vm_id); execs.ok()) {
    for (const auto& e : *execs) {
      commands.push_back(ExecJson(e, tools.value(std::to_string(e.id), "exec")));
    }
  }
  r["commands"] = commands;

  r["files"] = nullptr;
  r["commit"] = nullptr;
  if (s.contains("collect_id")) {
    if (auto c = store_->LatestCollect(rec.vm_id); c.ok() && c->has_value()) {
      const store::CollectRecord& cr = **c;
      Json counts = {
          {"added", 0}, {"modified", 0}, {"deleted", 0}, {"mode_changed", 0}, {"renamed", 0}};
      for (const auto& ch : cr.changes) {
        std::string k = ch.value("change", "");
        if (counts.contains(k)) counts[k] = counts[k].get<int>() + 1;
      }
      r["files"] = {{"counts", counts},
                    {"changes", cr.changes},
                    {"files", cr.files},
                    {"bytes", cr.bytes},
                    {"skipped", cr.skipped}};
      if (!cr.commit.empty()) {
        r["commit"] = {{"sha", cr.commit}, {"branch", cr.branch}, {"repo", s.value("repo", "")}};
      } else {
        r["commit_note"] = cr.note;
      }
    }
  } else if (s.contains("files_note")) {
    r["files_note"] = s["files_note"];
  }
  if (s.contains("verification")) {
    Json v = s["verification"];
    // The re-run's own record, if it was recorded.
    r["verification"] = v;
  }
  if (s.contains("question")) r["question"] = s["question"];
  if (s.contains("claim")) r["claim"] = s["claim"];
  if (s.contains("answers")) r["answers"] = s["answers"];
  if (s.contains("turn_times")) r["turn_times"] = s["turn_times"];
  if (s.contains("expired")) r["expired"] = s["expired"];
  return r;
}

}  // namespace trybox::daemon
