#include "store/schema.h"

#include <sys/stat.h>
#include <unistd.h>

#include "store/stmt.h"

namespace trybox::store {
namespace {

// Version 1: the tables as they stood when versions began. CREATE ... IF NOT EXISTS, so
// that it also completes a store made before versions (which may lack later tables).
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS vms (
  id TEXT PRIMARY KEY,
  image TEXT NOT NULL,
  image_sha256 TEXT NOT NULL,
  state TEXT NOT NULL,
  pid INTEGER NOT NULL,
  accel TEXT NOT NULL,
  memory_mib INTEGER NOT NULL,
  cpus INTEGER NOT NULL,
  dir TEXT NOT NULL,
  created_at REAL NOT NULL,
  ended_at REAL NOT NULL DEFAULT 0,
  note TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS execs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  vm_id TEXT NOT NULL REFERENCES vms(id),
  argv TEXT NOT NULL,
  cwd TEXT NOT NULL,
  started_at REAL NOT NULL,
  ended_at REAL NOT NULL DEFAULT 0,
  outcome TEXT NOT NULL,
  exit_code INTEGER,
  signal INTEGER,
  error TEXT NOT NULL DEFAULT '',
  stdout_bytes INTEGER NOT NULL DEFAULT 0,
  stderr_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS execs_vm ON execs(vm_id);
CREATE TABLE IF NOT EXISTS egress (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  vm_id TEXT NOT NULL,
  started_at REAL NOT NULL,
  ended_at REAL NOT NULL DEFAULT 0,
  method TEXT NOT NULL,
  host TEXT NOT NULL,
  port INTEGER NOT NULL,
  address TEXT NOT NULL,
  verdict TEXT NOT NULL,
  reason TEXT NOT NULL,
  override INTEGER NOT NULL,
  status INTEGER NOT NULL,
  bytes_up INTEGER NOT NULL DEFAULT 0,
  bytes_down INTEGER NOT NULL DEFAULT 0,
  duration_ms REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS egress_vm ON egress(vm_id);
CREATE TABLE IF NOT EXISTS workspaces (
  vm_id TEXT PRIMARY KEY REFERENCES vms(id),
  dir TEXT NOT NULL,
  base TEXT NOT NULL,
  excludes TEXT NOT NULL,
  manifest TEXT NOT NULL,
  quota_bytes INTEGER NOT NULL,
  files INTEGER NOT NULL,
  bytes INTEGER NOT NULL,
  skipped TEXT NOT NULL,
  injected_at REAL NOT NULL,
  setup_exec_id INTEGER REFERENCES execs(id),
  setup_output TEXT NOT NULL DEFAULT '',
  quota_entries INTEGER NOT NULL DEFAULT 100000
);
CREATE TABLE IF NOT EXISTS collects (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  vm_id TEXT NOT NULL REFERENCES vms(id),
  exec_id INTEGER REFERENCES execs(id),
  collected_at REAL NOT NULL,
  outcome TEXT NOT NULL,
  error TEXT NOT NULL DEFAULT '',
  files INTEGER NOT NULL DEFAULT 0,
  bytes INTEGER NOT NULL DEFAULT 0,
  skipped TEXT NOT NULL DEFAULT '[]',
  commit_id TEXT NOT NULL DEFAULT '',
  branch TEXT NOT NULL DEFAULT '',
  note TEXT NOT NULL DEFAULT '',
  skipped_unlisted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS collects_vm ON collects(vm_id);
CREATE TABLE IF NOT EXISTS file_changes (
  collect_id INTEGER NOT NULL REFERENCES collects(id),
  change TEXT NOT NULL,
  path TEXT NOT NULL,
  old_path TEXT NOT NULL DEFAULT '',
  old_size INTEGER,
  new_size INTEGER,
  old_mode INTEGER,
  new_mode INTEGER,
  path_b64 TEXT NOT NULL DEFAULT '',
  old_path_b64 TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS file_changes_collect ON file_changes(collect_id);
CREATE TABLE IF NOT EXISTS agent_runs (
  id TEXT PRIMARY KEY,
  created_at REAL NOT NULL,
  updated_at REAL NOT NULL,
  outcome TEXT NOT NULL,
  vm_id TEXT NOT NULL DEFAULT '',
  state TEXT NOT NULL,
  transcript TEXT NOT NULL
);
)sql";

// Columns added since the tables were first created: a database made by an earlier
// version gets them when it is opened.
struct AddedColumn {
  const char* table;
  const char* column;
  const char* declaration;
};
constexpr AddedColumn kAddedColumns[] = {
    {"file_changes", "path_b64", "TEXT NOT NULL DEFAULT ''"},
    {"file_changes", "old_path_b64", "TEXT NOT NULL DEFAULT ''"},
    {"workspaces", "quota_entries", "INTEGER NOT NULL DEFAULT 100000"},
    {"collects", "skipped_unlisted", "INTEGER NOT NULL DEFAULT 0"},
};

bool HasColumn(sqlite3* db, const char* table, const char* column, Status* st) {
  Stmt s(db, "SELECT 1 FROM pragma_table_info(?) WHERE name = ?");
  if (Status p = s.prepared(); !p.ok()) {
    *st = p;
    return false;
  }
  s.Bind(1, std::string(table)).Bind(2, std::string(column));
  auto row = s.Step();
  if (!row.ok()) *st = row.status();
  return row.ok() && *row;
}

Status SchemaV1(sqlite3* db) {
  RETURN_IF_ERROR(ExecSql(db, kSchema));
  for (const auto& c : kAddedColumns) {
    Status st;
    bool present = HasColumn(db, c.table, c.column, &st);
    RETURN_IF_ERROR(st);
    if (!present) {
      RETURN_IF_ERROR(ExecSql(db, std::string("ALTER TABLE ") + c.table + " ADD COLUMN " +
                                      c.column + " " + c.declaration));
    }
  }
  return Status::Ok();
}

// Version 2: the store's own small facts (the write probe, docs/store.md).
Status SchemaV2(sqlite3* db) {
  return ExecSql(db, "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)");
}

// Version 3: the HTTP API's keys (docs/protocol/http.md): a key is kept only as its SHA-256.
Status SchemaV3(sqlite3* db) {
  return ExecSql(db,
                 "CREATE TABLE IF NOT EXISTS api_keys (id TEXT PRIMARY KEY, name TEXT NOT NULL "
                 "UNIQUE, hash TEXT NOT NULL UNIQUE, created_at REAL NOT NULL)");
}

// Version 4: a key's scope (docs/protocol/http.md, "Keys"): what it may ask for. Keys made
// before it are `sandboxes`, the only kind there was.
Status SchemaV4(sqlite3* db) {
  Status st;
  const bool present = HasColumn(db, "api_keys", "scope", &st);
  RETURN_IF_ERROR(st);
  if (present) return Status::Ok();  // a step run again changes nothing
  return ExecSql(db, "ALTER TABLE api_keys ADD COLUMN scope TEXT NOT NULL DEFAULT 'sandboxes'");
}

// Version 5: whether a VM was created --privileged (docs/security.md): its results are the
// guest's word, and listings say so. Rows recorded before it hold NULL: the daemon never
// kept the fact, so it is unknown, not "no".
Status SchemaV5(sqlite3* db) {
  Status st;
  const bool present = HasColumn(db, "vms", "privileged", &st);
  RETURN_IF_ERROR(st);
  if (present) return Status::Ok();
  return ExecSql(db, "ALTER TABLE vms ADD COLUMN privileged INTEGER");
}

// Version 6: an exec's duration as the daemon's monotonic clock measured it (issue 51.7):
// ended_at - started_at is a difference of wall times, wrong by any step of the host's
// clock between them. Rows recorded before it hold NULL: their duration is only that
// difference.
Status SchemaV6(sqlite3* db) {
  Status st;
  const bool present = HasColumn(db, "execs", "duration_ms", &st);
  RETURN_IF_ERROR(st);
  if (present) return Status::Ok();
  return ExecSql(db, "ALTER TABLE execs ADD COLUMN duration_ms INTEGER");
}

struct Migration {
  int version;  // user_version once applied
  Status (*apply)(sqlite3*);
};
// Append only: a step, once released, is never changed (a store may have run it). One a line.
// clang-format off
constexpr Migration kMigrations[] = {
    {1, SchemaV1},
    {2, SchemaV2},
    {3, SchemaV3},
    {4, SchemaV4},
    {5, SchemaV5},
    {6, SchemaV6},
};
// clang-format on

std::string WhatToDo(const std::string& path) {
  return ". tryboxd does not start on it, so that no history is silently lost or written "
         "over: move it aside (mv " +
         path + " " + path + ".bad, with any " + path +
         "-wal and -shm beside it) to start a new, empty record, or restore it from a backup";
}

Status Refuse(const std::string& path, const std::string& problem) {
  return FailedPrecondition("store " + path + " " + problem + WhatToDo(path));
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// A new store under a temporary name, renamed into place once it holds the whole schema.
Status CreateNew(const std::string& path) {
  const std::string tmp = path + ".new";
  for (const char* suffix : {"", "-journal", "-wal", "-shm"})
    (void)::unlink((tmp + suffix).c_str());
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(tmp.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  Status st = rc == SQLITE_OK ? Migrate(db, 0)
                              : Internal("create store " + tmp + ": " + sqlite3_errstr(rc));
  sqlite3_close_v2(db);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = ErrnoError("rename " + tmp + " to " + path);
  }
  if (!st.ok()) (void)::unlink(tmp.c_str());
  return st;
}

// What `PRAGMA quick_check(5)` reports beyond "ok", joined by "; " (or why it could not run);
// empty when the store is whole.
std::string QuickCheckProblems(sqlite3* db) {
  Stmt check(db, "PRAGMA quick_check(5)");
  Status prep = check.prepared();
  std::string problems;
  for (;;) {
    if (!prep.ok()) break;
    auto row = check.Step();
    if (!row.ok()) {
      prep = row.status();
      break;
    }
    if (!*row) break;
    std::string line = check.Text(0);
    if (line != "ok") problems += (problems.empty() ? "" : "; ") + line;
  }
  if (!prep.ok()) problems = prep.message();
  return problems;
}

}  // namespace

int LatestSchemaVersion() { return kMigrations[std::size(kMigrations) - 1].version; }

Result<int64_t> PragmaInt(sqlite3* db, const char* pragma) {
  Stmt s(db, (std::string("PRAGMA ") + pragma).c_str());
  RETURN_IF_ERROR(s.prepared());
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return Internal(std::string("PRAGMA ") + pragma + " gave no row");
  return s.Int(0);
}

Status Migrate(sqlite3* db, int from) {
  for (const auto& m : kMigrations) {
    if (m.version <= from) continue;
    RETURN_IF_ERROR(ExecSql(db, "BEGIN IMMEDIATE"));
    Status st = m.apply(db);
    // Both pragmas write the database header inside the transaction.
    if (st.ok()) {
      st = ExecSql(db, "PRAGMA application_id = " + std::to_string(kApplicationId) +
                           "; PRAGMA user_version = " + std::to_string(m.version));
    }
    if (st.ok()) st = ExecSql(db, "COMMIT");
    if (!st.ok()) {
      (void)ExecSql(db, "ROLLBACK");
      return st.Annotate("store migration to schema version " + std::to_string(m.version));
    }
  }
  return Status::Ok();
}

Result<OpenedDb> OpenChecked(const std::string& path) {
  OpenedDb out;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoError("stat store " + path);
    // A log without its database would be replayed into the new one.
    for (const char* suffix : {"-wal", "-journal"}) {
      if (Exists(path + suffix)) {
        return Refuse(path, std::string("is missing but its log ") + path + suffix +
                                " is there (the record was partly deleted)");
      }
    }
    RETURN_IF_ERROR(CreateNew(path));
    out.created = true;
  } else if (!S_ISREG(st.st_mode)) {
    return Refuse(path, "is not a regular file");
  } else if (st.st_size == 0) {
    return Refuse(path,
                  "is empty (0 bytes): it holds no record (a full disk or a crash may have "
                  "truncated it)");
  }
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);
    return Internal("open store " + path + ": " + msg);
  }
  // close_v2: a statement still alive in the caller's scope (a refusal returned from inside
  // a Stmt's block) is finalized after this; sqlite3_close would refuse (SQLITE_BUSY) and
  // leak the connection.
  auto fail = [&](Status s) -> Result<OpenedDb> {
    sqlite3_close_v2(db);
    return s;
  };
  sqlite3_busy_timeout(db, 5000);
  auto app_id = PragmaInt(db, "application_id");
  if (!app_id.ok()) {
    int code = sqlite3_errcode(db);
    if (code == SQLITE_NOTADB) return fail(Refuse(path, "is not a SQLite database"));
    if (code == SQLITE_CORRUPT)
      return fail(Refuse(path, "is damaged (" + app_id.status().message() + ")"));
    return fail(app_id.status().Annotate("read store " + path));
  }
  if (std::string problems = QuickCheckProblems(db); !problems.empty()) {
    return fail(Refuse(path, "is damaged: PRAGMA quick_check found: " + problems));
  }
  ASSIGN_OR_RETURN(int64_t version, PragmaInt(db, "user_version"));
  if (*app_id != kApplicationId) {
    Stmt s(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'vms'");
    bool trybox_tables = s.prepared().ok() && s.Step().value_or(false);
    if (*app_id != 0 || version != 0 || !trybox_tables) {
      return fail(Refuse(path,
                         "is not a trybox store (another program's SQLite database: "
                         "application_id " +
                             std::to_string(*app_id) + ", no trybox tables)"));
    }
    // A store from before versions: its tables are trybox's, it is migrated from 0.
  }
  if (version > LatestSchemaVersion()) {
    return fail(FailedPrecondition(
        "store " + path + " has schema version " + std::to_string(version) +
        ", written by a newer trybox (this one knows up to " +
        std::to_string(LatestSchemaVersion()) + "): run that version, or restore a backup"));
  }
  out.found_version = static_cast<int>(version);
  if (Status m = Migrate(db, out.found_version); !m.ok()) return fail(m);
  out.migrated_to = LatestSchemaVersion();
  out.db = db;
  return out;
}

Status QuickCheck(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);
    return FailedPrecondition("the store " + path + " cannot be opened: " + msg);
  }
  (void)sqlite3_busy_timeout(db, 5000);
  const std::string problems = QuickCheckProblems(db);
  sqlite3_close_v2(db);
  if (problems.empty()) return Status::Ok();
  return FailedPrecondition("the store " + path +
                            " is damaged: PRAGMA quick_check found: " + problems);
}

}  // namespace trybox::store
