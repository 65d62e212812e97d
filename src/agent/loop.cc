#include "agent/loop.h"

#include <optional>

#include "agent/text.h"
#include "agent/tools.h"
#include "util/names.h"

namespace trybox::agent {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

int64_t JsonInt(const Json& j, const char* key, int64_t fallback) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return fallback;
  return j[key].get<int64_t>();
}

std::string JsonString(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
  return j[key].get<std::string>();
}

class Turn {
 public:
  Turn(RunVm& vm, Clock::time_point deadline) : vm_(vm), deadline_(deadline) {}

  // Runs one tool call; returns the result for the model.
  ToolResult Run(const ToolCall& call, const ToolArgs& args);

  bool hit_wall_clock() const { return hit_wall_clock_; }
  double command_ms() const { return command_ms_; }

 private:
  Result<Json> Exec(const std::vector<std::string>& argv, int timeout_s, const std::string& tool,
                    std::string* out);

  RunVm& vm_;
  const Clock::time_point deadline_;
  bool hit_wall_clock_ = false;
  double command_ms_ = 0;
};

Result<Json> Turn::Exec(const std::vector<std::string>& argv, int timeout_s,
                        const std::string& tool, std::string* out) {
  // A command never runs past the call's wall clock; one cut there ends the call.
  int64_t left_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
  int64_t timeout_ms = int64_t{timeout_s} * 1000;
  bool capped = left_ms < timeout_ms;
  if (capped) timeout_ms = std::max<int64_t>(left_ms, 100);
  ASSIGN_OR_RETURN(Json result, vm_.Exec(argv, timeout_ms, tool, out));
  if (capped && JsonString(result, "outcome") == "timed_out") hit_wall_clock_ = true;
  command_ms_ += static_cast<double>(JsonInt(result, "duration_ms", 0));
  return result;
}

ToolResult Turn::Run(const ToolCall& call, const ToolArgs& args) {
  auto error = [&](const std::string& text) { return ToolResult{call.id, call.name, text, true}; };
  if (auto* a = std::get_if<RunArgs>(&args)) {
    std::string out;
    auto result = Exec({"/bin/sh", "-c", a->command}, a->timeout_s, "run", &out);
    if (!result.ok()) return error("run: " + result.status().message());
    return {call.id, call.name, DescribeExec(*result, out),
            JsonString(*result, "outcome") != "exited"};
  }
  if (auto* a = std::get_if<ListArgs>(&args)) {
    auto path = GuestPath(a->path);
    if (!path.ok()) return error("list_dir: " + path.status().message());
    std::string out;
    auto result = Exec({"ls", "-la", "--", *path}, 30, "list_dir", &out);
    if (!result.ok()) return error("list_dir: " + result.status().message());
    // `ls` output of a huge directory is capped like any other result.
    return {call.id, call.name, DescribeExec(*result, out),
            JsonString(*result, "outcome") != "exited" || JsonInt(*result, "exit_code", 1) != 0};
  }
  if (auto* a = std::get_if<WriteArgs>(&args)) {
    auto path = GuestPath(a->path);
    if (!path.ok()) return error("write_file: " + path.status().message());
    Status st = vm_.WriteFile(*path, a->content, a->mode);
    if (!st.ok()) return error("write_file " + *path + ": " + SanitizeUtf8(st.message()));
    return {call.id, call.name, "wrote " + std::to_string(a->content.size()) + " bytes to " + *path,
            false};
  }
  if (auto* a = std::get_if<ReadArgs>(&args)) {
    auto path = GuestPath(a->path);
    if (!path.ok()) return error("read_file: " + path.status().message());
    auto r = vm_.ReadFile(*path, a->max_bytes);
    if (!r.ok()) {
      std::string hint =
          r.status().code() == Code::kFailedPrecondition ? " (use list_dir for a directory)" : "";
      return error("read_file " + *path + ": " + SanitizeUtf8(r.status().message()) + hint);
    }
    std::string content = SanitizeUtf8(r->data);
    if (r->truncated) {
      content += "\n[... cut at " + std::to_string(a->max_bytes) + " bytes of " +
                 (r->size >= 0 ? std::to_string(r->size) : std::string("more")) + " ...]";
    }
    return {call.id, call.name, content, false};
  }
  return error("this tool is not run here");
}

}  // namespace

std::string DescribeExec(const Json& result, const std::string& output) {
  std::string o = JsonString(result, "outcome");
  std::string head;
  if (o == "exited") {
    head = "exit code " + std::to_string(JsonInt(result, "exit_code", -1));
  } else if (o == "signaled") {
    head = "killed by signal " + std::to_string(JsonInt(result, "signal", 0));
  } else if (o == "timed_out") {
    head = "timed out after " + std::to_string(JsonInt(result, "timeout_ms", 0) / 1000) +
           " s and was killed";
  } else if (o == "error") {
    head = "could not run: " + JsonString(result, "error") + ": " + JsonString(result, "message");
  } else {
    head = o + ": " + JsonString(result, "message");
  }
  if (result.is_object() && result.contains("duration_ms")) {
    head += " (" + std::to_string(JsonInt(result, "duration_ms", 0)) + " ms)";
  }
  bool cut = false;
  std::string body = CapMiddle(output, kMaxToolResultBytes, &cut);
  return head + "\n--- output (stdout and stderr" +
         (cut ? ", " + std::to_string(output.size()) + " bytes, middle cut" : "") + ") ---\n" +
         SanitizeUtf8(body);
}

LoopResult RunLoop(ModelClient& model, RunVm& vm, RunEvents& events, LoopState& state,
                   const LoopLimits& limits, const std::string& system_prompt) {
  const auto deadline = Clock::now() + std::chrono::seconds(limits.wall_clock_s);
  int turns = 0;
  int64_t tokens = 0;
  bool hit_wall_clock = false;
  std::optional<Clock::time_point> turn_start;
  double turn_model_ms = 0, turn_command_ms = 0;
  auto close_turn = [&] {
    if (!turn_start) return;
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - *turn_start).count();
    state.turn_times.push_back({state.usage.turns, ms, turn_model_ms, turn_command_ms,
                                ms - turn_model_ms - turn_command_ms});
    if (state.turn_times.size() > 200) state.turn_times.erase(state.turn_times.begin());
    turn_start.reset();
  };
  auto stop = [&](LoopResult::End end, const std::string& reason) {
    close_turn();
    LoopResult r;
    r.end = end;
    r.reason = reason;
    return r;
  };
  auto wall_clock = [&](const std::string& what) {
    return stop(LoopResult::End::kInProgress, "ran past the wall clock of " +
                                                  std::to_string(limits.wall_clock_s) +
                                                  " s for this call" + what);
  };

  for (;;) {
    close_turn();
    if (Status st = vm.Check(); !st.ok()) {
      LoopResult r = stop(LoopResult::End::kError, "the run's VM is gone");
      r.error_kind = "vm_lost";
      r.error_message = st.message();
      return r;
    }
    if (events.Stopped()) {
      return stop(LoopResult::End::kInProgress, "the caller went away; resume to continue");
    }
    if (turns >= limits.max_turns) {
      return stop(LoopResult::End::kInProgress, "reached the limit of " +
                                                    std::to_string(limits.max_turns) +
                                                    " model turns for this call");
    }
    if (tokens >= limits.max_tokens) {
      return stop(LoopResult::End::kInProgress, "used " + std::to_string(tokens) +
                                                    " tokens, the limit for this call is " +
                                                    std::to_string(limits.max_tokens));
    }
    if (Clock::now() >= deadline || hit_wall_clock) return wall_clock("");

    ++turns;
    turn_start = Clock::now();
    turn_command_ms = 0;
    events.Progress(turns, limits.max_turns,
                    "turn " + std::to_string(turns) + ": asking the model");
    auto t0 = Clock::now();
    Outcome o = model.Send(system_prompt, state.transcript, AgentTools(), deadline);
    turn_model_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    state.usage.turns += 1;
    state.usage.model_ms += static_cast<int64_t>(turn_model_ms);
    if (!o.ok()) {
      if (o.failure == Failure::kTimeout && Clock::now() >= deadline) {
        return wall_clock(" while waiting for the model");
      }
      LoopResult r = stop(LoopResult::End::kError,
                          std::string("the model request failed (") + FailureName(o.failure) + ")");
      r.error_kind = FailureName(o.failure);
      r.error_message = SanitizeUtf8(o.message);
      r.http_status = o.http_status;
      r.attempts = o.attempts;
      return r;
    }
    state.usage.input_tokens += o.reply.usage.input_tokens;
    state.usage.output_tokens += o.reply.usage.output_tokens;
    tokens += o.reply.usage.input_tokens + o.reply.usage.output_tokens;

    Entry reply;
    reply.kind = Entry::Kind::kAssistant;
    reply.text = SanitizeUtf8(o.reply.text);
    reply.calls = o.reply.calls;
    state.transcript.push_back(reply);
    if (reply.calls.empty()) {
      // A model that answers in prose without finishing is told how to end, once per turn.
      Entry nudge;
      nudge.kind = Entry::Kind::kUser;
      nudge.text =
          "Use the tools to work in the VM. When you are done, call finish with a summary "
          "and a verification command; to ask the caller something, call ask.";
      state.transcript.push_back(nudge);
      events.Save(state);
      continue;
    }

    Entry results;
    results.kind = Entry::Kind::kToolResults;
    Turn turn(vm, deadline);
    bool paused = false, finished = false;
    LoopResult out;
    for (const auto& call : reply.calls) {
      ToolResult r{call.id, call.name, "", false};
      if (paused || finished) {
        r.content = "not run: an earlier call in this turn (" +
                    std::string(paused ? "ask or request_network" : "finish") + ") ended the turn";
        r.is_error = true;
        results.results.push_back(r);
        continue;
      }
      auto args = ParseToolCall(call);
      if (!args.ok()) {
        events.Progress(turns, limits.max_turns,
                        "turn " + std::to_string(turns) + ": malformed " +
                            QuoteForMessage(call.name) + " call, told the model");
        r.content = args.status().message();
        r.is_error = true;
      } else if (auto* ask = std::get_if<AskArgs>(&*args)) {
        paused = true;
        out.ask_call_id = call.id;
        out.question = CapChars(ask->question, kMaxQuestionChars, &out.question_truncated);
        r.content = "(waiting for the caller's answer)";
      } else if (auto* net = std::get_if<NetworkArgs>(&*args)) {
        events.Progress(turns, limits.max_turns,
                        "turn " + std::to_string(turns) + ": request_network " +
                            QuoteForMessage(net->host) + ":" + std::to_string(net->port));
        auto d = vm.RequestNetwork(net->host, net->port, net->reason);
        if (!d.ok()) {
          r.content = "request_network: " + SanitizeUtf8(d.status().message());
          r.is_error = true;
        } else if (d->decision == "ask") {
          paused = true;
          out.ask_call_id = call.id;
          out.question = SanitizeUtf8(d->message);
          out.approval = NetworkRequest{net->host, net->port, net->reason};
          r.content = "(waiting for a person to approve or refuse)";
        } else {
          r.content = SanitizeUtf8(d->message);
          r.is_error = d->decision != "granted";
        }
      } else if (auto* fin = std::get_if<FinishArgs>(&*args)) {
        finished = true;
        out.summary = fin->summary;
        out.verify_command = fin->verify_command;
        r.content = "finished";
      } else {
        std::string what = "turn " + std::to_string(turns) + ": " + call.name;
        // The command itself, so that a caller watching progress sees what runs now.
        if (auto* run = std::get_if<RunArgs>(&*args)) {
          what += ": " + CapHead(run->command.substr(0, run->command.find('\n')), 120);
        }
        events.Progress(turns, limits.max_turns, what);
        r = turn.Run(call, *args);
      }
      results.results.push_back(r);
    }
    turn_command_ms = turn.command_ms();
    hit_wall_clock = turn.hit_wall_clock();
    if (paused) {
      close_turn();
      out.end = LoopResult::End::kNeedsInput;
      out.reason = out.approval ? "the agent asked for network access; a person decides"
                                : "the agent asked a question";
      out.pending = results;
      return out;
    }
    state.transcript.push_back(results);
    if (finished) {
      close_turn();
      out.end = LoopResult::End::kFinished;
      return out;
    }
    events.Save(state);
  }
}

}  // namespace trybox::agent
