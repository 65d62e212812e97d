#include "daemon/verbs.h"

namespace trybox::daemon {
namespace {

// A collect record with at most `limit` of its changes from `offset`, and the counts.
Json CollectJson(const store::CollectRecord& c, int64_t offset, int64_t limit) {
  const int64_t total = c.changes.is_array() ? static_cast<int64_t>(c.changes.size()) : 0;
  Json page = Json::array();
  for (int64_t i = offset; i < total && i < offset + limit; ++i) page.push_back(c.changes[i]);
  return {{"id", c.id},
          {"vm", c.vm_id},
          {"exec_id", c.exec_id ? Json(*c.exec_id) : Json(nullptr)},
          {"collected_at", c.collected_at},
          {"outcome", c.outcome},
          {"error", c.error},
          {"files", c.files},
          {"bytes", c.bytes},
          {"skipped", c.skipped},
          {"skipped_unlisted", c.skipped_unlisted},
          {"commit", c.commit},
          {"branch", c.branch},
          {"note", c.note},
          {"counts", CountChanges(c.changes)},
          {"changes", page},
          {"changes_offset", offset},
          {"changes_total", total},
          {"changes_truncated", offset + static_cast<int64_t>(page.size()) < total}};
}

Json WorkspaceInJson(const InjectOutcome& o) {
  const store::WorkspaceRecord& rec = o.record;
  Json reply = {{"ok", true},
                {"workspace",
                 {{"vm", rec.vm_id},
                  {"dir", rec.dir},
                  {"base", rec.base},
                  {"files", rec.files},
                  {"bytes", rec.bytes},
                  {"quota_bytes", rec.quota_bytes},
                  {"quota_entries", rec.quota_entries},
                  {"skipped", rec.skipped},
                  {"exclude", rec.excludes},
                  {"transfer", o.transfer}}},
                {"setup", nullptr}};
  if (o.setup) {
    reply["setup"] = {{"result", o.setup->result.ToJson()},
                      {"exec_id", o.setup->exec_id},
                      {"output_bytes", o.setup->output.size()}};
  }
  return reply;
}

}  // namespace

// The most of a patch a `diff` reply carries: with its base64 twin (bytes that are not
// UTF-8) and a page of changes, the reply stays under a frame's 1 MiB payload.
constexpr size_t kMaxPatchBytes = size_t{256} << 10;

void AddWorkVerbs(VerbTable& t, Services& s) {
  t.AddStreaming("workspace_in", [&s](channel::Stream& client, const Json& j, Connection&) {
    auto req = ParseWorkspaceIn(j);
    auto vm = req.ok() ? s.vms.Get(req->vm) : Result<std::shared_ptr<VmEntry>>(req.status());
    if (!vm.ok()) {
      (void)client.End(ErrorReply(vm.status()));
      return;
    }
    auto out = s.workspaces.WorkspaceIn(**vm, *req, &client);
    (void)client.End(out.ok() ? WorkspaceInJson(*out) : ErrorReply(out.status()));
  });
  t.AddUnary("collect", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseCollect(j);
    if (!req.ok()) return ErrorReply(req.status());
    auto vm = s.vms.Get(req->vm);
    if (!vm.ok()) return ErrorReply(vm.status());
    CollectOptions opts;
    opts.into = req->into;
    opts.commit = req->commit;
    opts.command = req->command;
    auto c = s.workspaces.Collect(**vm, opts);
    if (!c.ok()) return ErrorReply(c.status());
    Json out = CollectJson(c->record, 0, kMaxReplyChanges);
    out["committed"] = c->committed;
    out["injected_commit"] = c->injected_commit;
    out["excluded"] = c->excluded;
    out["tar_bytes"] = c->tar_bytes;
    out["transfer"] = c->transfer;
    out["into"] = c->into;
    out["dir"] = c->dir;
    return {{"ok", true}, {"collect", out}};
  });
  t.AddUnary("diff", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseDiff(j);
    if (!req.ok()) return ErrorReply(req.status());
    auto c = s.workspaces.LatestCollect(req->vm);
    if (!c.ok()) return ErrorReply(c.status());
    int64_t limit = req->limit > 0 ? std::min(req->limit, kMaxReplyChanges) : kMaxReplyChanges;
    Json reply = {{"ok", true}, {"collect", CollectJson(*c, req->offset, limit)}};
    if (req->patch) {
      auto patch = s.workspaces.Patch(req->vm, kMaxPatchBytes);
      if (!patch.ok()) return ErrorReply(patch.status());
      reply["patch"] = *patch;
    }
    return reply;
  });
  t.AddStreaming("agent", [&s](channel::Stream& client, Json& j, Connection&) {
    auto req = ParseAgent(j);
    WipeModelKey(&j);
    WipeSecretValues(&j);
    (void)client.End(req.ok() ? s.agents.Start(*req, client) : ErrorReply(req.status()));
  });
  for (bool answer : {true, false}) {
    t.AddStreaming(answer ? "agent_answer" : "agent_resume",
                   [&s, answer](channel::Stream& client, Json& j, Connection& conn) {
                     auto req = ParseAgentContinue(j, answer);
                     WipeModelKey(&j);
                     if (req.ok()) req->by = "uid " + std::to_string(conn.uid());
                     (void)client.End(req.ok() ? s.agents.Continue(*req, answer, client)
                                               : ErrorReply(req.status()));
                   });
  }
  t.AddStreaming("agent_show", [&s](channel::Stream& client, const Json& j, Connection&) {
    auto req = ParseRunRequest(j);
    (void)client.End(req.ok() ? s.agents.Show(req->run, req->follow, &client)
                              : ErrorReply(req.status()));
  });
  t.AddUnary("approvals", [&s](const Json& j, Connection&) -> Json {
    Fields f(j);
    if (Status st = f.CheckObject(); !st.ok()) return ErrorReply(st);
    return {{"ok", true}, {"approvals", s.agents.Approvals()}};
  });
  t.AddUnary("agent_cancel", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseRunRequest(j);
    return req.ok() ? s.agents.Cancel(req->run) : ErrorReply(req.status());
  });
  t.AddUnary("agent_ls", [&s](const Json& j, Connection&) -> Json {
    auto limit = ParseListLimit(j);
    return limit.ok() ? s.agents.List(*limit) : ErrorReply(limit.status());
  });
  t.AddStreaming("agent_transcript", [&s](channel::Stream& client, const Json& j, Connection&) {
    auto req = ParseRunRequest(j);
    if (!req.ok()) {
      (void)client.End(ErrorReply(req.status()));
      return;
    }
    s.agents.Transcript(req->run, client);
  });
}

}  // namespace trybox::daemon
