// AgentRunner: what it shows of runs (agent_show, with a working run's events and its
// commands' output live; agent_ls; agent_transcript). The rest of the runner is in
// agent_runner.cc; its contract and lock in agent_runner.h.
#include <set>

#include "agent/report.h"
#include "agent/text.h"
#include "daemon/agent_runner.h"
#include "util/json.h"
#include "util/names.h"
#include "util/utf8.h"

namespace trybox::daemon {

namespace {

// Sends the output of exec `exec_id` from its kept log as it is produced, as EVENTs
// {"output": {exec_id, stream, text[, text_b64]}}, until the exec ends. False if the client
// went away.
bool SendLiveOutput(channel::Stream& client, ExecLog& log, int64_t exec_id) {
  int64_t offsets[2] = {0, 0};
  std::string pending[2];
  for (;;) {
    const bool finished = log.finished();  // read before the data: nothing is missed
    bool any = false;
    for (auto ch : {ExecLog::kStdout, ExecLog::kStderr}) {
      auto slice = log.Read(ch, offsets[ch], 64 * 1024);
      if (!slice.ok()) return true;  // not kept (cap 0, no space): exec_end's tail still comes
      if (slice->skipped_to >= 0) {
        offsets[ch] = slice->skipped_to;
        any = true;
        continue;
      }
      if (slice->data.empty()) continue;
      any = true;
      offsets[ch] += static_cast<int64_t>(slice->data.size());
      pending[ch] += slice->data;
      size_t whole = finished ? pending[ch].size() : WholeUtf8Prefix(pending[ch]);
      if (whole == 0) continue;
      Json out = {{"exec_id", exec_id}, {"stream", ch == ExecLog::kStdout ? "stdout" : "stderr"}};
      SetBytesField(out, "text", std::string_view(pending[ch]).substr(0, whole));
      pending[ch].erase(0, whole);
      if (!client.SendEvent({{"output", out}}).ok()) return false;
    }
    if (any) continue;
    if (finished) return true;
    log.WaitAny(offsets[ExecLog::kStdout], offsets[ExecLog::kStderr]);
  }
}

// The exec id of an {"exec": {..., exec_id}} event, or 0.
int64_t ExecIdOf(const Json& ev, const char* key) {
  if (!ev.contains(key) || !ev[key].is_object()) return 0;
  return IntOr(ev[key], "exec_id", 0);
}

}  // namespace

Json AgentRunner::Show(const std::string& run_id, bool follow, channel::Stream* client) {
  std::shared_ptr<RunFeed> feed;
  if (follow && client) {
    MutexLock lock(mu_);
    auto it = runs_.find(run_id);
    if (it != runs_.end() && it->second->busy) feed = it->second->run.feed;
  }
  if (feed) {
    bool closed = false;
    std::set<int64_t> streamed;  // execs whose output went out live
    for (size_t at = 0; !closed;) {
      std::vector<Json> batch = feed->Next(at, &closed);
      for (size_t i = 0; i < batch.size(); ++i) {
        Json& ev = batch[i];
        ++at;
        const int64_t ended = ExecIdOf(ev, "exec_end");
        if (ended && streamed.count(ended) && ev["exec_end"].is_object()) {
          ev["exec_end"].erase("output_tail");  // the follower has it all already
        }
        if (!client->SendEvent(ev).ok()) return ErrorReply(Unavailable("the client went away"));
        const int64_t started = ExecIdOf(ev, "exec");
        if (!started) continue;
        // Live only if it has not ended yet as far as this batch knows: replaying a run's
        // past commands keeps to their tails.
        bool ended_here = false;
        for (size_t j = i + 1; j < batch.size(); ++j)
          ended_here |= ExecIdOf(batch[j], "exec_end") == started;
        if (ended_here) continue;
        auto log = vms_.OpenExecLog(started);
        if (!log.ok()) continue;
        streamed.insert(started);
        if (!SendLiveOutput(*client, **log, started)) {
          return ErrorReply(Unavailable("the client went away"));
        }
      }
    }
  }
  auto rec = store_.GetAgentRun(run_id);
  if (!rec.ok()) return ErrorReply(rec.status());
  if (!rec->has_value()) {
    return ErrorReply(NotFound("no vm_agent run with id " + QuoteForMessage(run_id)));
  }
  Json report = reports_.Build(**rec, RunState::FromJson((*rec)->state));
  return {{"ok", true}, {"report", report}, {"text", agent::RenderReportText(report)}};
}

std::set<std::string> AgentRunner::LiveRunIds() {
  MutexLock lock(mu_);
  std::set<std::string> out;
  for (const auto& [id, slot] : runs_) out.insert(id);
  return out;
}

Json AgentRunner::List(int64_t limit) {
  auto runs = store_.ListAgentRuns(limit);
  if (!runs.ok()) return ErrorReply(runs.status());
  Json out = Json::array();
  for (const auto& r : *runs) {
    RunState s = RunState::FromJson(r.state);
    out.push_back({{"run", r.id},
                   {"task", agent::CapChars(s.task, 200)},
                   {"outcome", r.outcome},
                   {"verdict", s.verdict},
                   {"vm", r.vm_id},
                   {"turns", s.usage.turns},
                   {"created_at", r.created_at},
                   {"updated_at", r.updated_at}});
    if (s.limits) out.back()["max_turns"] = s.limits->max_turns;
    // A run waiting for a person (NEEDS_INPUT): what it asks.
    if (s.question) out.back()["question"] = *s.question;
  }
  return {{"ok", true}, {"runs", out}};
}

void AgentRunner::Transcript(const std::string& run_id, channel::Stream& client) {
  auto rec = store_.GetAgentRun(run_id);
  if (!rec.ok() || !rec->has_value()) {
    (void)client.End(ErrorReply(
        rec.ok() ? NotFound("no vm_agent run with id " + QuoteForMessage(run_id)) : rec.status()));
    return;
  }
  const Json& t = (*rec)->transcript;
  (void)client.Write(channel::kChanOut, t.dump(-1, ' ', false, Json::error_handler_t::replace));
  (void)client.CloseWrite(channel::kChanOut);
  (void)client.End({{"ok", true}, {"entries", t.is_array() ? t.size() : 0}});
}

}  // namespace trybox::daemon
