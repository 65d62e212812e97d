// The store's file: how an existing trybox.db is checked before it is used, how a new one is
// made, and the numbered schema migrations (docs/store.md, "The file and its guard").
//
// A store is recognised by its SQLite application_id (kApplicationId) and versioned by its
// user_version. A store made before either existed (application_id 0, user_version 0, with
// trybox's `vms` table) is recognised too and migrated. Anything else that exists at the
// path is refused with an error naming the file and what to do: an empty (0-byte) file, a
// file that is not SQLite, a database that fails `PRAGMA quick_check`, another program's
// database, or a store written by a newer trybox. Only a missing file makes a new store,
// built under a temporary name and renamed into place, so a crash never leaves an empty
// trybox.db behind. Plain functions; the caller serialises use of the connection.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "util/status.h"

namespace trybox::store {

// "TBX1": PRAGMA application_id of every store this code writes.
inline constexpr int32_t kApplicationId = 0x54425831;

// The newest schema version (the number of the last migration).
int LatestSchemaVersion();

struct OpenedDb {
  sqlite3* db = nullptr;  // the caller closes it
  bool created = false;   // the file did not exist: a new, empty store
  int found_version = 0;  // the schema version found (0: a store from before versions)
  int migrated_to = 0;    // the version after migrations (LatestSchemaVersion())
};

// Checks the file at `path` (or creates it when missing), then applies the migrations it
// lacks, each in one transaction. kFailedPrecondition for a file refused, naming it.
Result<OpenedDb> OpenChecked(const std::string& path);

// Runs `PRAGMA quick_check` on the store at `path` through a connection of its own
// (read-only, so nothing the caller's connection caches can hide a damaged page). OK, or
// kFailedPrecondition naming what the check found (or that the file could not be read at all).
Status QuickCheck(const std::string& path);

// Applies the migrations after `from` (one transaction each, bumping user_version and
// setting application_id). Applying from the latest version does nothing.
Status Migrate(sqlite3* db, int from);

// PRAGMA user_version and application_id as read from an open database.
Result<int64_t> PragmaInt(sqlite3* db, const char* pragma);

}  // namespace trybox::store
