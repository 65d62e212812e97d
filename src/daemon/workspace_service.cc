#include "daemon/workspace_service.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

#include "daemon/workspace_disk.h"
#include "util/fd.h"
#include "util/names.h"
#include "util/sha256.h"
#include "util/utf8.h"
#include "workspace/git.h"
#include "workspace/tar.h"

namespace trybox::daemon {
namespace {

namespace ws = trybox::workspace;

std::string JoinArgv(const Json& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += " ";
    s += a.is_string() ? a.get<std::string>() : a.dump();
  }
  return s;
}

// A collect's tree as a tar, from the workspace disk or from the guest's own tar: the one
// shape ExtractTar reads, whichever way the bytes came. Finish adds to `skipped` what the
// tar could not carry.
class TreeSource {
 public:
  virtual ~TreeSource() = default;
  // The next chunk of the tar; "" at its end.
  virtual Result<std::string> Next() = 0;
  // After Next() returned "": how the source ended.
  virtual Status Finish(ws::ExtractReport& report) = 0;
  // Stops the source early (the guest thaws, or stops its tar).
  virtual void Abort(const std::string& why) = 0;
};

class DiskTreeSource final : public TreeSource {
 public:
  explicit DiskTreeSource(std::unique_ptr<WorkspaceDiskReader> r) : r_(std::move(r)) {}
  Result<std::string> Next() override { return r_->Next(); }
  Status Finish(ws::ExtractReport& report) override {
    RETURN_IF_ERROR(r_->Finish());
    for (const auto& s : r_->skipped()) report.skipped.push_back(s);
    report.skipped_unlisted += r_->skipped_unlisted();
    return Status::Ok();
  }
  void Abort(const std::string& why) override { r_->Abort(why); }

 private:
  std::unique_ptr<WorkspaceDiskReader> r_;
};

class GuestTarTreeSource final : public TreeSource {
 public:
  explicit GuestTarTreeSource(std::unique_ptr<TarReader> r) : r_(std::move(r)) {}
  Result<std::string> Next() override { return r_->Next(); }
  Status Finish(ws::ExtractReport& report) override {
    ASSIGN_OR_RETURN(std::string warnings, r_->Finish());
    for (auto& s : ws::SkippedFromTarWarnings(warnings)) report.skipped.push_back(std::move(s));
    return Status::Ok();
  }
  void Abort(const std::string& why) override { r_->Abort(why); }

 private:
  std::unique_ptr<TarReader> r_;
};

}  // namespace

Json CountChanges(const Json& changes) {
  Json c = {{"added", 0}, {"modified", 0}, {"deleted", 0}, {"mode_changed", 0}, {"renamed", 0}};
  for (const auto& ch : changes) {
    if (!ch.is_object() || !ch.contains("change") || !ch["change"].is_string()) continue;
    std::string k = ch["change"];
    if (c.contains(k)) c[k] = c[k].get<int>() + 1;
  }
  return c;
}

Status WorkspaceService::SendTree(VmEntry& vm, const std::string& root,
                                  const ws::Manifest& manifest, const ws::Quota& quota,
                                  const char** transfer, bool written) {
  Status st;
  if (WorkspaceDiskPort* disk = vm.workspace_disk()) {
    st = MountWorkspace(vm, *disk, root, manifest, ws::Ext4GeometryFor(quota.bytes, quota.entries),
                        written);
    if (st.ok()) {
      vm.set_workspace_on_disk();
      if (transfer) *transfer = kTransferWorkspaceDisk;
    }
  } else {
    bool via_disk = false;
    st = PutTar(
        vm, ws::kGuestPath,
        [&](const std::function<Status(std::string_view)>& out) {
          return ws::WriteTar(root, manifest, out);
        },
        &via_disk);
    if (transfer) *transfer = via_disk ? kTransferDisk : kTransferChannel;
  }
  if (!st.ok()) vms_.NoteDeath(vm);
  return st;
}

Result<ws::InjectPlan> WorkspaceService::Plan(VmEntry& vm, const std::string& dir,
                                              const ws::Quota& quota, bool* written) {
  *written = false;
  WorkspaceDiskPort* disk = vm.workspace_disk();
  if (!disk) return ws::PlanInject(dir, quota);
  // The disk's file system needs only the list (sizes, modes, links): it is written while
  // the plan reads the same files for their digests.
  return ws::PlanInject(dir, quota, [&](const ws::InjectPlan& listed) -> Status {
    RETURN_IF_ERROR(ws::WriteExt4ImageToFd(listed.dir, listed.manifest, disk->fd_for_io(),
                                           ws::Ext4GeometryFor(quota.bytes, quota.entries)));
    *written = true;
    return Status::Ok();
  });
}

Result<store::WorkspaceRecord> WorkspaceService::Inject(VmEntry& vm, const ws::InjectPlan& plan,
                                                        const ws::Quota& quota,
                                                        const char** transfer, bool written) {
  Status st = SendTree(vm, plan.dir, plan.manifest, quota, transfer, written);
  if (!st.ok()) return st.Annotate("copy the workspace into VM " + vm.id());
  store::WorkspaceRecord rec;
  rec.vm_id = vm.id();
  rec.dir = plan.dir;
  rec.base = plan.base.value_or("");
  rec.excludes = plan.excludes.project_lines();
  rec.manifest = ws::ManifestToJson(plan.manifest);
  rec.quota_bytes = static_cast<int64_t>(quota.bytes);
  rec.quota_entries = static_cast<int64_t>(quota.entries);
  rec.files = static_cast<int64_t>(plan.manifest.size());
  rec.bytes = static_cast<int64_t>(ws::TotalBytes(plan.manifest));
  rec.skipped = ws::SkippedToJson(plan.skipped);
  rec.injected_at = store::NowSeconds();
  st = store_.InsertWorkspace(rec);
  if (!st.ok()) return st.Annotate("record the workspace");
  vm.set_has_workspace();
  return rec;
}

Result<std::optional<SetupOutcome>> WorkspaceService::RunSetup(VmEntry& vm,
                                                               const ws::Manifest& manifest,
                                                               int64_t timeout_ms,
                                                               channel::Stream* client,
                                                               bool record) {
  auto hook = manifest.find(ws::kSetupScript);
  // A symlinked hook could point anywhere in the guest; it is not the project's file.
  if (hook == manifest.end() || hook->second.symlink) return std::optional<SetupOutcome>();
  ASSIGN_OR_RETURN(
      SetupOutcome out,
      ExecHook(vm, std::string(ws::kGuestPath) + "/" + ws::kSetupScript, "", timeout_ms, client));
  if (record) {
    (void)store_.SetWorkspaceSetup(
        vm.id(), out.exec_id ? std::optional<int>(static_cast<int>(out.exec_id)) : std::nullopt,
        out.output);
  }
  return std::optional<SetupOutcome>(std::move(out));
}

Result<SetupOutcome> WorkspaceService::ExecHook(VmEntry& vm, const std::string& script,
                                                const std::string& user, int64_t timeout_ms,
                                                channel::Stream* client) {
  ExecSpec spec;
  spec.argv = {"/bin/sh", script};
  spec.cwd = ws::kGuestPath;
  spec.timeout_ms = timeout_ms;
  spec.user = user;
  spec.privileged = user.empty() && vm.privileged();
  SetupOutcome out;
  ExecIo io;
  io.client = client;
  io.capture = &out.output;
  ASSIGN_OR_RETURN(out.result, vms_.Exec(vm, spec, io, &out.exec_id));
  return out;
}

Result<std::optional<CallerHook>> WorkspaceService::InjectedHook(const std::string& vm_id) {
  ASSIGN_OR_RETURN(auto w, store_.GetWorkspace(vm_id));
  if (!w) return NotFound("VM " + vm_id + " has no workspace record");
  ASSIGN_OR_RETURN(ws::Manifest manifest, ws::ManifestFromJson(w->manifest));
  auto it = manifest.find(ws::kSetupScript);
  if (it == manifest.end() || it->second.symlink) return std::optional<CallerHook>();
  const ws::Entry& e = it->second;
  const std::string what = std::string("the caller's ") + ws::kSetupScript;
  if (e.blob.empty()) return Internal(what + " has no blob id in the workspace record");
  ASSIGN_OR_RETURN(ws::GitRepo repo, ws::GitRepo::Open(w->dir));
  auto content = repo.Run({"cat-file", "blob", e.blob});
  if (!content.ok()) {
    return content.status().Annotate("read " + what + " (blob " + e.blob + ") from " + w->dir);
  }
  if (Sha256Hex(*content) != e.sha256) {
    return FailedPrecondition("blob " + e.blob + " in " + w->dir + " is not the " + what +
                              " that went into VM " + vm_id + " (its SHA-256 differs)");
  }
  return std::optional<CallerHook>(CallerHook{std::move(*content), e.blob, e.sha256});
}

Result<SetupOutcome> WorkspaceService::RunHookAs(VmEntry& vm, const CallerHook& hook,
                                                 const std::string& user, int64_t timeout_ms) {
  if (user.empty() || user == "root") {
    return InvalidArgument("a hook run in someone else's tree never runs as root");
  }
  Status st = WriteFile(vm, kHookCopyPath, hook.content, 0644, true);
  if (!st.ok()) return st.Annotate(std::string("copy the caller's hook to ") + kHookCopyPath);
  return ExecHook(vm, kHookCopyPath, user, timeout_ms, nullptr);
}

Result<InjectOutcome> WorkspaceService::WorkspaceIn(VmEntry& vm, const WorkspaceInRequest& req,
                                                    channel::Stream* client) {
  ws::Quota quota;
  if (req.quota_bytes > 0) quota.bytes = static_cast<uint64_t>(req.quota_bytes);
  if (req.quota_entries > 0) quota.entries = static_cast<uint64_t>(req.quota_entries);
  ASSIGN_OR_RETURN(auto existing, store_.GetWorkspace(vm.id()));
  if (existing) {
    return FailedPrecondition("VM " + vm.id() + " already has a workspace, from " + existing->dir);
  }
  bool written = false;
  ASSIGN_OR_RETURN(ws::InjectPlan plan, Plan(vm, req.dir, quota, &written));
  InjectOutcome out;
  ASSIGN_OR_RETURN(out.record, Inject(vm, plan, quota, &out.transfer, written));
  // The project's hook runs before any command; its output goes to the caller as it is
  // produced and is kept with the workspace record.
  if (req.setup) {
    ASSIGN_OR_RETURN(out.setup, RunSetup(vm, plan.manifest, req.setup_timeout_ms, client, true));
  }
  return out;
}

Result<CollectOutcome> WorkspaceService::Collect(VmEntry& vm, const CollectOptions& opts) {
  const std::string& id = vm.id();
  ASSIGN_OR_RETURN(auto wsrec, store_.GetWorkspace(id));
  if (!wsrec) {
    return FailedPrecondition("VM " + id + " has no workspace (create it with --workspace DIR)");
  }
  const store::WorkspaceRecord& w = *wsrec;
  if (!opts.branch_id.empty()) RETURN_IF_ERROR(ValidateName("branch id", opts.branch_id));
  // A collect may commit into the user's repository: it does not start unless its row can be
  // written, so that nothing lands in a history with no record of how it got there.
  RETURN_IF_ERROR(store_.CheckWritable());

  CollectOutcome out;
  store::CollectRecord& rec = out.record;
  rec.vm_id = id;
  rec.collected_at = store::NowSeconds();
  if (auto last = store_.LastExecId(id); last.ok()) rec.exec_id = *last;
  // From here on every failure is recorded (outcome "error"), including one before any
  // staging exists (a full state directory, an unreadable exclude list).
  auto failed_before_into = [&](const Status& st) -> Status {
    rec.outcome = "error";
    rec.error = st.message();
    (void)store_.InsertCollect(rec);
    return st.Annotate("collect the workspace of VM " + id);
  };
  auto failed = [&](const Status& st) -> Status {
    if (!opts.into.empty()) (void)RemoveTree(opts.into);
    return failed_before_into(st);
  };

  std::vector<std::string> lines;
  for (const auto& l : w.excludes) {
    if (l.is_string()) lines.push_back(l.get<std::string>());
  }
  auto excludes_read = ws::ExcludesFromLines(lines);
  if (!excludes_read.ok()) return failed_before_into(excludes_read.status());
  const ws::ExcludeList excludes = std::move(*excludes_read);
  auto before_read = ws::ManifestFromJson(w.manifest);
  if (!before_read.ok()) return failed_before_into(before_read.status());
  const ws::Manifest before = std::move(*before_read);

  // The collect's own leftovers (its staging tree, its object quarantine's marker) live in
  // collect/, named after the VM: the next daemon, or a prune, removes what a crash left.
  const std::string collect_dir = state_dir_ + "/collect";
  Status made = MakeDirs(collect_dir, 0700);
  if (!made.ok()) return failed_before_into(made);
  // A collect in flight is named by a marker: a daemon killed during it leaves the marker,
  // and the next one records the collect as `interrupted` (Daemon::Init), so that a collect
  // cut off by a crash still has its row.
  static std::atomic<uint64_t> markers{0};
  const std::string marker = collect_dir + "/" + id + std::string(kCollectMarker) +
                             std::to_string(::getpid()) + "." + std::to_string(++markers);
  (void)WriteFileAtomic(marker, rec.exec_id ? std::to_string(*rec.exec_id) : "", 0600);
  struct Unmark {
    const std::string& path;
    ~Unmark() { (void)::unlink(path.c_str()); }
  } unmark{marker};
  std::optional<TempDir> temp;
  std::string staging = opts.into;
  if (!opts.into.empty()) {
    // Someone else's directory is never removed: an existing one is refused before anything.
    struct stat st;
    if (::lstat(opts.into.c_str(), &st) == 0) {
      return failed_before_into(Status(
          Code::kAlreadyExists, opts.into + " already exists; collect into a new directory"));
    }
  } else {
    auto t = TempDir::Make(collect_dir, id + "-");
    if (!t.ok()) return failed_before_into(t.status());
    temp.emplace(std::move(*t));
    staging = temp->path();
  }

  // The tree comes from the workspace disk (read on the host while the guest keeps it
  // frozen) or as the guest's tar; either way it is untrusted and unpacked the same way.
  std::unique_ptr<TreeSource> source;
  WorkspaceDiskPort* disk = vm.workspace_on_disk() ? vm.workspace_disk() : nullptr;
  if (disk) {
    // Past the quota the unpacking stops first, with its own message; this bounds the reader.
    const uint64_t max_entries =
        w.quota_entries > 0 ? static_cast<uint64_t>(w.quota_entries) * 2 + 1024 : 0;
    const uint64_t max_bytes =
        w.quota_bytes > 0 ? static_cast<uint64_t>(w.quota_bytes) * 2 + (uint64_t{64} << 20) : 0;
    auto r = WorkspaceDiskReader::Open(vm, *disk, {DefaultExt4TarBinary(), max_entries, max_bytes});
    if (!r.ok()) {
      vms_.NoteDeath(vm);
      return failed(r.status());
    }
    source = std::make_unique<DiskTreeSource>(std::move(*r));
    out.transfer = kTransferWorkspaceDisk;
  } else {
    std::vector<std::string> guest_excludes;
    for (const auto& n : excludes.PlainDirNames()) guest_excludes.push_back(n + "/*");
    // Through the transfer disk the tar may take the quota and half again (its headers and
    // padding); a bigger one takes the channel, where the quota is counted as it unpacks.
    const uint64_t disk_room = static_cast<uint64_t>(w.quota_bytes) / 2 * 3 + (uint64_t{32} << 20);
    auto r = TarReader::Open(vm, ws::kGuestPath, guest_excludes, disk_room);
    if (!r.ok()) {
      vms_.NoteDeath(vm);
      return failed(r.status());
    }
    out.transfer = (*r)->via_disk() ? kTransferDisk : kTransferChannel;
    source = std::make_unique<GuestTarTreeSource>(std::move(*r));
  }
  ws::ExtractReport report;
  ws::ExtractOptions xo = ws::ExtractOptions::ForCollect(
      &excludes, static_cast<uint64_t>(w.quota_bytes), static_cast<uint64_t>(w.quota_entries));
  // Files that come back as they went in are not written to the staging tree (most of a
  // workspace, usually): the commit takes their blobs from what went in. With --into the
  // user gets every file.
  if (opts.into.empty()) xo.unchanged_from = &before;
  Status st = ws::ExtractTar([&] { return source->Next(); }, staging, xo, &report);
  if (st.code() == Code::kResourceExhausted &&
      (report.bytes > xo.quota_bytes || (xo.quota_entries && report.entries > xo.quota_entries))) {
    source->Abort("over the workspace quota");
    bool entries = xo.quota_entries && report.entries > xo.quota_entries;
    std::string what = entries
                           ? "more than the workspace quota of " + std::to_string(w.quota_entries) +
                                 " entries (files, directories and symlinks)"
                           : "more than the workspace quota of " +
                                 ws::FormatBytes(static_cast<uint64_t>(w.quota_bytes)) + " (" +
                                 std::to_string(w.quota_bytes) + " bytes)";
    return failed(ResourceExhausted(
        "/workspace holds " + what +
        "; nothing was collected and the VM keeps running (remove files, or create the VM "
        "with a larger " +
        (entries ? "--workspace-quota-entries" : "--workspace-quota") + ")"));
  }
  if (!st.ok()) {
    source->Abort("collect failed");
    vms_.NoteDeath(vm);
    return failed(st);
  }
  if (Status finished = source->Finish(report); !finished.ok()) {
    vms_.NoteDeath(vm);
    return failed(finished);
  }
  auto after = ws::ManifestFromTree(staging, excludes, &report.skipped);
  if (!after.ok()) return failed(after.status());
  after->merge(report.unwritten);
  auto changes = ws::Diff(before, *after);
  rec.changes = ws::ChangesToJson(changes);
  rec.files = static_cast<int64_t>(after->size());
  rec.bytes = static_cast<int64_t>(ws::TotalBytes(*after));
  rec.skipped = ws::SkippedToJson(report.skipped);
  rec.skipped_unlisted = static_cast<int64_t>(report.skipped_unlisted);
  rec.branch = "trybox/" + (opts.branch_id.empty() ? id : opts.branch_id);

  ws::CommitOutcome commit;
  if (opts.commit) {
    std::string command = opts.command;
    if (command.empty()) {
      auto execs = store_.ListExecs(id);
      if (execs.ok() && !execs->empty()) command = JoinArgv(execs->back().argv);
    }
    store::VmRecord vr = vm.record();
    ws::CommitInput ci{w.dir,
                       w.base.empty() ? std::nullopt : std::optional(w.base),
                       excludes,
                       before,
                       *after,
                       staging,
                       rec.branch,
                       ws::CollectCommitMessage({id, vr.image, vr.image_sha256, command, changes,
                                                 report.skipped, report.skipped_unlisted})};
    // The daemon's own directories never appear in a user's history.
    ci.private_paths = {state_dir_};
    ci.quarantine_marker =
        collect_dir + "/" + id + "-" + RandomHex(6) + std::string(ws::kQuarantineMarkerSuffix);
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
  auto cid = store_.InsertCollect(rec);
  if (!cid.ok()) return cid.status().Annotate("record the collect");
  rec.id = *cid;
  out.committed = commit.committed;
  out.injected_commit = commit.injected_commit;
  out.excluded = static_cast<int64_t>(report.excluded);
  out.tar_bytes = static_cast<int64_t>(report.tar_bytes);
  out.into = opts.into;
  out.dir = w.dir;
  return out;
}

Result<store::CollectRecord> WorkspaceService::LatestCollect(const std::string& vm_id) {
  RETURN_IF_ERROR(ValidateName("VM id", vm_id));
  ASSIGN_OR_RETURN(auto c, store_.LatestCollect(vm_id));
  if (c) return *c;
  auto w = store_.GetWorkspace(vm_id);
  bool has = w.ok() && w->has_value();
  return NotFound("no collect is recorded for VM " + QuoteForMessage(vm_id) +
                  (has ? " (run: trybox collect " + vm_id + ")" : " (it never had a workspace)"));
}

Result<Json> WorkspaceService::Patch(const std::string& vm_id, size_t max_bytes) {
  ASSIGN_OR_RETURN(store::CollectRecord c, LatestCollect(vm_id));
  if (c.commit.empty()) {
    return FailedPrecondition("the newest collect of VM " + vm_id + " made no commit" +
                              (c.note.empty() ? "" : " (" + c.note + ")"));
  }
  ASSIGN_OR_RETURN(auto w, store_.GetWorkspace(vm_id));
  if (!w) return NotFound("VM " + vm_id + " has no workspace record");
  ASSIGN_OR_RETURN(workspace::GitRepo repo, workspace::GitRepo::Open(w->dir));
  // The commit against its first parent (what was injected), as text: no colour, no
  // external diff or textconv driver of the repository's configuration runs.
  ASSIGN_OR_RETURN(std::string text, repo.Run({"show", "--format=", "--no-color", "--no-ext-diff",
                                               "--no-textconv", "--find-renames", c.commit}));
  const size_t bytes = text.size();
  const bool truncated = bytes > max_bytes;
  if (truncated) text.resize(max_bytes);
  Json out = {{"commit", c.commit}, {"bytes", bytes}, {"truncated", truncated}};
  SetBytesField(out, "text", text);
  return out;
}

}  // namespace trybox::daemon
