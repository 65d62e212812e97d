// The workspace verbs: workspace_in, collect, diff (docs/protocol/daemon.md,
// docs/workspace.md). The daemon reads the user's directory and the collected tree itself
// and computes the files changed from its own manifests; it never asks the guest.
#include <sys/stat.h>

#include "daemon/daemon.h"
#include "util/fd.h"
#include "util/names.h"
#include "workspace/tar.h"
#include "workspace/workspace.h"

namespace trybox::daemon {
namespace {

using Kind = channel::Stream::Message::Kind;
namespace ws = trybox::workspace;

// Waits for the guest's END on a stream whose data we do not expect (or already consumed).
Result<Json> AwaitGuestEnd(channel::Stream& guest) {
  for (;;) {
    ASSIGN_OR_RETURN(auto m, guest.Next());
    if (m.kind == Kind::kEnd) return m.body;
    if (m.kind == Kind::kReset) {
      return Unavailable("the guest aborted the request: " +
                         m.body.value("reason", std::string("no reason given")));
    }
  }
}

Status StatusFromGuestEnd(const Json& end) {
  Json n = NormalizeGuestEnd(end);
  if (n.value("ok", false)) return Status::Ok();
  const Json& err = n["error"];
  std::string code = err.value("code", "INTERNAL");
  Code c = Code::kInternal;
  for (Code k : {Code::kInvalidArgument, Code::kNotFound, Code::kResourceExhausted}) {
    if (code == CodeName(k)) c = k;
  }
  return Status(c, err.value("message", std::string("the guest failed")));
}

Json SkippedJson(const std::vector<ws::Skipped>& v) {
  Json a = Json::array();
  for (const auto& s : v) a.push_back({{"path", s.path}, {"reason", s.reason}});
  return a;
}

Json Counts(const Json& changes) {
  Json c = {{"added", 0}, {"modified", 0}, {"deleted", 0}, {"mode_changed", 0}, {"renamed", 0}};
  for (const auto& ch : changes) {
    std::string k = ch.value("change", "");
    if (c.contains(k)) c[k] = c[k].get<int>() + 1;
  }
  return c;
}

Json CollectJson(const store::CollectRecord& c) {
  return {{"id", c.id},
          {"vm", c.vm_id},
          {"exec_id", c.exec_id ? Json(*c.exec_id) : Json(nullptr)},
          {"collected_at", c.collected_at},
          {"outcome", c.outcome},
          {"error", c.error},
          {"files", c.files},
          {"bytes", c.bytes},
          {"skipped", c.skipped},
          {"commit", c.commit},
          {"branch", c.branch},
          {"note", c.note},
          {"counts", Counts(c.changes)},
          {"changes", c.changes}};
}

std::string JoinArgv(const Json& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += " ";
    s += a.is_string() ? a.get<std::string>() : a.dump();
  }
  return s;
}

}  // namespace

Status Daemon::SendTree(VmEntry& e, const std::string& root, const ws::Manifest& manifest) {
  auto guest =
      e.vm->Open({{"op", "put"}, {"path", ws::kGuestPath}, {"kind", "tar"}, {"mode", 0755}});
  if (!guest.ok()) {
    NoteDeath(e);
    return guest.status();
  }
  Status sent = ws::WriteTar(
      root, manifest, [&](std::string_view d) { return (*guest)->Write(channel::kChanIn, d); });
  if (sent.ok()) sent = (*guest)->CloseWrite(channel::kChanIn);
  if (!sent.ok()) {
    // After a local reset no END will come: fail now, never wait for one.
    (void)(*guest)->Reset("the host could not send the workspace");
    if (!e.vm->alive()) NoteDeath(e);
    std::string why = e.vm->death_reason();
    return why.empty() ? sent : Unavailable("the guest is gone: " + why);
  }
  auto end = AwaitGuestEnd(**guest);
  Status st = end.ok() ? StatusFromGuestEnd(*end) : end.status();
  if (!st.ok() && !e.vm->alive()) NoteDeath(e);
  return st;
}

Result<store::WorkspaceRecord> Daemon::InjectPlanned(VmEntry& e, const ws::InjectPlan& plan,
                                                     int64_t quota) {
  const std::string& id = e.record.id;
  Status st = SendTree(e, plan.dir, plan.manifest);
  if (!st.ok()) return st.Annotate("copy the workspace into VM " + id);
  store::WorkspaceRecord rec;
  rec.vm_id = id;
  rec.dir = plan.dir;
  rec.base = plan.base.value_or("");
  rec.excludes = plan.excludes.project_lines();
  rec.manifest = ws::ManifestToJson(plan.manifest);
  rec.quota_bytes = quota;
  rec.files = static_cast<int64_t>(plan.manifest.size());
  rec.bytes = static_cast<int64_t>(ws::TotalBytes(plan.manifest));
  rec.skipped = SkippedJson(plan.skipped);
  rec.injected_at = store::NowSeconds();
  st = store_->InsertWorkspace(rec);
  if (!st.ok()) return st.Annotate("record the workspace");
  std::lock_guard<std::mutex> lock(mu_);
  e.has_workspace = true;
  return rec;
}

void Daemon::DoWorkspaceIn(channel::Stream& client, const Json& req) {
  auto fail = [&](const Status& st) { (void)client.End(ErrorReply(st)); };
  auto e = Lookup(req);
  if (!e.ok()) return fail(e.status());
  if (!req.contains("dir") || !req["dir"].is_string()) {
    return fail(InvalidArgument("'dir' must be a string"));
  }
  std::string dir = req["dir"];
  if (dir.empty() || dir[0] != '/') {
    return fail(InvalidArgument("'dir' must be an absolute path, got " + QuoteForMessage(dir)));
  }
  int64_t quota = req.value("quota_bytes", static_cast<int64_t>(ws::kDefaultQuotaBytes));
  if (quota <= 0) return fail(InvalidArgument("'quota_bytes' must be positive"));
  const std::string id = (*e)->record.id;
  auto existing = store_->GetWorkspace(id);
  if (!existing.ok()) return fail(existing.status());
  if (existing->has_value()) {
    return fail(
        FailedPrecondition("VM " + id + " already has a workspace, from " + (*existing)->dir));
  }
  auto plan = ws::PlanInject(dir, static_cast<uint64_t>(quota));
  if (!plan.ok()) return fail(plan.status());

  auto recorded = InjectPlanned(**e, *plan, quota);
  if (!recorded.ok()) return fail(recorded.status());
  const store::WorkspaceRecord& rec = *recorded;
  Json reply = {{"ok", true},
                {"workspace",
                 {{"vm", id},
                  {"dir", rec.dir},
                  {"base", rec.base},
                  {"files", rec.files},
                  {"bytes", rec.bytes},
                  {"quota_bytes", quota},
                  {"skipped", rec.skipped},
                  {"exclude", rec.excludes}}},
                {"setup", nullptr}};

  // The project's hook runs before any command; its output goes to the caller as it is
  // produced and is kept with the workspace record.
  auto setup = plan->manifest.find(ws::kSetupScript);
  if (setup != plan->manifest.end() && !setup->second.symlink && req.value("setup", true)) {
    Json greq = {{"op", "exec"},
                 {"argv", {"/bin/sh", std::string(ws::kGuestPath) + "/" + ws::kSetupScript}},
                 {"env", Json::object()},
                 {"cwd", ws::kGuestPath},
                 {"timeout_ms", req.value("setup_timeout_ms", 0)},
                 {"stdin", false}};
    std::string output;
    int64_t exec_id = 0;
    Json result = RunGuestExec(**e, greq, &client, false, &output, &exec_id);
    (void)store_->SetWorkspaceSetup(
        id, exec_id ? std::optional<int>(static_cast<int>(exec_id)) : std::nullopt, output);
    reply["setup"] = {{"result", result}, {"exec_id", exec_id}, {"output_bytes", output.size()}};
  }
  (void)client.End(reply);
}

Json Daemon::DoCollect(const Json& req) {
  auto e = Lookup(req);
  if (!e.ok()) return ErrorReply(e.status());
  const std::string id = (*e)->record.id;
  auto wsrec = store_->GetWorkspace(id);
  if (!wsrec.ok()) return ErrorReply(wsrec.status());
  if (!wsrec->has_value()) {
    return ErrorReply(
        FailedPrecondition("VM " + id + " has no workspace (create it with --workspace DIR)"));
  }
  const store::WorkspaceRecord& w = **wsrec;
  auto excludes = ws::ExcludesFromLines(w.excludes.get<std::vector<std::string>>());
  if (!excludes.ok()) return ErrorReply(excludes.status());
  auto before = ws::ManifestFromJson(w.manifest);
  if (!before.ok()) return ErrorReply(before.status());

  std::string into = req.value("into", "");
  std::optional<TempDir> temp;
  std::string staging;
  if (!into.empty()) {
    if (into[0] != '/') return ErrorReply(InvalidArgument("'into' must be an absolute path"));
    struct stat st;
    if (::lstat(into.c_str(), &st) == 0) {
      return ErrorReply(
          Status(Code::kAlreadyExists, into + " already exists; collect into a new directory"));
    }
    staging = into;
  } else {
    std::string parent = opts_.paths.state + "/collect";
    Status st = MakeDirs(parent, 0700);
    if (!st.ok()) return ErrorReply(st);
    auto t = TempDir::Make(parent, id + "-");
    if (!t.ok()) return ErrorReply(t.status());
    temp.emplace(std::move(*t));
    staging = temp->path();
  }

  store::CollectRecord rec;
  rec.vm_id = id;
  rec.collected_at = store::NowSeconds();
  auto last = store_->LastExecId(id);
  if (last.ok()) rec.exec_id = *last;
  auto failed = [&](const Status& st) {
    if (!into.empty()) (void)RemoveTree(into);
    rec.outcome = "error";
    rec.error = st.message();
    (void)store_->InsertCollect(rec);
    return ErrorReply(st.Annotate("collect the workspace of VM " + id));
  };

  Json greq = {{"op", "get"}, {"path", ws::kGuestPath}, {"exclude", Json::array()}};
  for (const auto& n : excludes->PlainDirNames()) greq["exclude"].push_back(n + "/*");
  auto guest = (*e)->vm->Open(greq);
  if (!guest.ok()) {
    NoteDeath(**e);
    return failed(guest.status());
  }
  auto gone = [&](const Status& st) -> Status {
    if (!(*e)->vm->alive()) NoteDeath(**e);
    std::string why = (*e)->vm->death_reason();
    return why.empty() ? st : Unavailable("the guest is gone: " + why);
  };
  // meta, then the tar on channel 1, then EOF and END.
  bool eof = false;
  Json guest_end;
  auto next_chunk = [&]() -> Result<std::string> {
    for (;;) {
      if (eof) return std::string();
      auto m = (*guest)->Next();
      if (!m.ok()) return gone(m.status());
      switch (m->kind) {
        case Kind::kData:
          if (m->channel == channel::kChanOut) return std::move(m->data);
          break;
        case Kind::kEof:
          eof = true;
          return std::string();
        case Kind::kEvent:
          break;
        case Kind::kEnd:
          guest_end = m->body;
          RETURN_IF_ERROR(StatusFromGuestEnd(m->body));
          return Internal("the guest ended the transfer before its data");
        case Kind::kReset:
          return gone(Unavailable("the guest aborted the transfer: " +
                                  m->body.value("reason", std::string("no reason given"))));
      }
    }
  };
  ws::ExtractReport report;
  ws::ExtractOptions xo;
  xo.excludes = &*excludes;
  xo.quota_bytes = static_cast<uint64_t>(w.quota_bytes);
  Status st = ws::ExtractTar(next_chunk, staging, xo, &report);
  if (st.code() == Code::kResourceExhausted && report.bytes > xo.quota_bytes) {
    (void)(*guest)->Reset("over the workspace quota");
    return failed(ResourceExhausted(
        "/workspace holds more than the workspace quota of " +
        ws::FormatBytes(static_cast<uint64_t>(w.quota_bytes)) + " (" +
        std::to_string(w.quota_bytes) +
        " bytes); nothing was collected and the VM keeps running (remove files, or create "
        "the VM with a larger --workspace-quota)"));
  }
  if (!st.ok()) {
    (void)(*guest)->Reset("collect failed");
    return failed(st);
  }
  if (guest_end.is_null()) {
    auto end = AwaitGuestEnd(**guest);
    if (!end.ok()) return failed(gone(end.status()));
    guest_end = *end;
  }
  st = StatusFromGuestEnd(guest_end);
  if (!st.ok()) return failed(st);
  for (auto& s : ws::SkippedFromTarWarnings(guest_end.value("warnings", ""))) {
    report.skipped.push_back(std::move(s));
  }
  auto after = ws::ManifestFromTree(staging, *excludes);
  if (!after.ok()) return failed(after.status());
  auto changes = ws::Diff(*before, *after);
  rec.changes = ws::ChangesToJson(changes);
  rec.files = static_cast<int64_t>(after->size());
  rec.bytes = static_cast<int64_t>(ws::TotalBytes(*after));
  rec.skipped = SkippedJson(report.skipped);
  rec.branch = "trybox/" + id;
  if (req.contains("branch_id")) {  // a vm_agent run commits on trybox/<run-id>
    std::string b = req.value("branch_id", "");
    st = ValidateName("branch id", b);
    if (!st.ok()) return failed(st);
    rec.branch = "trybox/" + b;
  }

  ws::CommitOutcome commit;
  if (req.value("commit", true)) {
    std::string command = req.value("command", "");
    if (command.empty()) {
      auto execs = store_->ListExecs(id);
      if (execs.ok() && !execs->empty()) command = JoinArgv(execs->back().argv);
    }
    Json counts = Counts(rec.changes);
    std::string message =
        "trybox: work of VM " + id + "\n\nVM: " + id + "\nImage: " + (*e)->record.image +
        " (manifest sha256 " + (*e)->record.image_sha256 + ")\nCommand: " + command +
        "\nFiles changed: " + std::to_string(changes.size()) + " " + counts.dump() + "\n";
    if (!rec.skipped.empty()) message += "Skipped (not collected): " + rec.skipped.dump() + "\n";
    ws::CommitInput ci{w.dir,      w.base.empty() ? std::nullopt : std::optional(w.base),
                       *excludes,  *before,
                       *after,     staging,
                       rec.branch, message};
    auto c = ws::CommitCollected(ci);
    if (!c.ok()) return failed(c.status());
    commit = *c;
  } else {
    commit.note = "not committed (commit: false)";
  }
  if (!commit.committed) rec.branch.clear();
  rec.commit = commit.committed ? commit.commit : "";
  rec.note = commit.note;
  rec.outcome = "ok";
  auto cid = store_->InsertCollect(rec);
  if (!cid.ok()) return ErrorReply(cid.status().Annotate("record the collect"));
  rec.id = *cid;
  Json out = CollectJson(rec);
  out["committed"] = commit.committed;
  out["injected_commit"] = commit.injected_commit;
  out["excluded"] = report.excluded;
  out["tar_bytes"] = report.tar_bytes;
  out["into"] = into;
  out["dir"] = w.dir;
  return {{"ok", true}, {"collect", out}};
}

Json Daemon::DoDiff(const Json& req) {
  if (!req.contains("vm") || !req["vm"].is_string()) {
    return ErrorReply(InvalidArgument("missing field 'vm'"));
  }
  std::string id = req["vm"];
  Status st = ValidateName("VM id", id);
  if (!st.ok()) return ErrorReply(st);
  auto c = store_->LatestCollect(id);
  if (!c.ok()) return ErrorReply(c.status());
  if (!c->has_value()) {
    auto w = store_->GetWorkspace(id);
    bool has = w.ok() && w->has_value();
    return ErrorReply(
        NotFound("no collect is recorded for VM " + QuoteForMessage(id) +
                 (has ? " (run: trybox collect " + id + ")" : " (it never had a workspace)")));
  }
  return {{"ok", true}, {"collect", CollectJson(**c)}};
}

}  // namespace trybox::daemon
