#include "daemon/record_keeper.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>

#include <cstdio>

#include "store/store.h"
#include "util/fd.h"
#include "util/log.h"
#include "workspace/git.h"

namespace trybox::daemon {
namespace {

// A run directory with no record may belong to a run being started (its repository is made
// before its row): only one this old is debris.
constexpr double kUnrecordedRunAgeS = 24 * 3600;

thread_local int64_t tree_bytes;

int64_t TreeBytes(const std::string& path) {
  tree_bytes = 0;
  (void)::nftw(
      path.c_str(),
      [](const char*, const struct stat* st, int type, struct FTW*) {
        if (type == FTW_F) tree_bytes += static_cast<int64_t>(st->st_blocks) * 512;
        return 0;
      },
      16, FTW_PHYS);
  return tree_bytes;
}

// A directory's names; none where it cannot be read (a prune takes what it can see).
std::vector<std::string> Entries(const std::string& dir) {
  auto names = ListDir(dir);
  return names.ok() ? std::move(*names) : std::vector<std::string>{};
}

double AgeSeconds(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return store::NowSeconds() - static_cast<double>(st.st_mtime);
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

void RecordKeeper::RemoveDir(const std::string& path, bool dry_run, int64_t& count,
                             PruneReport& r) {
  if (!IsDir(path)) return;
  int64_t bytes = TreeBytes(path);
  if (!dry_run) {
    Status st = RemoveTree(path);
    if (!st.ok()) {
      r.errors.push_back(st.message());
      return;
    }
  }
  ++count;
  r.bytes += bytes;
}

Result<PruneReport> RecordKeeper::Prune(bool dry_run) {
  MutexLock lock(mu_);
  PruneReport r;
  r.dry_run = dry_run;
  store::StoreSize before = store_.Size();
  r.store_bytes_before = before.db_bytes + before.wal_bytes;
  const double now = store::NowSeconds();
  const double cutoff =
      policy_.max_age.count() > 0 ? now - static_cast<double>(policy_.max_age.count()) : 0;

  // Ended VMs' records, then their exec logs (and logs whose VM has no record any more).
  ASSIGN_OR_RETURN(store::PrunedVms vms, vms_.PruneRecords(cutoff, policy_.max_vms, true));
  const std::set<std::string> pruned_vms(vms.ids.begin(), vms.ids.end());
  const std::string logs_dir = state_dir_ + "/execs";
  // Measured before the records (and with them the logs) go.
  for (const auto& id : vms.ids) {
    if (!IsDir(logs_dir + "/" + id)) continue;
    r.bytes += TreeBytes(logs_dir + "/" + id);
    ++r.exec_logs;
  }
  if (!dry_run) {
    ASSIGN_OR_RETURN(vms, vms_.PruneRecords(cutoff, policy_.max_vms, false));
  }
  r.vms = static_cast<int64_t>(vms.ids.size());
  r.execs = vms.execs;
  r.workspaces = vms.workspaces;
  r.collects = vms.collects;
  r.file_changes = vms.file_changes;
  // Logs whose VM has no record: after a lost write-ahead log they are the only trace of
  // what ran, so they are never deleted here but moved aside, to execs-unrecorded/ (only a
  // person removes them; docs/store.md, "Exec logs").
  const std::string aside_dir = state_dir_ + "/execs-unrecorded";
  for (const auto& name : Entries(logs_dir)) {
    if (pruned_vms.count(name) || registry_.Find(name)) continue;
    auto rec = store_.GetVm(name);
    if (!rec.ok() || rec->has_value()) continue;
    if (!IsDir(logs_dir + "/" + name)) continue;
    ++r.logs_moved_aside;
    if (dry_run) continue;
    Status st = MakeDirs(aside_dir, 0700);
    if (st.ok() &&
        ::rename((logs_dir + "/" + name).c_str(), (aside_dir + "/" + name).c_str()) != 0) {
      st = ErrnoError("move the exec logs of unrecorded VM " + name + " to " + aside_dir);
    }
    if (!st.ok()) {
      r.errors.push_back(st.message());
    } else {
      LogWarn("store", "the exec logs of VM " + name +
                           " have no record in the store (a lost "
                           "write-ahead log?): kept in " +
                           aside_dir + "/" + name);
    }
  }

  // Finished agent runs and their directories; collect leftovers of runs not in flight.
  const std::set<std::string> live = live_runs_ ? live_runs_() : std::set<std::string>{};
  ASSIGN_OR_RETURN(auto runs, store_.PruneAgentRuns(cutoff, policy_.max_runs, live, dry_run));
  r.agent_runs = static_cast<int64_t>(runs.size());
  const std::set<std::string> pruned_runs(runs.begin(), runs.end());
  const std::string runs_dir = state_dir_ + "/runs";
  for (const auto& name : Entries(runs_dir)) {
    if (live.count(name)) continue;
    const std::string dir = runs_dir + "/" + name;
    bool remove = pruned_runs.count(name) > 0;
    if (!remove && AgeSeconds(dir) > kUnrecordedRunAgeS) {
      auto rec = store_.GetAgentRun(name);
      remove = rec.ok() && !rec->has_value();
    }
    if (remove) {
      RemoveDir(dir, dry_run, r.run_dirs, r);
    } else {
      RemoveDir(dir + "/collected", dry_run, r.collect_leftovers, r);
    }
  }
  // A collect's staging directory (collect/<vm>-XXXXXX) outlives its collect only when a
  // daemon died during it; a collect needs its VM in the registry.
  const std::string collect_dir = state_dir_ + "/collect";
  // The same for a collect's object quarantine in the user's repository (its marker,
  // collect/<vm>-XXXXXX.quarantine, names it).
  for (const auto& name : Entries(collect_dir)) {
    std::string vm = name.substr(0, name.find('-'));
    if (registry_.Find(vm)) continue;
    const std::string path = collect_dir + "/" + name;
    if (workspace::IsQuarantineMarker(name)) {
      ++r.collect_leftovers;
      if (dry_run) continue;
      Status st = workspace::RemoveAbandonedQuarantine(path);
      if (!st.ok()) r.errors.push_back(st.message());
      continue;
    }
    RemoveDir(path, dry_run, r.collect_leftovers, r);
  }

  const auto settings = egress_.settings();  // the current egress.json (a reload may swap it)
  const egress::Config& eg = settings->config;
  ASSIGN_OR_RETURN(r.egress, store_.PruneEgress(static_cast<double>(eg.audit_max_age.count()),
                                                eg.audit_max_rows, now, dry_run));
  if (!dry_run && r.vms + r.agent_runs + r.egress > 0) {
    Status st = store_.Checkpoint();
    if (!st.ok() && st.code() != Code::kUnavailable) r.errors.push_back(st.message());
  }
  store::StoreSize after = store_.Size();
  r.store_bytes_after = after.db_bytes + after.wal_bytes;
  return r;
}

StoreHealth RecordKeeper::Health() const {
  StoreHealth h;
  h.info = store_.info();
  h.size = store_.Size();
  h.reserve_bytes = reserve_bytes_;
  return h;
}

}  // namespace trybox::daemon
