#include "daemon/agent_call.h"

#include <thread>

#include "agent/run_wire.h"
#include "agent/text.h"
#include "agent/tools.h"
#include "daemon/guest_ops.h"
#include "image/recipe.h"
#include "util/log.h"
#include "workspace/workspace.h"

namespace trybox::daemon {
namespace {

using Kind = channel::Stream::Message::Kind;
constexpr size_t kMaxModelBody = 64u << 20;
constexpr size_t kMaxSaveBytes = 64u << 20;
constexpr int64_t kMaxExecMs = 86'400'000;
constexpr size_t kMaxMessage = 2000;

}  // namespace

void RunFeed::Push(Json event) {
  MutexLock lock(mu_);
  events_.push_back(std::move(event));
  cv_.SignalAll();
}

void RunFeed::Close() {
  MutexLock lock(mu_);
  closed_ = true;
  cv_.SignalAll();
}

std::vector<Json> RunFeed::Next(size_t from, bool* closed) {
  MutexLock lock(mu_);
  while (events_.size() <= from && !closed_) cv_.Wait(mu_);
  *closed = closed_ && events_.size() <= from;
  if (from >= events_.size()) return {};
  return std::vector<Json>(events_.begin() + static_cast<std::ptrdiff_t>(from), events_.end());
}

CallerWatch::CallerWatch(channel::Stream& client) : client_(client) {
  reader_ = std::thread([this] { Read(); });
}

CallerWatch::~CallerWatch() {
  client_.Interrupt();
  reader_.join();
}

void CallerWatch::Read() {
  for (;;) {
    auto m = client_.Next();
    // kCancelled: our own Interrupt, the verb is done with its caller.
    if (!m.ok() && m.status().code() == Code::kCancelled) return;
    if (!m.ok() || m->kind == Kind::kReset || m->kind == Kind::kEnd) break;
  }
  MutexLock lock(mu_);
  gone_ = true;
  if (call_) call_->Cancel();
}

void CallerWatch::Attach(AgentCall* call) {
  MutexLock lock(mu_);
  call_ = call;
  if (gone_) call_->Cancel();
}

void CallerWatch::Detach() {
  MutexLock lock(mu_);
  call_ = nullptr;
}

bool CallerWatch::gone() const {
  MutexLock lock(mu_);
  return gone_;
}

AgentCall::AgentCall(CallEnv env, const agent::ModelSettings& settings, LiveRun* run,
                     channel::Stream* client, agent::LoopLimits limits,
                     std::function<void(LiveRun&)> save)
    : env_(std::move(env)),
      settings_(settings),
      run_(run),
      client_(client),
      limits_(limits),
      save_(std::move(save)) {}

Result<std::string> AgentCall::ReadUpload(channel::Stream& s, size_t max) {
  std::string data;
  for (;;) {
    ASSIGN_OR_RETURN(auto m, s.Next());
    if (m.kind == Kind::kEof) return data;
    if (m.kind == Kind::kData) {
      data += m.data;
      if (data.size() > max) {
        return ResourceExhausted("the upload is over " + std::to_string(max) + " bytes");
      }
    }
    if (m.kind == Kind::kReset || m.kind == Kind::kEnd) return Unavailable("the upload was cut");
  }
}

Status AgentCall::OwnVm(const Json& req) const {
  // The process never names a VM; one that tries names nothing but its own.
  if (req.contains("vm") && (!run_ || req["vm"] != run_->rec.vm_id)) {
    return PermissionDenied("a vm_agent run's process may act only in its own VM");
  }
  return Status::Ok();
}

Result<std::shared_ptr<VmEntry>> AgentCall::Vm() { return env_.vms.GetLive(run_->rec.vm_id); }

void AgentCall::Progress(const std::string& message, int turn, int max_turns) {
  Json ev = {{"run", run_ ? run_->id : ""},
             {"turn", turn},
             {"max_turns", max_turns},
             {"message", agent::CapHead(agent::SanitizeUtf8(message), kMaxMessage)}};
  if (run_) run_->feed->Push({{"progress", ev}});
  if (client_) (void)client_->SendEvent({{"progress", ev}});
}

void AgentCall::AddVerbs(bool loop) {
  // The prompt names the run's image: its distribution and the checks of its recipe.
  agent::ImageFacts image;
  if (run_) {
    image.name = run_->state.image_name;
    image::ImageDescription d = image::DescribeImage(env_.vms.images_dir(), image.name);
    image.distribution = d.distribution;
    image.checks = d.checks;
  }
  verbs_.AddStreaming("hello", [this, loop, image](channel::Stream& s, const Json&, Connection&) {
    Json end = {{"ok", true},
                {"mode", loop ? "loop" : "probe"},
                {"model", agent::SettingsWithoutKey(settings_)},
                {"system_prompt", agent::SystemPrompt(image)}};
    if (loop) {
      MutexLock lock(mu_);
      end["run"] = run_->id;
      end["limits"] = agent::LimitsToJson(limits_);
      end["usage"] = agent::UsageToJson(run_->state.usage);
      end["turn_times"] = agent::TurnTimesToJson(run_->state.turn_times);
      Json entries = Json::array();
      for (const auto& e : run_->transcript) entries.push_back(agent::EntryToJson(e));
      (void)s.Write(channel::kChanOut,
                    entries.dump(-1, ' ', false, Json::error_handler_t::replace));
      (void)s.CloseWrite(channel::kChanOut);
    }
    (void)s.End(end);
  });
  verbs_.AddStreaming("model", [this](channel::Stream& s, const Json& req, Connection&) {
    Fields f(req);
    auto timeout = f.Int("timeout_ms", 1, settings_.request_timeout.count(),
                         settings_.request_timeout.count());
    auto body = timeout.ok() ? ReadUpload(s, kMaxModelBody) : Result<std::string>(timeout.status());
    auto post =
        body.ok() ? agent::ModelEndpoint(settings_) : Result<agent::HttpPost>(body.status());
    if (!post.ok()) {
      (void)s.End(ErrorReply(post.status()));
      return;
    }
    post->body = std::move(*body);
    post->timeout = std::chrono::milliseconds(*timeout);
    // A process killed mid-request (its caller left) leaves nobody to read the reply: the
    // request is dropped then, not held until the provider answers or times out, so a
    // server that never answers costs no more than the caller's patience, and a server
    // that answers one request at a time is free for the next run at once.
    post->cancel = &stop_work_;
    if (!http_) {
      auto client = agent::HttpClient::Make();
      if (!client.ok()) {
        (void)s.End(ErrorReply(client.status()));
        return;
      }
      http_ = std::move(*client);
    }
    auto r = http_->Post(*post);
    if (!r.ok()) {
      (void)s.End(
          ErrorReply(Status(r.status().code(), agent::ScrubKey(r.status().message(), settings_))));
      return;
    }
    Json headers = Json::object();
    for (const char* h : {"retry-after", "retry-after-ms"}) {
      auto it = r->headers.find(h);
      if (it != r->headers.end()) headers[h] = agent::SanitizeUtf8(it->second);
    }
    (void)s.Write(channel::kChanOut, r->body);
    (void)s.CloseWrite(channel::kChanOut);
    (void)s.End({{"ok", true}, {"status", r->status}, {"headers", headers}});
  });
  verbs_.AddStreaming("done", [this, loop](channel::Stream& s, const Json& req, Connection&) {
    auto pending = ReadUpload(s, kMaxSaveBytes);
    if (!loop) {
      MutexLock lock(mu_);
      probe_ = agent::ProbeOutcomeFromJson(req.is_object() ? req.value("probe", Json()) : Json());
      (void)s.End({{"ok", true}});
      return;
    }
    auto result = agent::ResultFromJson(req.is_object() ? req.value("result", Json()) : Json());
    Status st = result.ok() ? pending.status() : result.status();
    if (st.ok() && result->end == agent::LoopResult::End::kNeedsInput) {
      auto entry = agent::EntryFromJson(Json::parse(*pending, nullptr, false));
      if (entry.ok()) {
        result->pending = *entry;
      } else {
        st = entry.status();
      }
    }
    MutexLock lock(mu_);
    if (st.ok() && result->approval) {
      // The daemon's own record of what it left to a person, never the process's account.
      if (!asked_ || asked_->host != result->approval->host ||
          asked_->port != result->approval->port) {
        st = InvalidArgument("it reported an approval the daemon never asked a person for");
      } else {
        result->approval = asked_;
      }
    }
    if (!st.ok()) {
      protocol_error_ = "its result was malformed: " + st.message();
      (void)s.End(ErrorReply(st));
      return;
    }
    result_ = std::move(*result);
    (void)s.End({{"ok", true}});
  });
  if (!loop) return;

  verbs_.AddStreaming("exec", [this](channel::Stream& s, const Json& req, Connection&) {
    Fields f(req);
    Status st = OwnVm(req);
    auto argv = st.ok() ? f.StringList("argv") : Result<std::vector<std::string>>(st);
    auto timeout = argv.ok() ? f.Int("timeout_ms", 1, kMaxExecMs) : Result<int64_t>(argv.status());
    auto tool = timeout.ok() ? f.String("tool") : Result<std::string>(timeout.status());
    if (tool.ok() && (argv->empty() || (*tool != "run" && *tool != "list_dir"))) {
      tool = InvalidArgument("'argv' must be non-empty and 'tool' run or list_dir");
    }
    auto vm = tool.ok() ? Vm() : Result<std::shared_ptr<VmEntry>>(tool.status());
    if (!vm.ok()) {
      (void)s.End(ErrorReply(vm.status()));
      return;
    }
    ExecSpec spec;
    spec.argv = *argv;
    spec.cwd = workspace::kGuestPath;
    spec.timeout_ms = *timeout;
    spec.privileged = (*vm)->privileged();
    std::string out;
    ExecIo io;
    io.capture = &out;
    io.cancelled = &stop_work_;
    // The exec is announced once it is recorded and open, with its id: a follower then
    // reads its output live from the kept log (AgentRunner::Show).
    int64_t exec_id = 0;
    bool announced = false;
    io.on_open = [&](std::shared_ptr<channel::Stream> g) {
      {
        MutexLock lock(mu_);
        exec_in_flight_ = g;
        if (stop_work_) (void)g->Reset("the run was stopped");
      }
      run_->feed->Push({{"exec", {{"tool", *tool}, {"argv", spec.argv}, {"exec_id", exec_id}}}});
      announced = true;
    };
    auto result = env_.vms.Exec(**vm, spec, io, &exec_id);
    if (!announced) run_->feed->Push({{"exec", {{"tool", *tool}, {"argv", spec.argv}}}});
    {
      MutexLock lock(mu_);
      exec_in_flight_.reset();
      if (exec_id) run_->state.exec_tools[exec_id] = *tool;
    }
    if (!result.ok()) {
      (void)s.End(ErrorReply(result.status()));
      return;
    }
    Json rj = result->ToJson();
    run_->feed->Push({{"exec_end",
                       {{"exec_id", exec_id},
                        {"result", rj},
                        {"output_tail", agent::SanitizeUtf8(agent::CapTail(out, 4096))}}}});
    (void)s.Write(channel::kChanOut, out);
    (void)s.CloseWrite(channel::kChanOut);
    (void)s.End({{"ok", true}, {"result", rj}});
  });
  verbs_.AddStreaming("write_file", [this](channel::Stream& s, const Json& req, Connection&) {
    Fields f(req);
    Status st = OwnVm(req);
    auto path = st.ok() ? f.String("path") : Result<std::string>(st);
    auto mode = path.ok() ? f.Int("mode", 0, 07777, 0644) : Result<int64_t>(path.status());
    auto data =
        mode.ok() ? ReadUpload(s, agent::kMaxWriteBytes) : Result<std::string>(mode.status());
    if (data.ok() && (path->empty() || (*path)[0] != '/'))
      data = InvalidArgument("'path' must be absolute");
    auto vm = data.ok() ? Vm() : Result<std::shared_ptr<VmEntry>>(data.status());
    st = vm.ok() ? WriteFile(**vm, *path, *data, static_cast<int>(*mode), true) : vm.status();
    (void)s.End(st.ok() ? Json{{"ok", true}} : ErrorReply(st));
  });
  verbs_.AddStreaming("read_file", [this](channel::Stream& s, const Json& req, Connection&) {
    Fields f(req);
    Status st = OwnVm(req);
    auto path = st.ok() ? f.String("path") : Result<std::string>(st);
    auto max = path.ok() ? f.Int("max_bytes", 1, 4 * agent::kMaxReadBytes)
                         : Result<int64_t>(path.status());
    auto vm = max.ok() ? Vm() : Result<std::shared_ptr<VmEntry>>(max.status());
    auto r = vm.ok() ? ReadFile(**vm, *path, *max) : Result<FileRead>(vm.status());
    if (!r.ok()) {
      (void)s.End(ErrorReply(r.status()));
      return;
    }
    (void)s.Write(channel::kChanOut, r->data);
    (void)s.CloseWrite(channel::kChanOut);
    (void)s.End({{"ok", true}, {"truncated", r->truncated}, {"size", r->size}});
  });
  // request_network: the operator's policy answers, or a person will (the run then pauses;
  // the request the daemon answered "ask" is the one the run waits on, whatever the
  // process reports at its end).
  verbs_.AddUnary("network", [this](const Json& req, Connection&) -> Json {
    Fields f(req);
    Status st = OwnVm(req);
    auto host = st.ok() ? f.String("host") : Result<std::string>(st);
    auto port = host.ok() ? f.Int("port", 1, 65535, 443) : Result<int64_t>(host.status());
    auto reason = port.ok() ? f.String("reason") : Result<std::string>(port.status());
    auto vm = reason.ok() ? Vm() : Result<std::shared_ptr<VmEntry>>(reason.status());
    if (!vm.ok()) return ErrorReply(vm.status());
    auto answer = env_.vms.AnswerNetworkRequest(
        run_->rec.vm_id, *host + ":" + std::to_string(*port), "run " + run_->id + "'s request");
    if (!answer.ok()) return ErrorReply(answer.status());
    if (answer->decision == "ask") {
      MutexLock lock(mu_);
      asked_ = agent::NetworkRequest{answer->entry.host, answer->entry.port,
                                     agent::CapChars(*reason, agent::kMaxNetworkReasonChars)};
    }
    return {{"ok", true}, {"decision", answer->decision}, {"message", answer->message}};
  });
  verbs_.AddUnary("check", [this](const Json& req, Connection&) -> Json {
    Status st = OwnVm(req);
    auto vm = st.ok() ? Vm() : Result<std::shared_ptr<VmEntry>>(st);
    return vm.ok() ? Json{{"ok", true}} : ErrorReply(vm.status());
  });
  verbs_.AddUnary("progress", [this](const Json& req, Connection&) -> Json {
    Fields f(req);
    auto turn = f.Int("turn", 0, 100000);
    auto max = turn.ok() ? f.Int("max_turns", 0, 100000) : Result<int64_t>(turn.status());
    auto message = max.ok() ? f.String("message") : Result<std::string>(max.status());
    if (!message.ok()) return ErrorReply(message.status());
    Progress(*message, static_cast<int>(*turn), static_cast<int>(*max));
    return {{"ok", true}};
  });
  verbs_.AddUnary("stopped", [this](const Json&, Connection&) -> Json {
    return {{"ok", true}, {"stopped", cancelled_ || (client_ && client_->finished())}};
  });
  verbs_.AddStreaming("save", [this](channel::Stream& s, const Json& req, Connection&) {
    Fields f(req);
    auto from = f.Int("from", 0, INT64_MAX);
    auto usage =
        from.ok() ? agent::UsageFromJson(f.Raw("usage")) : Result<agent::RunUsage>(from.status());
    auto times = usage.ok() ? agent::TurnTimesFromJson(f.Raw("turn_times"))
                            : Result<std::vector<agent::TurnTime>>(usage.status());
    auto data = times.ok() ? ReadUpload(s, kMaxSaveBytes) : Result<std::string>(times.status());
    Status st = data.ok() ? Status::Ok() : data.status();
    std::vector<agent::Entry> entries;
    if (st.ok()) {
      Json list = Json::parse(*data, nullptr, false);
      if (!list.is_array()) st = InvalidArgument("the entries are not a JSON array");
      for (size_t i = 0; st.ok() && i < list.size(); ++i) {
        auto e = agent::EntryFromJson(list[i]);
        if (e.ok()) {
          entries.push_back(std::move(*e));
        } else {
          st = e.status();
        }
      }
    }
    MutexLock lock(mu_);
    if (st.ok() && static_cast<size_t>(*from) != run_->transcript.size()) {
      st = FailedPrecondition("the save starts at entry " + std::to_string(*from) +
                              ", the run has " + std::to_string(run_->transcript.size()));
    }
    if (!st.ok()) {
      (void)s.End(ErrorReply(st));
      return;
    }
    for (auto& e : entries) run_->transcript.push_back(std::move(e));
    run_->state.usage = *usage;
    run_->state.turn_times = std::move(*times);
    save_(*run_);
    (void)s.End({{"ok", true}});
  });
}

ExitInfo AgentCall::RunProcess() {
  auto lease = env_.uids.Acquire();
  if (!lease.ok()) {
    LogError("agent", "no uid for trybox-agent: " + lease.status().message());
    return ExitInfo{false, 0, 0};
  }
  auto p = AgentProcess::Start({env_.agent_binary, lease->uid()}, verbs_);
  if (!p.ok()) {
    LogError("agent", "could not start trybox-agent: " + p.status().message());
    MutexLock lock(mu_);
    protocol_error_ = p.status().message();
    return ExitInfo{false, 0, 0};
  }
  AgentProcess* process = p->get();
  {
    MutexLock lock(mu_);
    process_ = std::move(*p);
    if (cancelled_) process_->Kill();
  }
  ExitInfo exit = process->Wait([this] {
    // Work the process asked for and can no longer receive (a command) stops with it.
    stop_work_ = true;
    MutexLock lock(mu_);
    if (exec_in_flight_) (void)exec_in_flight_->Reset("the agent process is gone");
  });
  return exit;
}

agent::Outcome AgentCall::Probe() {
  AddVerbs(false);
  ExitInfo exit = RunProcess();
  MutexLock lock(mu_);
  if (probe_) return *probe_;
  agent::Outcome o;
  o.failure = agent::Failure::kProtocol;
  o.message = "the agent process ended without a probe result (" + exit.Describe() + ")" +
              (protocol_error_.empty() ? "" : ": " + protocol_error_);
  return o;
}

Result<agent::LoopResult> AgentCall::Loop() {
  AddVerbs(true);
  ExitInfo exit = RunProcess();
  MutexLock lock(mu_);
  if (result_) return *result_;
  if (cancelled_) return Cancelled("the run was cancelled");
  return Unavailable("the agent process ended without a result (" + exit.Describe() + ")" +
                     (protocol_error_.empty() ? "" : ": " + protocol_error_));
}

void AgentCall::Cancel() {
  cancelled_ = true;
  stop_work_ = true;
  MutexLock lock(mu_);
  if (process_) process_->Kill();
  if (exec_in_flight_) (void)exec_in_flight_->Reset("the run was cancelled");
}

}  // namespace trybox::daemon
