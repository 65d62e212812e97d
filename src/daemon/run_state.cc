#include "daemon/run_state.h"

namespace trybox::daemon {
namespace {

// Tolerant readers: a missing key or one of the wrong type reads as absent.
std::string Str(const Json& j, const char* k) {
  return j.is_object() && j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : "";
}
std::optional<std::string> OptStr(const Json& j, const char* k) {
  if (j.is_object() && j.contains(k) && j[k].is_string()) return j[k].get<std::string>();
  return std::nullopt;
}
std::optional<int64_t> OptInt(const Json& j, const char* k) {
  if (!j.is_object() || !j.contains(k)) return std::nullopt;
  return IntIn(j[k], INT64_MIN, INT64_MAX);
}
int64_t Int(const Json& j, const char* k) { return OptInt(j, k).value_or(0); }
double Num(const Json& j, const char* k) {
  return j.is_object() && j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0;
}
bool Bool(const Json& j, const char* k) {
  return j.is_object() && j.contains(k) && j[k].is_boolean() && j[k].get<bool>();
}
std::vector<std::string> Strs(const Json& j, const char* k) {
  std::vector<std::string> out;
  if (!j.is_object() || !j.contains(k) || !j[k].is_array()) return out;
  for (const auto& v : j[k]) {
    if (v.is_string()) out.push_back(v.get<std::string>());
  }
  return out;
}
const Json& Obj(const Json& j, const char* k) {
  static const Json kNull;
  if (j.is_object() && j.contains(k) && j[k].is_object()) return j[k];
  return kNull;
}
std::optional<int> OptInt32(const Json& j, const char* k) {
  auto v = OptInt(j, k);
  if (!v || *v < INT32_MIN || *v > INT32_MAX) return std::nullopt;
  return static_cast<int>(*v);
}

}  // namespace

namespace {

Json VerifyStepJson(const VerifyStep& st) {
  Json j = {{"step", st.step}, {"what", st.what}, {"outcome", st.outcome}};
  if (!st.argv.empty()) j["argv"] = st.argv;
  if (!st.user.empty()) j["user"] = st.user;
  if (st.exit_code) j["exit_code"] = *st.exit_code;
  if (st.signal) j["signal"] = *st.signal;
  if (st.exec_id) j["exec_id"] = *st.exec_id;
  if (st.duration_ms) j["duration_ms"] = *st.duration_ms;
  if (!st.error.empty()) j["error"] = st.error;
  if (!st.blob.empty()) j["blob"] = st.blob;
  if (!st.sha256.empty()) j["sha256"] = st.sha256;
  if (!st.tree_hook.empty()) j["tree_hook"] = st.tree_hook;
  if (st.output_tail) j["output_tail"] = *st.output_tail;
  return j;
}

VerifyStep VerifyStepFromJson(const Json& j) {
  VerifyStep st;
  st.step = Str(j, "step");
  st.what = Str(j, "what");
  st.argv = Strs(j, "argv");
  st.user = Str(j, "user");
  st.outcome = Str(j, "outcome");
  st.exit_code = OptInt32(j, "exit_code");
  st.signal = OptInt32(j, "signal");
  st.exec_id = OptInt(j, "exec_id");
  st.duration_ms = OptInt(j, "duration_ms");
  st.error = Str(j, "error");
  st.blob = Str(j, "blob");
  st.sha256 = Str(j, "sha256");
  st.tree_hook = Str(j, "tree_hook");
  st.output_tail = OptStr(j, "output_tail");
  return st;
}

}  // namespace

Json VerificationJson(const Verification& v) {
  Json j = {{"command", v.command}, {"source", v.source}, {"outcome", v.outcome}};
  if (v.exit_code) j["exit_code"] = *v.exit_code;
  if (v.signal) j["signal"] = *v.signal;
  if (v.duration_ms) j["duration_ms"] = *v.duration_ms;
  if (v.timeout_ms) j["timeout_ms"] = *v.timeout_ms;
  if (!v.error.empty()) j["error"] = v.error;
  if (v.exec_id) j["exec_id"] = *v.exec_id;
  if (!v.vm.empty()) j["vm"] = v.vm;
  if (!v.user.empty()) j["user"] = v.user;
  if (v.output_tail) {
    j["output_tail"] = *v.output_tail;
    j["output_tail_bytes"] = v.output_tail_bytes;
    j["output_bytes"] = v.output_bytes;
  }
  if (!v.before.empty()) {
    Json before = Json::array();
    for (const auto& st : v.before) before.push_back(VerifyStepJson(st));
    j["before"] = std::move(before);
  }
  return j;
}

Json RunState::ToJson() const {
  Json j = {{"task", task},
            {"image", {{"name", image_name}}},
            {"internet", internet},
            {"allow", allow},
            {"profiles", profiles},
            {"deny", deny},
            {"caller_verify", caller_verify},
            {"workspace", workspace ? Json(*workspace) : Json(nullptr)},
            {"model", model},
            {"usage",
             {{"turns", usage.turns},
              {"input_tokens", usage.input_tokens},
              {"output_tokens", usage.output_tokens},
              {"model_ms", usage.model_ms}}},
            {"exec_tools", Json::object()},
            {"repo", repo}};
  if (!image_sha256.empty()) j["image"]["sha256"] = image_sha256;
  for (const auto& [id, tool] : exec_tools) j["exec_tools"][std::to_string(id)] = tool;
  if (limits) {
    j["limits"] = {{"max_turns", limits->max_turns},
                   {"wall_clock_s", limits->wall_clock_s},
                   {"max_tokens", limits->max_tokens}};
  }
  if (!turn_times.empty()) {
    j["turn_times"] = Json::array();
    for (const auto& t : turn_times) {
      j["turn_times"].push_back({{"turn", t.turn},
                                 {"ms", t.ms},
                                 {"model_ms", t.model_ms},
                                 {"command_ms", t.command_ms},
                                 {"overhead_ms", t.overhead_ms}});
    }
  }
  if (error) {
    j["error"] = {{"kind", error->kind}, {"message", error->message}};
    if (error->http_status) j["error"]["http_status"] = *error->http_status;
    if (error->attempts) j["error"]["attempts"] = *error->attempts;
  }
  if (!reason.empty()) j["reason"] = reason;
  if (question) j["question"] = {{"text", *question}, {"truncated", question_truncated}};
  if (approval) {
    j["approval"] = {{"kind", "network"},
                     {"host", approval->host},
                     {"port", approval->port},
                     {"reason", approval->reason},
                     {"since", approval->since}};
  }
  if (pending_ask_call_id && pending_results) {
    j["pending"] = {{"ask_call_id", *pending_ask_call_id},
                    {"results", agent::EntryToJson(*pending_results)}};
  }
  if (!answers.empty()) j["answers"] = answers;
  if (claim) {
    j["claim"] = {
        {"summary", claim->summary}, {"truncated", claim->truncated}, {"status", claim->status}};
  }
  if (!agent_verify.empty()) j["agent_verify"] = agent_verify;
  if (collect_id) j["collect_id"] = *collect_id;
  if (!files_note.empty()) j["files_note"] = files_note;
  if (verification) j["verification"] = VerificationJson(*verification);
  if (!verify_vm.empty()) j["verify_vm"] = verify_vm;
  if (!verdict.empty()) j["verdict"] = verdict;
  if (!expired.empty()) j["expired"] = expired;
  return j;
}

RunState RunState::FromJson(const Json& j) {
  RunState s;
  s.task = Str(j, "task");
  const Json& image = Obj(j, "image");
  s.image_name = Str(image, "name");
  s.image_sha256 = Str(image, "sha256");
  s.internet = Bool(j, "internet");
  s.allow = Strs(j, "allow");
  s.profiles = Strs(j, "profiles");
  s.deny = Strs(j, "deny");
  s.caller_verify = Str(j, "caller_verify");
  s.workspace = OptStr(j, "workspace");
  if (const Json& m = Obj(j, "model"); !m.is_null()) s.model = m;
  const Json& u = Obj(j, "usage");
  s.usage = {Int(u, "turns"), Int(u, "input_tokens"), Int(u, "output_tokens"), Int(u, "model_ms")};
  for (const auto& [k, v] : Obj(j, "exec_tools").items()) {
    char* end = nullptr;
    long long id = std::strtoll(k.c_str(), &end, 10);
    if (end && *end == '\0' && v.is_string()) s.exec_tools[id] = v.get<std::string>();
  }
  s.repo = Str(j, "repo");
  if (const Json& l = Obj(j, "limits"); !l.is_null()) {
    AgentLimits lim;
    lim.max_turns = static_cast<int>(OptInt(l, "max_turns").value_or(lim.max_turns));
    lim.wall_clock_s = static_cast<int>(OptInt(l, "wall_clock_s").value_or(lim.wall_clock_s));
    lim.max_tokens = OptInt(l, "max_tokens").value_or(lim.max_tokens);
    s.limits = lim;
  }
  if (j.is_object() && j.contains("turn_times") && j["turn_times"].is_array()) {
    for (const auto& t : j["turn_times"]) {
      s.turn_times.push_back({Int(t, "turn"), Num(t, "ms"), Num(t, "model_ms"),
                              Num(t, "command_ms"), Num(t, "overhead_ms")});
    }
  }
  if (const Json& e = Obj(j, "error"); !e.is_null()) {
    s.error = RunError{Str(e, "kind"), Str(e, "message"), OptInt32(e, "http_status"),
                       OptInt32(e, "attempts")};
  }
  s.reason = Str(j, "reason");
  if (const Json& q = Obj(j, "question"); !q.is_null()) {
    s.question = Str(q, "text");
    s.question_truncated = Bool(q, "truncated");
  }
  if (const Json& a = Obj(j, "approval"); !a.is_null()) {
    s.approval = PendingApproval{Str(a, "host"), static_cast<int>(Num(a, "port")), Str(a, "reason"),
                                 Num(a, "since")};
  }
  if (const Json& p = Obj(j, "pending"); !p.is_null()) {
    s.pending_ask_call_id = Str(p, "ask_call_id");
    if (auto e = agent::EntryFromJson(p.contains("results") ? p["results"] : Json()); e.ok()) {
      s.pending_results = *e;
    }
  }
  s.answers = Strs(j, "answers");
  if (const Json& c = Obj(j, "claim"); !c.is_null()) {
    s.claim = RunClaim{Str(c, "summary"), Bool(c, "truncated"), Str(c, "status")};
  }
  s.agent_verify = Str(j, "agent_verify");
  s.collect_id = OptInt(j, "collect_id");
  s.files_note = Str(j, "files_note");
  if (const Json& v = Obj(j, "verification"); !v.is_null()) {
    Verification ver;
    ver.command = Str(v, "command");
    ver.source = Str(v, "source");
    ver.outcome = Str(v, "outcome");
    ver.exit_code = OptInt32(v, "exit_code");
    ver.signal = OptInt32(v, "signal");
    ver.duration_ms = OptInt(v, "duration_ms");
    ver.timeout_ms = OptInt(v, "timeout_ms");
    ver.error = Str(v, "error");
    ver.exec_id = OptInt(v, "exec_id");
    ver.vm = Str(v, "vm");
    ver.user = Str(v, "user");
    ver.output_tail = OptStr(v, "output_tail");
    ver.output_tail_bytes = Int(v, "output_tail_bytes");
    ver.output_bytes = Int(v, "output_bytes");
    if (v.contains("before") && v["before"].is_array()) {
      for (const auto& st : v["before"]) ver.before.push_back(VerifyStepFromJson(st));
    }
    s.verification = ver;
  }
  s.verify_vm = Str(j, "verify_vm");
  s.verdict = Str(j, "verdict");
  s.expired = Str(j, "expired");
  return s;
}

}  // namespace trybox::daemon
