// Store: the daemon's SQLite record of VMs and execs. Schema: docs/store.md.
//
// One connection, serialised by a mutex: the daemon's write rate is a handful of rows per
// exec, far below what needs a pool. WAL mode and a busy timeout let `sqlite3` readers and
// a second daemon's start-up reaper coexist with it. Thread-safe.
#pragma once

#include <sqlite3.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "util/mutex.h"
#include "util/status.h"
#include "util/thread_annotations.h"

namespace trybox::store {

using Json = nlohmann::json;

struct VmRecord {
  std::string id;
  std::string image;
  std::string image_sha256;  // of the manifest, names the exact frozen image
  std::string state;         // "running", "dead", "destroyed", "reaped"
  int64_t pid = 0;
  std::string accel;
  int memory_mib = 0;
  int cpus = 0;
  std::string dir;
  double created_at = 0;
  double ended_at = 0;
  std::string note;  // why it died, or the destroy report (JSON)
  // Created --privileged: its commands kept every capability, including those that reach
  // the guest's control channel, so everything it reported is the guest's word. nullopt for
  // a VM recorded before the store kept it (schema version 5): unknown, never "no".
  std::optional<bool> privileged = false;
};

struct ExecRecord {
  int64_t id = 0;
  std::string vm_id;
  Json argv = Json::array();
  std::string cwd;
  double started_at = 0;
  double ended_at = 0;
  std::string outcome;  // exited, signaled, timed_out, error, channel_lost, running
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::string error;
  int64_t stdout_bytes = 0;
  int64_t stderr_bytes = 0;
  // From start to end on the daemon's monotonic clock, set when it ends. nullopt while it
  // runs, and for an exec recorded before the store kept it (schema version 6).
  std::optional<int64_t> duration_ms;
  // The duration to show: duration_ms when kept, else the wall times' difference (never
  // below 0); nullopt while it runs.
  std::optional<int64_t> Duration() const;
};

// How many execs a running VM has had, and how many run now.
struct ExecCount {
  int64_t total = 0;
  int64_t running = 0;
};

// One egress connection from a guest: the proxy's decision and, once closed, its traffic.
struct EgressRecord {
  int64_t id = 0;
  std::string vm_id;
  double started_at = 0;
  double ended_at = 0;  // 0 while the connection is open
  std::string method;   // CONNECT, or the plain-HTTP method; "" if no request head arrived
  std::string host;     // canonical hostname, or the refused name as sent (capped)
  int port = 0;
  std::string address;  // the address dialled ("" if none)
  std::string verdict;  // allowed | refused | failed
  std::string reason;
  bool override_used = false;  // an internal address reached through the operator override
  int status = 0;              // HTTP status the guest got (200 = tunnel opened; 0 = none)
  int64_t bytes_up = 0;        // guest -> upstream
  int64_t bytes_down = 0;      // upstream -> guest
  double duration_ms = 0;
};

// A project workspace copied into a VM (docs/workspace.md). JSON columns stay JSON here.
struct WorkspaceRecord {
  std::string vm_id;
  std::string dir;
  std::string base;               // HEAD at inject time; "" on an unborn branch
  Json excludes = Json::array();  // the project's .trybox/exclude lines
  Json manifest = Json::array();  // what went in, with git blob ids
  int64_t quota_bytes = 0;
  int64_t quota_entries = 100000;  // files, directories and symlinks (workspace::Quota)
  int64_t files = 0;
  int64_t bytes = 0;
  Json skipped = Json::array();  // [{path, reason}] not sent
  double injected_at = 0;
  std::optional<int> setup_exec_id;  // NULL when the project has no setup script
  std::string setup_output;          // its output (tail), kept
};

// One collect of a workspace and the files it found changed.
struct CollectRecord {
  int64_t id = 0;
  std::string vm_id;
  std::optional<int> exec_id;  // the VM's last exec before the collect
  double collected_at = 0;
  std::string outcome;  // "ok" or "error"
  std::string error;
  int64_t files = 0;
  int64_t bytes = 0;
  Json skipped = Json::array();  // [{path, path_b64?, reason}]
  int64_t skipped_unlisted = 0;  // skipped entries beyond those listed
  std::string commit;
  std::string branch;
  std::string note;
  // [{change, path, path_b64?, from?, from_b64?, old_size?, new_size?, old_mode?, new_mode?}]
  // (names as workspace::ChangesToJson writes them; docs/workspace.md "Names in JSON")
  Json changes = Json::array();
};

// One vm_agent run (docs/agent.md). `state` holds what the daemon knows of the run as JSON
// (task, image, VM ids, the outcome, the verification, the agent's words), `transcript` the
// provider-neutral conversation. Neither ever holds the model's API key.
struct AgentRunRecord {
  std::string id;
  double created_at = 0;
  double updated_at = 0;
  std::string outcome;  // RUNNING, DONE, NEEDS_INPUT, IN_PROGRESS, ERROR
  std::string vm_id;    // the VM the agent works in
  Json state = Json::object();
  Json transcript = Json::array();
};

// A key of the HTTP API. The key itself is never stored: only its SHA-256, as hex.
struct ApiKeyRecord {
  std::string id;  // short, public: names the key in logs and listings
  std::string name;
  std::string hash;
  double created_at = 0;
  // "sandboxes": E2B's API for the key's own sandboxes; "operator": that and trybox's own
  // REST routes over every VM and run, as the socket's caller may.
  std::string scope = "sandboxes";
};

double NowSeconds();

// What PruneVms removed (or would remove).
struct PrunedVms {
  std::vector<std::string> ids;
  int64_t execs = 0;
  int64_t workspaces = 0;
  int64_t collects = 0;
  int64_t file_changes = 0;
};

// What Store::Open found and did (docs/store.md, "The file and its guard").
struct StoreInfo {
  std::string path;
  bool created = false;    // there was no file: a new, empty store was made
  int found_version = 0;   // schema version found (0: a store from before versions)
  int schema_version = 0;  // after migrations
  // Not empty when the store holds fewer rows than its mark says the last daemon committed
  // (its write-ahead log was lost, or an older copy was put back): what may be missing.
  std::string warning;
};

// Free space the store needs on its filesystem to take new work: an exec's start and end,
// a VM's record. Below it, CheckWritable refuses (store_unavailable).
inline constexpr int64_t kStoreFloorBytes = int64_t{8} << 20;

// The record's size on disk.
struct StoreSize {
  int64_t db_bytes = 0;
  int64_t wal_bytes = 0;
  int64_t free_bytes = -1;  // on the store's filesystem (-1: unknown)
};

class Store {
 public:
  // Opens the store at `path` after checking it (schema.h): kFailedPrecondition, naming the
  // file and what to do, for a file that is empty, damaged, foreign or too new. A missing
  // file makes a new store.
  static Result<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();

  StoreInfo info() const EXCLUDES(mu_);
  StoreSize Size() const;
  // Whether new work can be recorded now: the filesystem has kStoreFloorBytes free and a
  // write commits. Otherwise an error whose message starts "store_unavailable: "
  // (kResourceExhausted when space is the cause). Nothing is cached: once space returns,
  // the next call succeeds.
  Status CheckWritable() EXCLUDES(mu_);
  // Only the free-space half of CheckWritable (one statvfs): for each exec, whose own insert
  // is the write.
  Status CheckRoom() const;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  Status InsertVm(const VmRecord& vm);
  Status UpdateVmState(const std::string& id, const std::string& state, const std::string& note);
  Result<std::optional<VmRecord>> GetVm(const std::string& id);
  // VMs in one of `states` (all if empty), newest first.
  Result<std::vector<VmRecord>> ListVms(const std::vector<std::string>& states = {});

  Result<int64_t> InsertExec(const ExecRecord& e);
  Status FinishExec(const ExecRecord& e);
  // At start, before anything runs: execs still `running` belong to a daemon that ended
  // before they did. They become `interrupted` (ended_at `now`, error `why`). Returns how many.
  Result<int64_t> MarkInterruptedExecs(double now, const std::string& why);
  Result<std::vector<ExecRecord>> ListExecs(const std::string& vm_id);
  Result<std::optional<ExecRecord>> GetExec(int64_t id);
  // Per running VM.
  Result<std::map<std::string, ExecCount>> CountExecs();
  // Retention (store_prune.cc). Deletes the records of VMs that ended (destroyed or
  // reaped) before `ended_before` (0: no age limit) or beyond the newest `keep_ended` of
  // them (0: no count limit), with their execs, workspaces, collects and file changes, in
  // one transaction. A VM running or dead (not yet destroyed) is never pruned. `dry_run`:
  // the same deletes, rolled back, so the counts are exact.
  Result<PrunedVms> PruneVms(double ended_before, int64_t keep_ended = 0, bool dry_run = false);
  // Deletes agent_runs rows updated before `updated_before` (0: no age limit) or beyond the
  // newest `keep` (0: no count limit), never a run in `live` nor one whose VM is running or
  // dead; returns their ids.
  Result<std::vector<std::string>> PruneAgentRuns(double updated_before, int64_t keep,
                                                  const std::set<std::string>& live,
                                                  bool dry_run = false);

  Result<int64_t> InsertEgress(const EgressRecord& e);
  // Records the end of a connection: byte counts, duration, and the final verdict/reason.
  Status FinishEgress(const EgressRecord& e);
  // Oldest first; all VMs if `vm_id` is empty; at most `limit` rows (the newest ones), of
  // those with an id below `before_id` when it is positive (paging backwards).
  Result<std::vector<EgressRecord>> ListEgress(const std::string& vm_id, int64_t limit = 1000,
                                               int64_t before_id = 0);
  // Retention of the egress audit. Removes the rows of connections that ended more than
  // `max_age_seconds` before `now` (a row never closed counts from its start, unless its VM
  // is still running: that tunnel may be open), then the oldest rows beyond the newest
  // `max_rows` (again never an open row of a running VM). 0 disables either limit. Returns
  // how many rows were removed; when any were, the WAL is checkpointed (Checkpoint).
  // `dry_run`: counted, not removed.
  Result<int64_t> PruneEgress(double max_age_seconds, int64_t max_rows, double now = NowSeconds(),
                              bool dry_run = false);
  // Copies the WAL into the database and truncates it to zero bytes, so that what was
  // deleted also leaves the disk. kUnavailable while a reader holds an old snapshot (the WAL
  // is then checkpointed later, as usual).
  Status Checkpoint();
  Status InsertWorkspace(const WorkspaceRecord& w);
  Status SetWorkspaceSetup(const std::string& vm_id, std::optional<int> exec_id,
                           const std::string& output);
  Result<std::optional<WorkspaceRecord>> GetWorkspace(const std::string& vm_id);
  // Inserts the collect and its changes in one transaction; returns the collect id.
  Result<int64_t> InsertCollect(const CollectRecord& c);
  // The newest collect of a VM, with its changes.
  Result<std::optional<CollectRecord>> LatestCollect(const std::string& vm_id);
  // Inserts or replaces the run.
  Status PutAgentRun(const AgentRunRecord& r);
  Result<std::optional<AgentRunRecord>> GetAgentRun(const std::string& id);
  // The newest runs first, without their transcripts.
  Result<std::vector<AgentRunRecord>> ListAgentRuns(int64_t limit);

  // The id of the VM's newest exec, if any.
  // ALREADY_EXISTS when the name (or, vanishingly, the hash) is taken.
  Status InsertApiKey(const ApiKeyRecord& k);
  Result<std::vector<ApiKeyRecord>> ListApiKeys();
  // Whether a key of that name was there to remove.
  Result<bool> DeleteApiKey(const std::string& name);

  Result<std::optional<int>> LastExecId(const std::string& vm_id);

 private:
  Store(sqlite3* db, std::string path) : path_(std::move(path)), db_(db) {}
  Status Exec(const std::string& sql);
  Status CheckpointLocked() REQUIRES(mu_);
  // The mark (`<path>.mark`): the highest ids committed to execs, egress and collects,
  // rewritten after each insert. Open compares it with the database (StoreInfo::warning).
  enum MarkKind { kMarkExecs, kMarkEgress, kMarkCollects, kMarkKinds };
  void OpenMarkLocked() REQUIRES(mu_);
  void NoteInsertLocked(MarkKind kind, int64_t id) REQUIRES(mu_);
  const std::string path_;
  mutable Mutex mu_;
  sqlite3* db_ GUARDED_BY(mu_);
  StoreInfo info_ GUARDED_BY(mu_);
  int mark_fd_ GUARDED_BY(mu_) = -1;
  int64_t mark_[kMarkKinds] GUARDED_BY(mu_) = {};
};

}  // namespace trybox::store
