#include "daemon/report_builder.h"

#include <map>
#include <tuple>

#include "agent/report.h"
#include "agent/text.h"
#include "daemon/wire.h"
#include "daemon/workspace_service.h"

namespace trybox::daemon {
namespace {

constexpr size_t kMaxReportChanges = 1000;

Json CommandJson(const store::ExecRecord& e, const std::string& tool) {
  Json c = {{"exec_id", e.id},
            {"tool", tool},
            {"argv", e.argv},
            {"cwd", e.cwd},
            {"outcome", e.outcome},
            {"duration_ms", e.Duration() ? Json(*e.Duration()) : Json(nullptr)},
            {"stdout_bytes", e.stdout_bytes},
            {"stderr_bytes", e.stderr_bytes}};
  if (e.exit_code) c["exit_code"] = *e.exit_code;
  if (e.signal) c["signal"] = *e.signal;
  if (!e.error.empty()) c["error"] = agent::SanitizeUtf8(e.error);
  if (e.outcome == "running") c["duration_ms"] = nullptr;
  return c;
}

// The newest audit rows of a VM a report reads; older ones are counted as cut.
constexpr int64_t kMaxReportEgressRows = 10000;
// At most this many entries in each of the network section's lists.
constexpr size_t kMaxNetworkEntries = 200;

// Where the run's VM went and what was refused, from the daemon's audit rows
// (docs/agent.md, "network"): the hosts reached with bytes each way, the refusals and
// failures grouped by host, port and reason, and every change made to the running VM's list.
Json NetworkJson(store::Store& store, const std::string& vm_id, const RunState& s) {
  Json net = {{"policy",
               {{"mode", s.internet ? "internet" : "allowlist"},
                {"allow", s.allow},
                {"profiles", s.profiles},
                {"deny", s.deny}}}};
  auto rows = store.ListEgress(vm_id, kMaxReportEgressRows + 1);
  if (!rows.ok()) {
    net["error"] = "the audit could not be read: " + rows.status().message();
    return net;
  }
  const bool cut = static_cast<int64_t>(rows->size()) > kMaxReportEgressRows;
  if (cut) rows->erase(rows->begin());  // oldest first: the oldest one goes
  struct Reached {
    int64_t connections = 0, bytes_up = 0, bytes_down = 0;
  };
  struct Refused {
    int64_t count = 0;
    int status = 0;
  };
  std::map<std::pair<std::string, int>, Reached> reached;
  std::map<std::tuple<std::string, std::string, int, std::string>, Refused> refused;
  Json changes = Json::array();
  for (const auto& e : *rows) {
    const std::string host = agent::SanitizeUtf8(e.host);
    if (e.verdict == "allowed") {
      Reached& r = reached[{host, e.port}];
      ++r.connections;
      r.bytes_up += e.bytes_up;
      r.bytes_down += e.bytes_down;
    } else if (e.verdict == "policy") {
      if (changes.size() < kMaxNetworkEntries) {
        changes.push_back({{"at", e.started_at},
                           {"change", agent::SanitizeUtf8(e.method)},
                           {"entry", host + (e.port ? ":" + std::to_string(e.port) : "")},
                           {"reason", agent::SanitizeUtf8(e.reason)}});
      }
    } else {
      Refused& r = refused[{e.verdict, host, e.port, agent::SanitizeUtf8(e.reason)}];
      ++r.count;
      r.status = e.status;
    }
  }
  Json hosts = Json::array();
  for (const auto& [key, r] : reached) {
    if (hosts.size() >= kMaxNetworkEntries) break;
    hosts.push_back({{"host", key.first},
                     {"port", key.second},
                     {"connections", r.connections},
                     {"bytes_up", r.bytes_up},
                     {"bytes_down", r.bytes_down}});
  }
  Json refusals = Json::array();
  for (const auto& [key, r] : refused) {
    if (refusals.size() >= kMaxNetworkEntries) break;
    const auto& [verdict, host, port, reason] = key;
    refusals.push_back({{"verdict", verdict},
                        {"host", host},
                        {"port", port},
                        {"status", r.status},
                        {"reason", reason},
                        {"count", r.count}});
  }
  net["reached"] = hosts;
  net["refused"] = refusals;
  net["changes"] = changes;
  net["connections"] = static_cast<int64_t>(rows->size());
  net["truncated"] =
      cut || reached.size() > kMaxNetworkEntries || refused.size() > kMaxNetworkEntries;
  return net;
}

}  // namespace

Json ReportBuilder::Build(const store::AgentRunRecord& rec, const RunState& s) const {
  const Json sj = s.ToJson();
  auto copy = [&](Json& r, const char* key) {
    if (sj.contains(key)) r[key] = sj[key];
  };
  Json r = {{"schema", agent::kReportSchema}, {"run", rec.id},
            {"outcome", rec.outcome},         {"task", s.task},
            {"image", sj["image"]},           {"model", s.model},
            {"usage", sj["usage"]},           {"limits", sj.value("limits", Json())},
            {"created_at", rec.created_at},   {"updated_at", rec.updated_at}};
  if (rec.outcome == "DONE") r["verdict"] = s.verdict.empty() ? "UNVERIFIED" : s.verdict;
  copy(r, "reason");
  copy(r, "error");
  // The VM's state as the daemon knows it now.
  std::string vm_state = "unknown";
  std::optional<bool> privileged;  // unknown unless recorded
  if (auto v = store_.GetVm(rec.vm_id); v.ok() && v->has_value()) {
    vm_state = (*v)->state;
    privileged = (*v)->privileged;
  }
  r["vm"] = {{"id", rec.vm_id}, {"state", vm_state}};
  // A run's VM is never privileged today; were it (or not known), its commands' results
  // are the guest's word, and the report says so.
  AddPrivilegeFields(r["vm"], privileged);

  // The run's own commands; anything else run in its VM (a person's `trybox exec` while
  // the run waited) is listed apart, as theirs.
  Json commands = Json::array(), others = Json::array();
  if (auto execs = store_.ListExecs(rec.vm_id); execs.ok()) {
    for (const auto& e : *execs) {
      auto tool = s.exec_tools.find(e.id);
      if (tool == s.exec_tools.end()) {
        others.push_back(CommandJson(e, "exec"));
      } else {
        commands.push_back(CommandJson(e, tool->second));
      }
    }
  }
  r["commands"] = commands;
  if (!others.empty()) r["other_commands"] = others;
  if (!rec.vm_id.empty()) r["network"] = NetworkJson(store_, rec.vm_id, s);

  r["files"] = nullptr;
  r["commit"] = nullptr;
  if (s.collect_id) {
    if (auto c = store_.LatestCollect(rec.vm_id); c.ok() && c->has_value()) {
      const store::CollectRecord& cr = **c;
      // The report stays far under the frame limit: the change list is cut, and says so.
      Json changes = cr.changes;
      const size_t total = changes.is_array() ? changes.size() : 0;
      if (total > kMaxReportChanges)
        changes.erase(changes.begin() + kMaxReportChanges, changes.end());
      r["files"] = {{"counts", CountChanges(cr.changes)},
                    {"changes", changes},
                    {"changes_total", total},
                    {"changes_truncated", total > kMaxReportChanges},
                    {"files", cr.files},
                    {"bytes", cr.bytes},
                    {"skipped", cr.skipped}};
      if (!cr.commit.empty()) {
        r["commit"] = {{"sha", cr.commit}, {"branch", cr.branch}, {"repo", s.repo}};
      } else {
        r["commit_note"] = cr.note;
      }
    }
  } else if (!s.files_note.empty()) {
    r["files_note"] = s.files_note;
  }
  for (const char* key :
       {"verification", "question", "approval", "claim", "answers", "turn_times", "expired"}) {
    copy(r, key);
  }
  return r;
}

}  // namespace trybox::daemon
