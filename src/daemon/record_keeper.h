// RecordKeeper: the upkeep of the daemon's record (docs/store.md, "Retention"). It prunes,
// by age and by count, what would otherwise only grow: the records of VMs that ended (their
// execs, workspaces, collects, file changes) with their kept output (exec logs), finished
// vm_agent runs with their repositories under the state directory, the egress audit, and
// collect leftovers; then it checkpoints the WAL. It never touches anything of a VM in the
// registry (running or dead but not destroyed) nor of a run the AgentRunner holds. It also
// reports the store's health for `doctor`.
//
// Runs from the daemon's housekeeping and from the `prune` verb; one prune at a time (its
// own lock). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "daemon/egress_gateway.h"
#include "daemon/vm_registry.h"
#include "daemon/vm_service.h"
#include "store/store.h"
#include "util/mutex.h"

namespace trybox::daemon {

// The retention policy (tryboxd flags; defaults in docs/store.md). 0 disables a limit.
struct RetentionPolicy {
  // Records of VMs that ended, with their exec logs, and finished agent runs, with their
  // repositories: kept this long after they ended (a run: after its last update).
  std::chrono::seconds max_age{14 * 24 * 3600};
  int64_t max_vms = 1000;  // records of ended VMs kept at most (the newest)
  int64_t max_runs = 200;  // finished agent runs kept at most (the newest)
  // How often the daemon prunes by itself (at start, then from its housekeeping); 0: only
  // by hand (`trybox prune`).
  std::chrono::seconds interval{600};
};

// What a prune freed (or, with dry_run, would free).
struct PruneReport {
  bool dry_run = false;
  // Rows.
  int64_t vms = 0;
  int64_t execs = 0;
  int64_t workspaces = 0;
  int64_t collects = 0;
  int64_t file_changes = 0;
  int64_t agent_runs = 0;
  int64_t egress = 0;
  // Directories under the state directory, and the bytes their files held.
  int64_t exec_logs = 0;  // execs/<vm>/ of pruned VMs
  // execs/<vm>/ of VMs with no record (a lost WAL): moved to execs-unrecorded/, not deleted.
  int64_t logs_moved_aside = 0;
  int64_t run_dirs = 0;           // runs/<run>/ of pruned (or unrecorded, a day old) runs
  int64_t collect_leftovers = 0;  // collect/<vm>-*/ of VMs gone, runs/<run>/collected/
  int64_t bytes = 0;
  // The store's files (database and WAL) before and after (the checkpoint).
  int64_t store_bytes_before = 0;
  int64_t store_bytes_after = 0;
  std::vector<std::string> errors;  // what could not be removed; the rest went on
};

// The store as `doctor` shows it.
struct StoreHealth {
  store::StoreInfo info;
  store::StoreSize size;
  int64_t floor_bytes = store::kStoreFloorBytes;  // below it nothing new is recorded
  int64_t reserve_bytes = 0;  // below it creates are refused (tryboxd --disk-reserve)
};

class RecordKeeper {
 public:
  // `live_runs` lists the vm_agent runs in flight or waiting (never pruned).
  RecordKeeper(store::Store& store, VmService& vms, VmRegistry& registry, EgressGateway& egress,
               std::string state_dir, RetentionPolicy policy, int64_t reserve_bytes,
               std::function<std::set<std::string>()> live_runs)
      : store_(store),
        vms_(vms),
        registry_(registry),
        egress_(egress),
        state_dir_(std::move(state_dir)),
        policy_(policy),
        reserve_bytes_(reserve_bytes),
        live_runs_(std::move(live_runs)) {}

  Result<PruneReport> Prune(bool dry_run) EXCLUDES(mu_);
  const RetentionPolicy& policy() const { return policy_; }
  StoreHealth Health() const;

 private:
  // Removes (or with dry_run, measures) `path`; counts its bytes.
  void RemoveDir(const std::string& path, bool dry_run, int64_t& count, PruneReport& r);

  store::Store& store_;
  VmService& vms_;
  VmRegistry& registry_;
  EgressGateway& egress_;
  const std::string state_dir_;
  const RetentionPolicy policy_;
  const int64_t reserve_bytes_;
  const std::function<std::set<std::string>()> live_runs_;
  Mutex mu_;  // one prune at a time
};

}  // namespace trybox::daemon
