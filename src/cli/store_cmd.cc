#include "cli/store_cmd.h"

#include <cstdio>
#include <ostream>

#include "util/utf8.h"

namespace trybox::cli {
namespace {

std::string Mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string Limit(int64_t n, const std::string& unit) {
  return n > 0 ? std::to_string(n) + " " + unit : "no limit";
}

}  // namespace

Result<std::string> RenderPrune(const ReplyView& p) {
  ASSIGN_OR_RETURN(bool dry_run, p.Bool("dry_run"));
  ASSIGN_OR_RETURN(ReplyView rows, p.Object("rows"));
  ASSIGN_OR_RETURN(ReplyView dirs, p.Object("dirs"));
  auto n = [](const ReplyView& v, const char* key) { return v.IntOr(key, 0, 0); };
  ASSIGN_OR_RETURN(int64_t vms, n(rows, "vms"));
  ASSIGN_OR_RETURN(int64_t execs, n(rows, "execs"));
  ASSIGN_OR_RETURN(int64_t workspaces, n(rows, "workspaces"));
  ASSIGN_OR_RETURN(int64_t collects, n(rows, "collects"));
  ASSIGN_OR_RETURN(int64_t changes, n(rows, "file_changes"));
  ASSIGN_OR_RETURN(int64_t runs, n(rows, "agent_runs"));
  ASSIGN_OR_RETURN(int64_t egress, n(rows, "egress"));
  ASSIGN_OR_RETURN(int64_t logs, n(dirs, "exec_logs"));
  ASSIGN_OR_RETURN(int64_t run_dirs, n(dirs, "run_dirs"));
  ASSIGN_OR_RETURN(int64_t leftovers, n(dirs, "collect_leftovers"));
  ASSIGN_OR_RETURN(int64_t bytes, p.IntOr("bytes", 0, 0));
  ASSIGN_OR_RETURN(int64_t before, p.IntOr("store_bytes_before", 0, 0));
  ASSIGN_OR_RETURN(int64_t after, p.IntOr("store_bytes_after", 0, 0));
  std::string out = dry_run ? "would prune (dry run, nothing removed):\n" : "pruned:\n";
  out += "  VM records:    " + std::to_string(vms) + " (" + std::to_string(execs) + " execs, " +
         std::to_string(workspaces) + " workspaces, " + std::to_string(collects) + " collects, " +
         std::to_string(changes) + " file changes)\n";
  out += "  agent runs:    " + std::to_string(runs) + "\n";
  out += "  egress rows:   " + std::to_string(egress) + "\n";
  out += "  exec logs:     " + std::to_string(logs) + " VM directories\n";
  out += "  run repos:     " + std::to_string(run_dirs) + " directories\n";
  out += "  collect leftovers: " + std::to_string(leftovers) + " directories\n";
  out += "  files:         " + Mib(bytes) + "\n";
  out += "  store:         " + Mib(before) + (dry_run ? "" : " -> " + Mib(after)) + "\n";
  ASSIGN_OR_RETURN(auto errors, p.Array("errors"));
  for (const auto& e : *errors) {
    if (e.is_string()) out += "  not removed: " + e.get<std::string>() + "\n";
  }
  ASSIGN_OR_RETURN(auto policy, p.OptionalObject("policy"));
  if (policy) {
    ASSIGN_OR_RETURN(int64_t age, policy->IntOr("max_age_s", 0, 0));
    ASSIGN_OR_RETURN(int64_t max_vms, policy->IntOr("max_vms", 0, 0));
    ASSIGN_OR_RETURN(int64_t max_runs, policy->IntOr("max_runs", 0, 0));
    ASSIGN_OR_RETURN(int64_t eg_age, policy->IntOr("egress_max_age_s", 0, 0));
    ASSIGN_OR_RETURN(int64_t eg_rows, policy->IntOr("egress_max_rows", 0, 0));
    out += "policy: ended VMs and finished agent runs kept " + Limit(age, "s") + ", at most " +
           Limit(max_vms, "VMs") + " and " + Limit(max_runs, "runs") + "; egress audit " +
           Limit(eg_age, "s") + ", at most " + Limit(eg_rows, "rows") + "\n";
  }
  return out;
}

Result<std::string> RenderStoreHealth(const ReplyView& s) {
  ASSIGN_OR_RETURN(std::string path, s.String("path"));
  ASSIGN_OR_RETURN(int64_t version, s.IntOr("schema_version", 0, 0));
  ASSIGN_OR_RETURN(int64_t db, s.IntOr("db_bytes", 0, 0));
  ASSIGN_OR_RETURN(int64_t wal, s.IntOr("wal_bytes", 0, 0));
  ASSIGN_OR_RETURN(int64_t free, s.IntOr("free_bytes", -1, -1));
  ASSIGN_OR_RETURN(int64_t floor, s.IntOr("floor_bytes", 0, 0));
  ASSIGN_OR_RETURN(int64_t reserve, s.IntOr("reserve_bytes", 0, 0));
  ASSIGN_OR_RETURN(bool below_floor, s.BoolOr("below_floor", false));
  ASSIGN_OR_RETURN(bool below_reserve, s.BoolOr("below_reserve", false));
  ASSIGN_OR_RETURN(std::string warning, s.StringOr("warning", ""));
  std::string out = "store: " + path + " (schema " + std::to_string(version) + ", " + Mib(db) +
                    " + WAL " + Mib(wal) + ")\n";
  out += "  free space: " + (free < 0 ? std::string("unknown") : Mib(free)) + "; creates need " +
         Mib(reserve) + " (tryboxd --disk-reserve), the record " + Mib(floor) + "\n";
  if (below_floor) {
    out +=
        "  NO SPACE: below the record's floor: execs and creates are refused "
        "(store_unavailable) until space is freed\n";
  } else if (below_reserve) {
    out += "  LOW SPACE: below the reserve: creates are refused until space is freed\n";
  }
  if (!warning.empty()) out += "  WARNING: " + warning + "\n";
  return out;
}

int CmdPrune(Client& client, bool dry_run, bool json, std::ostream& out, std::ostream& err) {
  auto r = client.Call({{"verb", "prune"}, {"dry_run", dry_run}});
  if (!r.ok()) {
    err << "trybox: " << OneLine(r.status().message()) << "\n";
    return 125;
  }
  ReplyView reply(*r);
  auto pruned = reply.Object("pruned");
  if (!pruned.ok()) {
    err << "trybox: " << OneLine(pruned.status().message()) << "\n";
    return 125;
  }
  if (json) {
    out << pruned->json().dump(2) << "\n";
    return 0;
  }
  auto text = RenderPrune(*pruned);
  if (!text.ok()) {
    err << "trybox: " << OneLine(text.status().message()) << "\n";
    return 125;
  }
  out << *text;
  return 0;
}

}  // namespace trybox::cli
