// The verbs of terminals, kept output and ports (docs/protocol/daemon.md): logs, ps, kill,
// port. The exec verb itself (with its tty and detach fields) is in verbs_vm.cc.
#include <algorithm>
#include <atomic>
#include <thread>

#include "daemon/verbs.h"

namespace trybox::daemon {
namespace {

// Bytes per DATA frame of a logs reply: one frame's worth, so a follower sees output as
// soon as it is kept.
constexpr size_t kLogChunk = 256 * 1024;

// An exec's record, with what its result is worth (`privileged`: its VM's).
Json ExecJson(const store::ExecRecord& e, const std::optional<bool>& privileged) {
  const bool running = e.outcome == "running";
  const bool ended = e.ended_at > 0;
  // An ended exec's duration is the monotonic one the daemon kept (store.h); a running one's
  // is its age on the wall clock, never below 0 (a step back may have passed since).
  Json duration = nullptr;
  if (ended) {
    if (auto d = e.Duration()) duration = *d;
  } else if (running) {
    duration =
        std::max<int64_t>(0, static_cast<int64_t>((store::NowSeconds() - e.started_at) * 1000));
  }
  Json j = {{"id", e.id},
            {"vm", e.vm_id},
            {"argv", e.argv},
            {"cwd", e.cwd},
            {"state", running ? "running" : "ended"},
            {"outcome", e.outcome},
            {"started_at", e.started_at},
            {"ended_at", ended ? Json(e.ended_at) : Json(nullptr)},
            {"duration_ms", duration},
            {"stdout_bytes", e.stdout_bytes},
            {"stderr_bytes", e.stderr_bytes}};
  if (e.exit_code) j["exit_code"] = *e.exit_code;
  if (e.signal) j["signal"] = *e.signal;
  if (!e.error.empty()) j["error"] = e.error;
  AddPrivilegeFields(j, privileged);
  return j;
}

// The VM's privilege as recorded; unknown (treated as the guest's word) when it is not.
std::optional<bool> PrivilegeOf(VmService& vms, const std::string& vm_id) {
  auto vm = vms.Record(vm_id);
  return vm.ok() ? vm->privileged : std::nullopt;
}

// A follower's client: its reset, END or loss stops the follow.
void WatchFollower(channel::Stream& client, ExecLog& log, std::atomic<bool>* stop) {
  for (;;) {
    auto m = client.Next();
    if (!m.ok() || m->kind == channel::Stream::Message::Kind::kReset ||
        m->kind == channel::Stream::Message::Kind::kEnd) {
      *stop = true;
      log.Wake();
      return;
    }
  }
}

// Sends the output of `log` from `offset` to the client (channel 1, a "gap" EVENT for each
// dropped range); with `follow`, until the exec ends. Returns the offset reached.
Result<int64_t> SendLog(channel::Stream& client, ExecLog& log, ExecLog::Channel ch, int64_t offset,
                        bool follow) {
  std::atomic<bool> stop{false};
  std::thread watch;
  if (follow) watch = std::thread([&] { WatchFollower(client, log, &stop); });
  Status failure;
  while (!stop) {
    auto slice = log.Read(ch, offset, kLogChunk);
    if (!slice.ok()) {
      failure = slice.status();
      break;
    }
    if (slice->skipped_to >= 0) {
      if (!client.SendEvent({{"type", "gap"}, {"from", offset}, {"to", slice->skipped_to}}).ok())
        break;
      offset = slice->skipped_to;
    } else if (!slice->data.empty()) {
      if (!client.Write(channel::kChanOut, slice->data).ok()) break;  // the client is gone
      offset += static_cast<int64_t>(slice->data.size());
    } else if (!follow || slice->finished) {
      break;
    } else {
      log.Wait(ch, offset, &stop);
    }
  }
  if (watch.joinable()) {
    client.Interrupt();
    watch.join();
  }
  if (!failure.ok()) return failure;
  return offset;
}

// SendLog for both streams at once: stdout on channel 1 and stderr on channel 2, each from
// its offset, in the order the reads find them; a gap EVENT names its `stream`. Returns the
// offsets reached.
Result<std::pair<int64_t, int64_t>> SendBothLogs(channel::Stream& client, ExecLog& log,
                                                 int64_t out_offset, int64_t err_offset,
                                                 bool follow) {
  std::atomic<bool> stop{false};
  std::thread watch;
  if (follow) watch = std::thread([&] { WatchFollower(client, log, &stop); });
  Status failure;
  int64_t offsets[2] = {out_offset, err_offset};
  bool gone = false;
  while (!stop && !gone) {
    const bool finished = log.finished();  // read before the data: nothing is missed
    bool any = false;
    for (auto ch : {ExecLog::kStdout, ExecLog::kStderr}) {
      auto slice = log.Read(ch, offsets[ch], kLogChunk);
      if (!slice.ok()) {
        failure = slice.status();
        gone = true;
        break;
      }
      if (slice->skipped_to >= 0) {
        any = true;
        if (!client
                 .SendEvent({{"type", "gap"},
                             {"stream", ch == ExecLog::kStdout ? "stdout" : "stderr"},
                             {"from", offsets[ch]},
                             {"to", slice->skipped_to}})
                 .ok()) {
          gone = true;
          break;
        }
        offsets[ch] = slice->skipped_to;
      } else if (!slice->data.empty()) {
        any = true;
        const uint8_t out = ch == ExecLog::kStdout ? channel::kChanOut : channel::kChanErr;
        if (!client.Write(out, slice->data).ok()) {
          gone = true;  // the client is gone
          break;
        }
        offsets[ch] += static_cast<int64_t>(slice->data.size());
      }
    }
    if (gone || any) continue;
    if (!follow || finished) break;
    log.WaitAny(offsets[ExecLog::kStdout], offsets[ExecLog::kStderr], &stop);
  }
  if (watch.joinable()) {
    client.Interrupt();
    watch.join();
  }
  if (!failure.ok()) return failure;
  return std::make_pair(offsets[ExecLog::kStdout], offsets[ExecLog::kStderr]);
}

}  // namespace

void AddTerminalVerbs(VerbTable& t, Services& s) {
  t.AddStreaming("logs", [&s](channel::Stream& client, const Json& j, Connection&) {
    auto req = ParseLogs(j);
    auto rec = req.ok() ? s.vms.GetExec(req->exec) : Result<store::ExecRecord>(req.status());
    auto log = rec.ok() ? s.logs.Open(rec->vm_id, req->exec)
                        : Result<std::shared_ptr<ExecLog>>(rec.status());
    if (!log.ok()) {
      (void)client.End(ErrorReply(log.status()));
      return;
    }
    if (req->both) {
      auto reached = SendBothLogs(client, **log, req->offset, req->stderr_offset, req->follow);
      if (!reached.ok()) {
        (void)client.End(ErrorReply(reached.status()));
        return;
      }
      auto now = s.vms.GetExec(req->exec);
      (void)client.End(
          {{"ok", true},
           {"offset", reached->first},
           {"stderr_offset", reached->second},
           {"exec", ExecJson(now.ok() ? *now : *rec, PrivilegeOf(s.vms, rec->vm_id))}});
      return;
    }
    auto offset = SendLog(client, **log, req->stderr ? ExecLog::kStderr : ExecLog::kStdout,
                          req->offset, req->follow);
    if (!offset.ok()) {
      (void)client.End(ErrorReply(offset.status()));
      return;
    }
    // The record as of now: a follow ends after the exec's row was finished.
    auto now = s.vms.GetExec(req->exec);
    (void)client.End({{"ok", true},
                      {"offset", *offset},
                      {"exec", ExecJson(now.ok() ? *now : *rec, PrivilegeOf(s.vms, rec->vm_id))}});
  });
  t.AddUnary("ps", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseVmRequest(j);
    if (!req.ok()) return ErrorReply(req.status());
    auto execs = s.vms.Execs(req->vm);
    if (!execs.ok()) return ErrorReply(execs.status());
    const std::optional<bool> privileged = PrivilegeOf(s.vms, req->vm);
    Json list = Json::array();
    for (const auto& e : *execs) list.push_back(ExecJson(e, privileged));
    Json reply = {{"ok", true}, {"vm", req->vm}, {"execs", list}};
    AddPrivilegeFields(reply, privileged);
    return reply;
  });
  t.AddUnary("kill", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseKill(j);
    if (!req.ok()) return ErrorReply(req.status());
    Status st = s.vms.SignalExec(req->exec, req->signal);
    if (!st.ok()) return ErrorReply(st);
    return {{"ok", true}, {"exec", req->exec}, {"signal", req->signal}};
  });
  t.AddStreaming("port", [&s](channel::Stream& client, const Json& j, Connection&) {
    auto req = ParsePort(j);
    auto vm = req.ok() ? s.vms.Get(req->vm) : Result<std::shared_ptr<VmEntry>>(req.status());
    if (!vm.ok()) {
      (void)client.End(ErrorReply(vm.status()));
      return;
    }
    RelayPort(**vm, req->port, client);
    s.vms.NoteDeath(**vm);
  });
}

}  // namespace trybox::daemon
