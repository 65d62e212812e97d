#include "agent/link.h"

#include "agent/run_wire.h"
#include "util/json.h"

namespace trybox::agent {
namespace {

using Json = nlohmann::json;
using Kind = channel::Stream::Message::Kind;

Status FromErrorReply(const Json& end) {
  const Json& e = end.is_object() && end.contains("error") ? end["error"] : Json();
  std::string code = StrOr(e, "code", "INTERNAL");
  std::string message = StrOr(e, "message", "the daemon refused the request");
  for (Code c : {Code::kInvalidArgument, Code::kNotFound, Code::kFailedPrecondition,
                 Code::kUnavailable, Code::kDeadlineExceeded, Code::kResourceExhausted,
                 Code::kPermissionDenied, Code::kCancelled}) {
    if (code == CodeName(c)) return Status(c, message);
  }
  return Internal(message);
}

}  // namespace

class DaemonLink::Vm : public RunVm {
 public:
  explicit Vm(DaemonLink& link) : link_(link) {}
  Status Check() override { return link_.Call({{"verb", "check"}}).status(); }
  Result<Json> Exec(const std::vector<std::string>& argv, int64_t timeout_ms,
                    const std::string& tool, std::string* output) override {
    ASSIGN_OR_RETURN(
        Reply r,
        link_.Call({{"verb", "exec"}, {"argv", argv}, {"timeout_ms", timeout_ms}, {"tool", tool}}));
    if (output) *output = std::move(r.data);
    return r.end.contains("result") ? r.end["result"] : Json::object();
  }
  Status WriteFile(const std::string& path, const std::string& content, int mode) override {
    return link_.Call({{"verb", "write_file"}, {"path", path}, {"mode", mode}}, &content).status();
  }
  Result<FileContent> ReadFile(const std::string& path, int64_t max_bytes) override {
    ASSIGN_OR_RETURN(Reply r,
                     link_.Call({{"verb", "read_file"}, {"path", path}, {"max_bytes", max_bytes}}));
    return FileContent{std::move(r.data), BoolOr(r.end, "truncated"), IntOr(r.end, "size", -1)};
  }
  Result<NetworkDecision> RequestNetwork(const std::string& host, int port,
                                         const std::string& reason) override {
    ASSIGN_OR_RETURN(
        Reply r,
        link_.Call({{"verb", "network"}, {"host", host}, {"port", port}, {"reason", reason}}));
    NetworkDecision d{StrOr(r.end, "decision", ""), StrOr(r.end, "message", "")};
    if (d.decision != "granted" && d.decision != "refused" && d.decision != "ask") {
      return Internal("the daemon's answer to request_network has no decision");
    }
    return d;
  }

 private:
  DaemonLink& link_;
};

class DaemonLink::Events : public RunEvents {
 public:
  explicit Events(DaemonLink& link) : link_(link) {}
  void Progress(int turn, int max_turns, const std::string& message) override {
    (void)link_.Call(
        {{"verb", "progress"}, {"turn", turn}, {"max_turns", max_turns}, {"message", message}});
  }
  void Save(const LoopState& state) override {
    Json entries = Json::array();
    for (size_t i = link_.saved_entries_; i < state.transcript.size(); ++i) {
      entries.push_back(EntryToJson(state.transcript[i]));
    }
    std::string data = entries.dump(-1, ' ', false, Json::error_handler_t::replace);
    auto r = link_.Call({{"verb", "save"},
                         {"from", link_.saved_entries_},
                         {"usage", UsageToJson(state.usage)},
                         {"turn_times", TurnTimesToJson(state.turn_times)}},
                        &data);
    if (r.ok()) link_.saved_entries_ = state.transcript.size();
  }
  bool Stopped() override {
    auto r = link_.Call({{"verb", "stopped"}});
    // A daemon that cannot answer has stopped the run as far as this process can tell.
    return !r.ok() || BoolOr(r->end, "stopped", true);
  }

 private:
  DaemonLink& link_;
};

class DaemonLink::Http : public HttpTransport {
 public:
  explicit Http(DaemonLink& link) : link_(link) {}
  Result<HttpResponse> Post(const HttpPost& post) override {
    ASSIGN_OR_RETURN(
        Reply r, link_.Call({{"verb", "model"}, {"timeout_ms", post.timeout.count()}}, &post.body));
    HttpResponse resp;
    resp.status = static_cast<int>(IntOr(r.end, "status"));
    resp.body = std::move(r.data);
    const Json& h = r.end.contains("headers") ? r.end["headers"] : Json();
    if (h.is_object()) {
      for (const auto& [k, v] : h.items()) {
        if (v.is_string()) resp.headers[k] = v.get<std::string>();
      }
    }
    return resp;
  }

 private:
  DaemonLink& link_;
};

DaemonLink::DaemonLink(UniqueFd fd)
    : mux_(std::move(fd), channel::Role::kHost),
      vm_(std::make_unique<Vm>(*this)),
      events_(std::make_unique<Events>(*this)) {
  mux_.Start();
}

std::unique_ptr<HttpTransport> DaemonLink::Transport() { return std::make_unique<Http>(*this); }

Result<DaemonLink::Reply> DaemonLink::Call(const Json& request, const std::string* upload) {
  ASSIGN_OR_RETURN(auto s, mux_.Open(request));
  if (upload) {
    RETURN_IF_ERROR(s->Write(channel::kChanIn, *upload));
    RETURN_IF_ERROR(s->CloseWrite(channel::kChanIn));
  }
  Reply r;
  for (;;) {
    ASSIGN_OR_RETURN(auto m, s->Next());
    if (m.kind == Kind::kData) r.data += m.data;
    if (m.kind == Kind::kReset) {
      return Unavailable("tryboxd reset the request: " + StrOr(m.body, "reason"));
    }
    if (m.kind == Kind::kEnd) {
      if (!BoolOr(m.body, "ok")) return FromErrorReply(m.body);
      r.end = std::move(m.body);
      return r;
    }
  }
}

Result<DaemonLink::Hello> DaemonLink::Start() {
  ASSIGN_OR_RETURN(Reply r, Call({{"verb", "hello"}}));
  Hello h;
  h.mode = StrOr(r.end, "mode");
  h.run = StrOr(r.end, "run");
  h.system_prompt = StrOr(r.end, "system_prompt");
  ASSIGN_OR_RETURN(h.model, SettingsFromJson(r.end.value("model", Json())));
  if (h.mode == "probe") return h;
  ASSIGN_OR_RETURN(h.limits, LimitsFromJson(r.end.value("limits", Json())));
  ASSIGN_OR_RETURN(h.state.usage, UsageFromJson(r.end.value("usage", Json())));
  ASSIGN_OR_RETURN(h.state.turn_times, TurnTimesFromJson(r.end.value("turn_times", Json())));
  Json entries = Json::parse(r.data, nullptr, false);
  if (!entries.is_array()) return Internal("the transcript from tryboxd is not a JSON array");
  for (const auto& e : entries) {
    ASSIGN_OR_RETURN(Entry entry, EntryFromJson(e));
    h.state.transcript.push_back(std::move(entry));
  }
  saved_entries_ = h.state.transcript.size();
  return h;
}

Status DaemonLink::Done(const LoopResult& result) {
  std::string pending =
      result.end == LoopResult::End::kNeedsInput
          ? EntryToJson(result.pending).dump(-1, ' ', false, Json::error_handler_t::replace)
          : std::string();
  return Call({{"verb", "done"}, {"result", ResultToJson(result)}}, &pending).status();
}

Status DaemonLink::ProbeDone(const Outcome& outcome) {
  const std::string none;  // `done` always carries its (here empty) channel 0
  return Call({{"verb", "done"}, {"probe", ProbeOutcomeToJson(outcome)}}, &none).status();
}

}  // namespace trybox::agent
