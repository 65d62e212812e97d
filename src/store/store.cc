#include "store/store.h"

#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "store/schema.h"
#include "store/stmt.h"
#include "util/utf8.h"

namespace trybox::store {
namespace {

// JSON columns are written with a dump that cannot throw: a byte that is not UTF-8 and
// slipped past the encoders (util/utf8.h) costs a U+FFFD, never the record.
std::string Dump(const Json& j) { return SafeDump(j); }

// A string field of a JSON object, "" when absent or not a string (never a type_error).
std::string Str(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

VmRecord ReadVm(Stmt& s) {
  VmRecord v;
  v.id = s.Text(0);
  v.image = s.Text(1);
  v.image_sha256 = s.Text(2);
  v.state = s.Text(3);
  v.pid = s.Int(4);
  v.accel = s.Text(5);
  v.memory_mib = static_cast<int>(s.Int(6));
  v.cpus = static_cast<int>(s.Int(7));
  v.dir = s.Text(8);
  v.created_at = s.Double(9);
  v.ended_at = s.Double(10);
  v.note = s.Text(11);
  if (auto p = s.OptInt(12)) {
    v.privileged = *p != 0;
  } else {
    v.privileged.reset();
  }
  return v;
}

constexpr const char* kVmColumns =
    "id, image, image_sha256, state, pid, accel, memory_mib, cpus, dir, created_at, ended_at, "
    "note, privileged";

}  // namespace

double NowSeconds() {
  struct timeval tv;
  ::gettimeofday(&tv, nullptr);
  return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6;
}

Result<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  ASSIGN_OR_RETURN(OpenedDb opened, OpenChecked(path));
  std::unique_ptr<Store> store(new Store(opened.db, path));
  // WAL with synchronous=NORMAL: a commit is in the WAL file before it returns, so it
  // survives a daemon crash; only a power loss may drop the last commits. FULL fsyncs every
  // commit, and the two commits of each exec cost 11 ms of its round trip on this host.
  RETURN_IF_ERROR(
      store->Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;"));
  MutexLock lock(store->mu_);
  store->info_.created = opened.created;
  store->info_.found_version = opened.found_version;
  store->info_.schema_version = opened.migrated_to;
  store->OpenMarkLocked();
  return store;
}

Store::~Store() {
  MutexLock lock(mu_);
  sqlite3_close_v2(db_);
  if (mark_fd_ >= 0) ::close(mark_fd_);
}

Status Store::Exec(const std::string& sql) {
  MutexLock lock(mu_);
  return ExecSql(db_, sql);
}

Status Store::InsertVm(const VmRecord& v) {
  MutexLock lock(mu_);
  Stmt s(db_,
         "INSERT INTO vms (id, image, image_sha256, state, pid, accel, memory_mib, cpus, dir, "
         "created_at, ended_at, note, privileged) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, v.id).Bind(2, v.image).Bind(3, v.image_sha256).Bind(4, v.state).Bind(5, v.pid);
  s.Bind(6, v.accel).Bind(7, int64_t{v.memory_mib}).Bind(8, int64_t{v.cpus}).Bind(9, v.dir);
  s.Bind(10, v.created_at).Bind(11, v.ended_at).Bind(12, v.note);
  s.Bind(13, v.privileged ? std::optional<int>(*v.privileged ? 1 : 0) : std::nullopt);
  ASSIGN_OR_RETURN(bool row, s.Step());
  (void)row;
  return Status::Ok();
}

Status Store::UpdateVmState(const std::string& id, const std::string& state,
                            const std::string& note) {
  MutexLock lock(mu_);
  Stmt s(db_, "UPDATE vms SET state = ?, note = ?, ended_at = ? WHERE id = ?");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, state).Bind(2, note).Bind(3, state == "running" ? 0.0 : NowSeconds()).Bind(4, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  (void)row;
  if (sqlite3_changes(db_) == 0) return NotFound("no VM record " + id);
  return Status::Ok();
}

Result<std::optional<VmRecord>> Store::GetVm(const std::string& id) {
  MutexLock lock(mu_);
  Stmt s(db_, (std::string("SELECT ") + kVmColumns + " FROM vms WHERE id = ?").c_str());
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<VmRecord>();
  return std::optional<VmRecord>(ReadVm(s));
}

Result<std::vector<VmRecord>> Store::ListVms(const std::vector<std::string>& states) {
  MutexLock lock(mu_);
  std::string sql = std::string("SELECT ") + kVmColumns + " FROM vms";
  if (!states.empty()) {
    sql += " WHERE state IN (";
    for (size_t i = 0; i < states.size(); ++i) sql += i ? ",?" : "?";
    sql += ")";
  }
  sql += " ORDER BY created_at DESC";
  Stmt s(db_, sql.c_str());
  RETURN_IF_ERROR(s.prepared());
  for (size_t i = 0; i < states.size(); ++i) s.Bind(static_cast<int>(i + 1), states[i]);
  std::vector<VmRecord> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back(ReadVm(s));
  }
  return out;
}

Result<int64_t> Store::InsertExec(const ExecRecord& e) {
  MutexLock lock(mu_);
  Stmt s(db_, "INSERT INTO execs (vm_id, argv, cwd, started_at, outcome) VALUES (?,?,?,?,?)");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, e.vm_id).Bind(2, Dump(e.argv)).Bind(3, e.cwd).Bind(4, e.started_at);
  s.Bind(5, e.outcome);
  ASSIGN_OR_RETURN(bool row, s.Step());
  (void)row;
  int64_t id = sqlite3_last_insert_rowid(db_);
  NoteInsertLocked(kMarkExecs, id);
  return id;
}

Status Store::FinishExec(const ExecRecord& e) {
  MutexLock lock(mu_);
  Stmt s(db_,
         "UPDATE execs SET ended_at = ?, outcome = ?, exit_code = ?, signal = ?, error = ?, "
         "stdout_bytes = ?, stderr_bytes = ?, duration_ms = ? WHERE id = ?");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, e.ended_at).Bind(2, e.outcome).Bind(3, e.exit_code).Bind(4, e.signal);
  s.Bind(5, e.error).Bind(6, e.stdout_bytes).Bind(7, e.stderr_bytes);
  s.Bind(8, e.duration_ms).Bind(9, e.id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  (void)row;
  return Status::Ok();
}

Result<int64_t> Store::MarkInterruptedExecs(double now, const std::string& why) {
  MutexLock lock(mu_);
  Stmt s(db_,
         "UPDATE execs SET outcome = 'interrupted', ended_at = ?, error = ? "
         "WHERE outcome = 'running'");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, now).Bind(2, why);
  ASSIGN_OR_RETURN(bool row, s.Step());
  (void)row;
  return static_cast<int64_t>(sqlite3_changes(db_));
}

namespace {

constexpr const char* kExecColumns =
    "id, vm_id, argv, cwd, started_at, ended_at, outcome, exit_code, signal, error, "
    "stdout_bytes, stderr_bytes, duration_ms";

ExecRecord ReadExec(Stmt& s) {
  ExecRecord e;
  e.id = s.Int(0);
  e.vm_id = s.Text(1);
  e.argv = Json::parse(s.Text(2), nullptr, false);
  e.cwd = s.Text(3);
  e.started_at = s.Double(4);
  e.ended_at = s.Double(5);
  e.outcome = s.Text(6);
  e.exit_code = s.OptInt(7);
  e.signal = s.OptInt(8);
  e.error = s.Text(9);
  e.stdout_bytes = s.Int(10);
  e.stderr_bytes = s.Int(11);
  e.duration_ms = s.OptInt64(12);
  return e;
}

}  // namespace

std::optional<int64_t> ExecRecord::Duration() const {
  if (duration_ms) return duration_ms;
  if (ended_at <= 0) return std::nullopt;
  return std::max<int64_t>(0, static_cast<int64_t>((ended_at - started_at) * 1000));
}

Result<std::vector<ExecRecord>> Store::ListExecs(const std::string& vm_id) {
  MutexLock lock(mu_);
  Stmt s(
      db_,
      (std::string("SELECT ") + kExecColumns + " FROM execs WHERE vm_id = ? ORDER BY id").c_str());
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, vm_id);
  std::vector<ExecRecord> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back(ReadExec(s));
  }
  return out;
}

Result<std::optional<ExecRecord>> Store::GetExec(int64_t id) {
  MutexLock lock(mu_);
  Stmt s(db_, (std::string("SELECT ") + kExecColumns + " FROM execs WHERE id = ?").c_str());
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<ExecRecord>();
  return std::optional<ExecRecord>(ReadExec(s));
}

Result<std::map<std::string, ExecCount>> Store::CountExecs() {
  MutexLock lock(mu_);
  Stmt s(db_,
         "SELECT vm_id, count(*), sum(outcome = 'running') FROM execs WHERE vm_id IN "
         "(SELECT id FROM vms WHERE state = 'running') GROUP BY vm_id");
  RETURN_IF_ERROR(s.prepared());
  std::map<std::string, ExecCount> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out[s.Text(0)] = ExecCount{s.Int(1), s.Int(2)};
  }
  return out;
}

Result<int64_t> Store::InsertEgress(const EgressRecord& e) {
  MutexLock lock(mu_);
  Stmt s(db_,
         "INSERT INTO egress (vm_id, started_at, method, host, port, address, verdict, reason, "
         "override, status) VALUES (?,?,?,?,?,?,?,?,?,?)");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, e.vm_id).Bind(2, e.started_at).Bind(3, e.method).Bind(4, e.host);
  s.Bind(5, int64_t{e.port}).Bind(6, e.address).Bind(7, e.verdict).Bind(8, e.reason);
  s.Bind(9, int64_t{e.override_used}).Bind(10, int64_t{e.status});
  ASSIGN_OR_RETURN(bool row, s.Step());
  (void)row;
  int64_t id = sqlite3_last_insert_rowid(db_);
  NoteInsertLocked(kMarkEgress, id);
  return id;
}

Status Store::FinishEgress(const EgressRecord& e) {
  MutexLock lock(mu_);
  Stmt s(db_,
         "UPDATE egress SET ended_at = ?, verdict = ?, reason = ?, bytes_up = ?, bytes_down = ?, "
         "duration_ms = ? WHERE id = ?");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, e.ended_at).Bind(2, e.verdict).Bind(3, e.reason).Bind(4, e.bytes_up);
  s.Bind(5, e.bytes_down).Bind(6, e.duration_ms).Bind(7, e.id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  (void)row;
  if (sqlite3_changes(db_) == 0) return NotFound("no egress record " + std::to_string(e.id));
  return Status::Ok();
}

Result<std::vector<EgressRecord>> Store::ListEgress(const std::string& vm_id, int64_t limit,
                                                    int64_t before_id) {
  MutexLock lock(mu_);
  std::string sql =
      "SELECT id, vm_id, started_at, ended_at, method, host, port, address, verdict, reason, "
      "override, status, bytes_up, bytes_down, duration_ms FROM egress WHERE 1";
  if (!vm_id.empty()) sql += " AND vm_id = ?";
  if (before_id > 0) sql += " AND id < ?";
  sql = "SELECT * FROM (" + sql + " ORDER BY id DESC LIMIT ?) ORDER BY id";
  Stmt s(db_, sql.c_str());
  RETURN_IF_ERROR(s.prepared());
  int i = 1;
  if (!vm_id.empty()) s.Bind(i++, vm_id);
  if (before_id > 0) s.Bind(i++, before_id);
  s.Bind(i, limit);
  std::vector<EgressRecord> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    EgressRecord e;
    e.id = s.Int(0);
    e.vm_id = s.Text(1);
    e.started_at = s.Double(2);
    e.ended_at = s.Double(3);
    e.method = s.Text(4);
    e.host = s.Text(5);
    e.port = static_cast<int>(s.Int(6));
    e.address = s.Text(7);
    e.verdict = s.Text(8);
    e.reason = s.Text(9);
    e.override_used = s.Int(10) != 0;
    e.status = static_cast<int>(s.Int(11));
    e.bytes_up = s.Int(12);
    e.bytes_down = s.Int(13);
    e.duration_ms = s.Double(14);
    out.push_back(std::move(e));
  }
  return out;
}

Status Store::Checkpoint() {
  MutexLock lock(mu_);
  return CheckpointLocked();
}

Status Store::CheckpointLocked() {
  int rc = sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_TRUNCATE, nullptr, nullptr);
  if (rc == SQLITE_OK) return Status::Ok();
  if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) {
    return Unavailable("checkpoint: a reader still holds part of the WAL");
  }
  return Internal(std::string("sqlite checkpoint: ") + sqlite3_errmsg(db_));
}

Status Store::InsertWorkspace(const WorkspaceRecord& w) {
  MutexLock lock(mu_);
  Stmt s(db_,
         "INSERT INTO workspaces (vm_id, dir, base, excludes, manifest, quota_bytes, files, bytes, "
         "skipped, injected_at, quota_entries) VALUES (?,?,?,?,?,?,?,?,?,?,?)");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, w.vm_id).Bind(2, w.dir).Bind(3, w.base).Bind(4, Dump(w.excludes));
  s.Bind(5, Dump(w.manifest)).Bind(6, w.quota_bytes).Bind(7, w.files).Bind(8, w.bytes);
  s.Bind(9, Dump(w.skipped)).Bind(10, w.injected_at).Bind(11, w.quota_entries);
  ASSIGN_OR_RETURN(bool row, s.Step());
  (void)row;
  return Status::Ok();
}

Status Store::SetWorkspaceSetup(const std::string& vm_id, std::optional<int> exec_id,
                                const std::string& output) {
  MutexLock lock(mu_);
  Stmt s(db_, "UPDATE workspaces SET setup_exec_id = ?, setup_output = ? WHERE vm_id = ?");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, exec_id).Bind(2, output).Bind(3, vm_id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  (void)row;
  return Status::Ok();
}

Result<std::optional<WorkspaceRecord>> Store::GetWorkspace(const std::string& vm_id) {
  MutexLock lock(mu_);
  Stmt s(db_,
         "SELECT vm_id, dir, base, excludes, manifest, quota_bytes, files, bytes, skipped, "
         "injected_at, setup_exec_id, setup_output, quota_entries FROM workspaces WHERE vm_id = ?");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, vm_id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<WorkspaceRecord>();
  WorkspaceRecord w;
  w.vm_id = s.Text(0);
  w.dir = s.Text(1);
  w.base = s.Text(2);
  w.excludes = s.JsonCol(3);
  w.manifest = s.JsonCol(4);
  w.quota_bytes = s.Int(5);
  w.files = s.Int(6);
  w.bytes = s.Int(7);
  w.skipped = s.JsonCol(8);
  w.injected_at = s.Double(9);
  w.setup_exec_id = s.OptInt(10);
  w.setup_output = s.Text(11);
  w.quota_entries = s.Int(12);
  return std::optional<WorkspaceRecord>(std::move(w));
}

Status Store::PutAgentRun(const AgentRunRecord& r) {
  MutexLock lock(mu_);
  Stmt s(db_,
         "INSERT OR REPLACE INTO agent_runs (id, created_at, updated_at, outcome, vm_id, state, "
         "transcript) VALUES (?,?,?,?,?,?,?)");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, r.id).Bind(2, r.created_at).Bind(3, r.updated_at).Bind(4, r.outcome);
  // Guest output is repaired before it gets here; a byte that slipped through is replaced
  // rather than losing the record (Dump).
  s.Bind(5, r.vm_id).Bind(6, Dump(r.state));
  s.Bind(7, Dump(r.transcript));
  ASSIGN_OR_RETURN(bool row, s.Step());
  (void)row;
  return Status::Ok();
}

Result<std::optional<AgentRunRecord>> Store::GetAgentRun(const std::string& id) {
  MutexLock lock(mu_);
  Stmt s(db_,
         "SELECT id, created_at, updated_at, outcome, vm_id, state, transcript FROM agent_runs "
         "WHERE id = ?");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<AgentRunRecord>();
  AgentRunRecord r;
  r.id = s.Text(0);
  r.created_at = s.Double(1);
  r.updated_at = s.Double(2);
  r.outcome = s.Text(3);
  r.vm_id = s.Text(4);
  r.state = s.JsonCol(5);
  r.transcript = s.JsonCol(6);
  return std::optional<AgentRunRecord>(std::move(r));
}

Result<std::vector<AgentRunRecord>> Store::ListAgentRuns(int64_t limit) {
  MutexLock lock(mu_);
  Stmt s(db_,
         "SELECT id, created_at, updated_at, outcome, vm_id, state FROM agent_runs "
         "ORDER BY created_at DESC, id LIMIT ?");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, limit);
  std::vector<AgentRunRecord> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    AgentRunRecord r;
    r.id = s.Text(0);
    r.created_at = s.Double(1);
    r.updated_at = s.Double(2);
    r.outcome = s.Text(3);
    r.vm_id = s.Text(4);
    r.state = s.JsonCol(5);
    out.push_back(std::move(r));
  }
  return out;
}

Result<int64_t> Store::InsertCollect(const CollectRecord& c) {
  MutexLock lock(mu_);
  char* err = nullptr;
  if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return Internal("sqlite: " + msg);
  }
  auto insert = [&]() REQUIRES(mu_) -> Result<int64_t> {
    Stmt s(db_,
           "INSERT INTO collects (vm_id, exec_id, collected_at, outcome, error, files, bytes, "
           "skipped, commit_id, branch, note, skipped_unlisted) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)");
    RETURN_IF_ERROR(s.prepared());
    s.Bind(1, c.vm_id).Bind(2, c.exec_id).Bind(3, c.collected_at).Bind(4, c.outcome);
    s.Bind(5, c.error).Bind(6, c.files).Bind(7, c.bytes).Bind(8, Dump(c.skipped));
    s.Bind(9, c.commit).Bind(10, c.branch).Bind(11, c.note).Bind(12, c.skipped_unlisted);
    ASSIGN_OR_RETURN(bool row, s.Step());
    (void)row;
    int64_t id = sqlite3_last_insert_rowid(db_);
    for (const auto& ch : c.changes) {
      Stmt f(db_,
             "INSERT INTO file_changes (collect_id, change, path, old_path, old_size, new_size, "
             "old_mode, new_mode, path_b64, old_path_b64) VALUES (?,?,?,?,?,?,?,?,?,?)");
      RETURN_IF_ERROR(f.prepared());
      f.Bind(1, id).Bind(2, Str(ch, "change")).Bind(3, Str(ch, "path"));
      f.Bind(4, Str(ch, "from")).Bind(5, ch, "old_size").Bind(6, ch, "new_size");
      f.Bind(7, ch, "old_mode").Bind(8, ch, "new_mode");
      f.Bind(9, Str(ch, "path_b64")).Bind(10, Str(ch, "from_b64"));
      ASSIGN_OR_RETURN(bool r, f.Step());
      (void)r;
    }
    return id;
  };
  auto id = insert();
  if (id.ok()) {
    Status commit = ExecSql(db_, "COMMIT");
    if (!commit.ok()) {
      (void)sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return commit;
    }
    NoteInsertLocked(kMarkCollects, *id);
    return id;
  }
  (void)sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  return id;
}

Result<std::optional<CollectRecord>> Store::LatestCollect(const std::string& vm_id) {
  MutexLock lock(mu_);
  Stmt s(db_,
         "SELECT id, vm_id, exec_id, collected_at, outcome, error, files, bytes, skipped, "
         "commit_id, branch, note, skipped_unlisted FROM collects WHERE vm_id = ? ORDER BY id DESC "
         "LIMIT 1");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, vm_id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<CollectRecord>();
  CollectRecord c;
  c.id = s.Int(0);
  c.vm_id = s.Text(1);
  c.exec_id = s.OptInt(2);
  c.collected_at = s.Double(3);
  c.outcome = s.Text(4);
  c.error = s.Text(5);
  c.files = s.Int(6);
  c.bytes = s.Int(7);
  c.skipped = s.JsonCol(8);
  c.commit = s.Text(9);
  c.branch = s.Text(10);
  c.note = s.Text(11);
  c.skipped_unlisted = s.Int(12);
  Stmt f(db_,
         "SELECT change, path, old_path, old_size, new_size, old_mode, new_mode, path_b64, "
         "old_path_b64 FROM file_changes WHERE collect_id = ? ORDER BY path");
  RETURN_IF_ERROR(f.prepared());
  f.Bind(1, c.id);
  for (;;) {
    ASSIGN_OR_RETURN(bool r, f.Step());
    if (!r) break;
    Json ch = {{"change", f.Text(0)}, {"path", f.Text(1)}};
    if (!f.Text(7).empty()) ch["path_b64"] = f.Text(7);
    if (!f.Text(2).empty()) ch["from"] = f.Text(2);
    if (!f.Text(8).empty()) ch["from_b64"] = f.Text(8);
    f.OptIntInto(3, ch, "old_size");
    f.OptIntInto(4, ch, "new_size");
    f.OptIntInto(5, ch, "old_mode");
    f.OptIntInto(6, ch, "new_mode");
    c.changes.push_back(std::move(ch));
  }
  return std::optional<CollectRecord>(std::move(c));
}

Result<std::optional<int>> Store::LastExecId(const std::string& vm_id) {
  MutexLock lock(mu_);
  Stmt s(db_, "SELECT max(id) FROM execs WHERE vm_id = ?");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, vm_id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<int>();
  return s.OptInt(0);
}

Status Store::InsertApiKey(const ApiKeyRecord& k) {
  MutexLock lock(mu_);
  {
    Stmt q(db_, "SELECT 1 FROM api_keys WHERE name = ? OR hash = ?");
    RETURN_IF_ERROR(q.prepared());
    q.Bind(1, k.name).Bind(2, k.hash);
    ASSIGN_OR_RETURN(bool taken, q.Step());
    if (taken) return Status(Code::kAlreadyExists, "an API key named " + k.name + " exists");
  }
  Stmt s(db_, "INSERT INTO api_keys (id, name, hash, created_at, scope) VALUES (?,?,?,?,?)");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, k.id).Bind(2, k.name).Bind(3, k.hash).Bind(4, k.created_at).Bind(5, k.scope);
  ASSIGN_OR_RETURN(bool row, s.Step());
  (void)row;
  return Status::Ok();
}

Result<std::vector<ApiKeyRecord>> Store::ListApiKeys() {
  MutexLock lock(mu_);
  Stmt s(db_, "SELECT id, name, hash, created_at, scope FROM api_keys ORDER BY created_at, name");
  RETURN_IF_ERROR(s.prepared());
  std::vector<ApiKeyRecord> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back({s.Text(0), s.Text(1), s.Text(2), s.Double(3), s.Text(4)});
  }
  return out;
}

Result<bool> Store::DeleteApiKey(const std::string& name) {
  MutexLock lock(mu_);
  Stmt s(db_, "DELETE FROM api_keys WHERE name = ?");
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, name);
  ASSIGN_OR_RETURN(int64_t changed, s.Run());
  return changed > 0;
}

}  // namespace trybox::store
