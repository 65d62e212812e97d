// Stmt: RAII for one prepared SQLite statement, with typed binders and readers. Private to
// src/store/ (the store's files share it); not thread-safe: used under the store's lock.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "util/status.h"

namespace trybox::store {

using Json = nlohmann::json;

// Why a write failed, named: SQLITE_FULL (the disk) is kResourceExhausted.
inline Status SqliteError(sqlite3* db, int rc) {
  return Status(rc == SQLITE_FULL ? Code::kResourceExhausted : Code::kInternal,
                std::string("sqlite: ") + sqlite3_errmsg(db));
}

// RAII for a prepared statement, with typed binders.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &st_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(st_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Status prepared() const {
    if (rc_ == SQLITE_OK) return Status::Ok();
    return Internal(std::string("sqlite prepare: ") + sqlite3_errmsg(db_));
  }
  Stmt& Bind(int i, const std::string& s) {
    sqlite3_bind_text(st_, i, s.c_str(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(st_, i, v);
    return *this;
  }
  Stmt& Bind(int i, double v) {
    sqlite3_bind_double(st_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const Json& j, const char* field) {
    if (j.contains(field)) {
      sqlite3_bind_int64(st_, i, j[field].get<int64_t>());
    } else {
      sqlite3_bind_null(st_, i);
    }
    return *this;
  }
  Stmt& Bind(int i, std::optional<int64_t> v) {
    if (v) {
      sqlite3_bind_int64(st_, i, *v);
    } else {
      sqlite3_bind_null(st_, i);
    }
    return *this;
  }
  Stmt& Bind(int i, std::optional<int> v) {
    if (v) {
      sqlite3_bind_int64(st_, i, *v);
    } else {
      sqlite3_bind_null(st_, i);
    }
    return *this;
  }
  // SQLITE_ROW -> true, SQLITE_DONE -> false.
  Result<bool> Step() {
    int rc = sqlite3_step(st_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc);
  }
  std::string Text(int col) {
    const unsigned char* t = sqlite3_column_text(st_, col);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  int64_t Int(int col) { return sqlite3_column_int64(st_, col); }
  double Double(int col) { return sqlite3_column_double(st_, col); }
  Json JsonCol(int col) { return Json::parse(Text(col), nullptr, false); }
  // Steps a DELETE or UPDATE to its end; the rows it changed.
  Result<int64_t> Run() {
    ASSIGN_OR_RETURN(bool row, Step());
    (void)row;
    return static_cast<int64_t>(sqlite3_changes(db_));
  }
  void OptIntInto(int col, Json& j, const char* field) {
    if (sqlite3_column_type(st_, col) != SQLITE_NULL) j[field] = sqlite3_column_int64(st_, col);
  }
  std::optional<int64_t> OptInt64(int col) {
    if (sqlite3_column_type(st_, col) == SQLITE_NULL) return std::nullopt;
    return sqlite3_column_int64(st_, col);
  }
  std::optional<int> OptInt(int col) {
    if (sqlite3_column_type(st_, col) == SQLITE_NULL) return std::nullopt;
    return static_cast<int>(sqlite3_column_int64(st_, col));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* st_ = nullptr;
  int rc_;
};

// Runs `sql` (one or more statements, no results).
inline Status ExecSql(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return Status::Ok();
  std::string msg = err ? err : sqlite3_errstr(rc);
  sqlite3_free(err);
  return Status(rc == SQLITE_FULL ? Code::kResourceExhausted : Code::kInternal, "sqlite: " + msg);
}

}  // namespace trybox::store
