// The record's verbs (docs/protocol/daemon.md): prune, and the `store` object of doctor.
#include "daemon/verbs.h"

namespace trybox::daemon {

Json StoreHealthJson(const StoreHealth& h) {
  const int64_t free = h.size.free_bytes;
  return {{"path", h.info.path},
          {"schema_version", h.info.schema_version},
          {"db_bytes", h.size.db_bytes},
          {"wal_bytes", h.size.wal_bytes},
          {"free_bytes", free},
          {"floor_bytes", h.floor_bytes},
          {"reserve_bytes", h.reserve_bytes},
          {"below_floor", free >= 0 && free < h.floor_bytes},
          {"below_reserve", free >= 0 && free < h.reserve_bytes},
          {"warning", h.info.warning}};
}

Json PruneReportJson(const PruneReport& r, const RetentionPolicy& p, const egress::Config& egress) {
  return {{"dry_run", r.dry_run},
          {"rows",
           {{"vms", r.vms},
            {"execs", r.execs},
            {"workspaces", r.workspaces},
            {"collects", r.collects},
            {"file_changes", r.file_changes},
            {"agent_runs", r.agent_runs},
            {"egress", r.egress}}},
          {"dirs",
           {{"exec_logs", r.exec_logs},
            {"run_dirs", r.run_dirs},
            {"collect_leftovers", r.collect_leftovers},
            {"exec_logs_moved_aside", r.logs_moved_aside}}},
          {"bytes", r.bytes},
          {"store_bytes_before", r.store_bytes_before},
          {"store_bytes_after", r.store_bytes_after},
          {"errors", r.errors},
          {"policy",
           {{"max_age_s", static_cast<int64_t>(p.max_age.count())},
            {"max_vms", p.max_vms},
            {"max_runs", p.max_runs},
            {"egress_max_age_s", static_cast<int64_t>(egress.audit_max_age.count())},
            {"egress_max_rows", egress.audit_max_rows},
            {"interval_s", static_cast<int64_t>(p.interval.count())}}}};
}

void AddStoreVerbs(VerbTable& t, Services& s) {
  t.AddUnary("prune", [&s](const Json& j, Connection&) -> Json {
    auto req = ParsePrune(j);
    if (!req.ok()) return ErrorReply(req.status());
    auto report = s.records.Prune(req->dry_run);
    if (!report.ok()) return ErrorReply(report.status());
    return {{"ok", true},
            {"pruned", PruneReportJson(*report, s.records.policy(), s.egress.settings()->config)}};
  });
}

}  // namespace trybox::daemon
