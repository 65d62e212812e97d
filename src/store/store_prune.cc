// Retention in the store: deleting what the policy lets go, never a live VM's rows, never
// an open tunnel's (docs/store.md, "Retention"). A dry run does the same deletes inside a
// transaction and rolls it back, so its counts are exact.
#include "store/stmt.h"
#include "store/store.h"

namespace trybox::store {
namespace {

// Runs `body` in one write transaction; commits it, or rolls it back on error or for a dry
// run.
template <class Body>
Status InTransaction(sqlite3* db, bool dry_run, Body body) {
  RETURN_IF_ERROR(ExecSql(db, "BEGIN IMMEDIATE"));
  Status st = body();
  if (st.ok() && !dry_run) st = ExecSql(db, "COMMIT");
  if (!st.ok() || dry_run) (void)sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  return st;
}

Result<int64_t> DeleteWhere(sqlite3* db, const std::string& sql, const std::string& id) {
  Stmt s(db, sql.c_str());
  RETURN_IF_ERROR(s.prepared());
  s.Bind(1, id);
  return s.Run();
}

}  // namespace

Result<PrunedVms> Store::PruneVms(double ended_before, int64_t keep_ended, bool dry_run) {
  MutexLock lock(mu_);
  // For the transaction's body, which runs under this lock (clang's analysis cannot see that).
  sqlite3* const db = db_;
  PrunedVms out;
  {
    // Ended VMs, newest first: those past the count, or ended before the cutoff. A VM still
    // running (or dead but not yet destroyed) is never among them.
    Stmt s(db_,
           "SELECT id, ended_at FROM vms WHERE state IN ('destroyed', 'reaped') "
           "ORDER BY ended_at DESC, id");
    RETURN_IF_ERROR(s.prepared());
    int64_t n = 0;
    for (;;) {
      ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      ++n;
      double ended = s.Double(1);
      bool too_old = ended_before > 0 && ended > 0 && ended < ended_before;
      bool too_many = keep_ended > 0 && n > keep_ended;
      if (too_old || too_many) out.ids.push_back(s.Text(0));
    }
  }
  if (out.ids.empty()) return out;
  Status st = InTransaction(db, dry_run, [&]() -> Status {
    // Children first (foreign keys are on). The egress audit and agent runs have their own
    // limits: they name the VM as text.
    for (const auto& id : out.ids) {
      ASSIGN_OR_RETURN(int64_t fc,
                       DeleteWhere(db,
                                   "DELETE FROM file_changes WHERE collect_id IN (SELECT id FROM "
                                   "collects WHERE vm_id = ?)",
                                   id));
      ASSIGN_OR_RETURN(int64_t co, DeleteWhere(db, "DELETE FROM collects WHERE vm_id = ?", id));
      ASSIGN_OR_RETURN(int64_t ws, DeleteWhere(db, "DELETE FROM workspaces WHERE vm_id = ?", id));
      ASSIGN_OR_RETURN(int64_t ex, DeleteWhere(db, "DELETE FROM execs WHERE vm_id = ?", id));
      ASSIGN_OR_RETURN(int64_t vm, DeleteWhere(db, "DELETE FROM vms WHERE id = ?", id));
      out.file_changes += fc;
      out.collects += co;
      out.workspaces += ws;
      out.execs += ex;
      (void)vm;
    }
    return Status::Ok();
  });
  if (!st.ok()) return st;
  return out;
}

Result<std::vector<std::string>> Store::PruneAgentRuns(double updated_before, int64_t keep,
                                                       const std::set<std::string>& live,
                                                       bool dry_run) {
  MutexLock lock(mu_);
  // For the transaction's body, which runs under this lock (clang's analysis cannot see that).
  sqlite3* const db = db_;
  std::vector<std::string> ids;
  {
    // A run whose VM still runs is live whatever its row says.
    Stmt s(db_,
           "SELECT id, updated_at FROM agent_runs WHERE vm_id NOT IN (SELECT id FROM vms WHERE "
           "state IN ('running', 'dead')) ORDER BY updated_at DESC, id");
    RETURN_IF_ERROR(s.prepared());
    int64_t n = 0;
    for (;;) {
      ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      std::string id = s.Text(0);
      if (live.count(id)) continue;
      ++n;
      bool too_old = updated_before > 0 && s.Double(1) < updated_before;
      if (too_old || (keep > 0 && n > keep)) ids.push_back(std::move(id));
    }
  }
  if (ids.empty()) return ids;
  Status st = InTransaction(db, dry_run, [&]() -> Status {
    for (const auto& id : ids) {
      ASSIGN_OR_RETURN(int64_t n, DeleteWhere(db, "DELETE FROM agent_runs WHERE id = ?", id));
      (void)n;
    }
    return Status::Ok();
  });
  if (!st.ok()) return st;
  return ids;
}

Result<int64_t> Store::PruneEgress(double max_age_seconds, int64_t max_rows, double now,
                                   bool dry_run) {
  MutexLock lock(mu_);
  // For the transaction's body, which runs under this lock (clang's analysis cannot see that).
  sqlite3* const db = db_;
  // A row that may describe a tunnel still open: never closed, its VM still running.
  const std::string live =
      "(ended_at = 0 AND vm_id IN (SELECT id FROM vms WHERE state = 'running'))";
  int64_t removed = 0;
  Status st = InTransaction(db, dry_run, [&]() -> Status {
    if (max_age_seconds > 0) {
      Stmt s(db, ("DELETE FROM egress WHERE NOT " + live +
                  " AND (CASE WHEN ended_at > 0 THEN ended_at ELSE started_at END) < ?")
                     .c_str());
      RETURN_IF_ERROR(s.prepared());
      s.Bind(1, now - max_age_seconds);
      ASSIGN_OR_RETURN(int64_t n, s.Run());
      removed += n;
    }
    if (max_rows > 0) {
      Stmt s(db, ("DELETE FROM egress WHERE id IN (SELECT id FROM egress WHERE NOT " + live +
                  " ORDER BY id DESC LIMIT -1 OFFSET ?)")
                     .c_str());
      RETURN_IF_ERROR(s.prepared());
      s.Bind(1, max_rows);
      ASSIGN_OR_RETURN(int64_t n, s.Run());
      removed += n;
    }
    return Status::Ok();
  });
  if (!st.ok()) return st;
  if (removed > 0 && !dry_run) {
    Status cp = CheckpointLocked();
    if (!cp.ok() && cp.code() != Code::kUnavailable) return cp;
  }
  return removed;
}

}  // namespace trybox::store
