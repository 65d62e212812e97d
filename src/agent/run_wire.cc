#include "agent/run_wire.h"

#include "agent/text.h"
#include "util/json.h"

namespace trybox::agent {
namespace {

constexpr size_t kMaxText = 64 * 1024;

Status Need(const Json& j, const char* key, bool (Json::*is)() const noexcept, const char* what) {
  if (!j.is_object() || !j.contains(key) || !(j[key].*is)()) {
    return InvalidArgument(std::string("'") + key + "' must be " + what);
  }
  return Status::Ok();
}

Result<int64_t> NeedInt(const Json& j, const char* key, int64_t lo, int64_t hi) {
  RETURN_IF_ERROR(Need(j, key, &Json::is_number_integer, "an integer"));
  int64_t v = IntOr(j, key, lo - 1);
  if (v < lo || v > hi) return InvalidArgument(std::string("'") + key + "' is out of range");
  return v;
}

Result<std::string> NeedText(const Json& j, const char* key) {
  RETURN_IF_ERROR(Need(j, key, &Json::is_string, "a string"));
  return CapHead(SanitizeUtf8(j[key].get<std::string>()), kMaxText);
}

}  // namespace

Json UsageToJson(const RunUsage& u) {
  return {{"turns", u.turns},
          {"input_tokens", u.input_tokens},
          {"output_tokens", u.output_tokens},
          {"model_ms", u.model_ms}};
}

Result<RunUsage> UsageFromJson(const Json& j) {
  RunUsage u;
  ASSIGN_OR_RETURN(u.turns, NeedInt(j, "turns", 0, INT64_MAX));
  ASSIGN_OR_RETURN(u.input_tokens, NeedInt(j, "input_tokens", 0, INT64_MAX));
  ASSIGN_OR_RETURN(u.output_tokens, NeedInt(j, "output_tokens", 0, INT64_MAX));
  ASSIGN_OR_RETURN(u.model_ms, NeedInt(j, "model_ms", 0, INT64_MAX));
  return u;
}

Json TurnTimesToJson(const std::vector<TurnTime>& times) {
  Json a = Json::array();
  for (const auto& t : times) {
    a.push_back({{"turn", t.turn},
                 {"ms", t.ms},
                 {"model_ms", t.model_ms},
                 {"command_ms", t.command_ms},
                 {"overhead_ms", t.overhead_ms}});
  }
  return a;
}

Result<std::vector<TurnTime>> TurnTimesFromJson(const Json& j) {
  if (!j.is_array() || j.size() > 200) {
    return InvalidArgument("'turn_times' must be an array of at most 200");
  }
  std::vector<TurnTime> out;
  for (const auto& t : j) {
    if (!t.is_object()) return InvalidArgument("'turn_times' entries must be objects");
    out.push_back({IntOr(t, "turn"), NumOr(t, "ms"), NumOr(t, "model_ms"), NumOr(t, "command_ms"),
                   NumOr(t, "overhead_ms")});
  }
  return out;
}

Json LimitsToJson(const LoopLimits& l) {
  return {
      {"max_turns", l.max_turns}, {"wall_clock_s", l.wall_clock_s}, {"max_tokens", l.max_tokens}};
}

Result<LoopLimits> LimitsFromJson(const Json& j) {
  LoopLimits l;
  ASSIGN_OR_RETURN(int64_t turns, NeedInt(j, "max_turns", 1, 1000));
  ASSIGN_OR_RETURN(int64_t wall, NeedInt(j, "wall_clock_s", 1, 86400));
  ASSIGN_OR_RETURN(l.max_tokens, NeedInt(j, "max_tokens", 1, INT64_MAX));
  l.max_turns = static_cast<int>(turns);
  l.wall_clock_s = static_cast<int>(wall);
  return l;
}

Json SettingsWithoutKey(const ModelSettings& s) {
  return {{"provider", s.provider},
          {"base_url", s.base_url},
          {"model", s.model},
          {"max_output_tokens", s.max_output_tokens},
          {"request_timeout_ms", s.request_timeout.count()},
          {"max_attempts", s.max_attempts}};
}

Result<ModelSettings> SettingsFromJson(const Json& j) {
  ModelSettings s;
  RETURN_IF_ERROR(Need(j, "provider", &Json::is_string, "a string"));
  RETURN_IF_ERROR(Need(j, "base_url", &Json::is_string, "a string"));
  RETURN_IF_ERROR(Need(j, "model", &Json::is_string, "a string"));
  s.provider = j["provider"];
  s.base_url = j["base_url"];
  s.model = j["model"];
  ASSIGN_OR_RETURN(int64_t tokens, NeedInt(j, "max_output_tokens", 1, 1 << 24));
  ASSIGN_OR_RETURN(int64_t timeout, NeedInt(j, "request_timeout_ms", 1, int64_t{1} << 32));
  ASSIGN_OR_RETURN(int64_t attempts, NeedInt(j, "max_attempts", 1, 100));
  s.max_output_tokens = static_cast<int>(tokens);
  s.request_timeout = std::chrono::milliseconds(timeout);
  s.max_attempts = static_cast<int>(attempts);
  return s;
}

namespace {

const char* EndName(LoopResult::End e) {
  switch (e) {
    case LoopResult::End::kFinished:
      return "finished";
    case LoopResult::End::kNeedsInput:
      return "needs_input";
    case LoopResult::End::kInProgress:
      return "in_progress";
    case LoopResult::End::kError:
      return "error";
  }
  return "error";
}

}  // namespace

Json ResultToJson(const LoopResult& r) {
  Json approval = nullptr;
  if (r.approval) {
    approval = {
        {"host", r.approval->host}, {"port", r.approval->port}, {"reason", r.approval->reason}};
  }
  return {{"end", EndName(r.end)},
          {"approval", approval},
          {"reason", r.reason},
          {"summary", r.summary},
          {"verify_command", r.verify_command},
          {"question", r.question},
          {"question_truncated", r.question_truncated},
          {"ask_call_id", r.ask_call_id},
          {"error_kind", r.error_kind},
          {"error_message", r.error_message},
          {"http_status", r.http_status},
          {"attempts", r.attempts}};
}

Result<LoopResult> ResultFromJson(const Json& j) {
  LoopResult r;
  RETURN_IF_ERROR(Need(j, "end", &Json::is_string, "a string"));
  std::string end = j["end"];
  if (end == "finished") {
    r.end = LoopResult::End::kFinished;
  } else if (end == "needs_input") {
    r.end = LoopResult::End::kNeedsInput;
  } else if (end == "in_progress") {
    r.end = LoopResult::End::kInProgress;
  } else if (end == "error") {
    r.end = LoopResult::End::kError;
  } else {
    return InvalidArgument("'end' is not a known end: " + CapHead(SanitizeUtf8(end), 40));
  }
  ASSIGN_OR_RETURN(r.reason, NeedText(j, "reason"));
  ASSIGN_OR_RETURN(r.summary, NeedText(j, "summary"));
  ASSIGN_OR_RETURN(r.verify_command, NeedText(j, "verify_command"));
  ASSIGN_OR_RETURN(r.question, NeedText(j, "question"));
  r.question_truncated = BoolOr(j, "question_truncated");
  ASSIGN_OR_RETURN(r.ask_call_id, NeedText(j, "ask_call_id"));
  if (j.contains("approval") && !j["approval"].is_null()) {
    const Json& a = j["approval"];
    NetworkRequest n;
    ASSIGN_OR_RETURN(n.host, NeedText(a, "host"));
    n.port = static_cast<int>(std::clamp<int64_t>(IntOr(a, "port"), 0, 65535));
    ASSIGN_OR_RETURN(n.reason, NeedText(a, "reason"));
    r.approval = std::move(n);
  }
  ASSIGN_OR_RETURN(r.error_kind, NeedText(j, "error_kind"));
  ASSIGN_OR_RETURN(r.error_message, NeedText(j, "error_message"));
  r.http_status = static_cast<int>(std::clamp<int64_t>(IntOr(j, "http_status"), 0, 999));
  r.attempts = static_cast<int>(std::clamp<int64_t>(IntOr(j, "attempts"), 0, 1000));
  return r;
}

Json ProbeOutcomeToJson(const Outcome& o) {
  return {{"failure", FailureName(o.failure)},
          {"message", o.message},
          {"http_status", o.http_status},
          {"attempts", o.attempts}};
}

Outcome ProbeOutcomeFromJson(const Json& j) {
  Outcome o;
  std::string name = StrOr(j, "failure", "protocol");
  o.failure = Failure::kProtocol;
  for (Failure f : {Failure::kNone, Failure::kTransport, Failure::kTimeout, Failure::kAuth,
                    Failure::kRateLimited, Failure::kServer, Failure::kBadRequest,
                    Failure::kContextOverflow, Failure::kContextTruncated, Failure::kProtocol}) {
    if (name == FailureName(f)) o.failure = f;
  }
  o.message = CapHead(SanitizeUtf8(StrOr(j, "message")), kMaxText);
  if (o.failure == Failure::kProtocol && o.message.empty()) {
    o.message = "the agent process reported a malformed probe outcome";
  }
  o.http_status = static_cast<int>(std::clamp<int64_t>(IntOr(j, "http_status"), 0, 999));
  o.attempts = static_cast<int>(std::clamp<int64_t>(IntOr(j, "attempts"), 0, 1000));
  return o;
}

}  // namespace trybox::agent
