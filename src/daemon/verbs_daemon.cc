// The daemon_* verbs (docs/protocol/daemon.md, "Managing the daemon"): status, a clean
// stop, and a reload of egress.json that applies to new VMs only.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "daemon/verbs.h"
#include "util/log.h"
#include "util/version.h"

namespace trybox::daemon {
namespace {

int64_t FileBytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

Json StatusJson(Services& s, const DaemonControl& c) {
  auto up = std::chrono::steady_clock::now() - c.started;
  std::string db = s.paths.db();
  int64_t db_bytes = FileBytes(db);
  int64_t wal_bytes = FileBytes(db + "-wal");
  // systemd sets INVOCATION_ID for the processes of a unit it runs.
  const char* invocation = std::getenv("INVOCATION_ID");
  Json profiles = Json::array();
  for (const auto& [name, entries] : s.egress.settings()->config.profiles) profiles.push_back(name);
  Json store = {{"path", db}, {"bytes", db_bytes}, {"wal_bytes", wal_bytes}};
  if (c.store_check) store["check"] = c.store_check();
  return {{"ok", true},
          {"pid", ::getpid()},
          {"version", Version()},
          {"started_at", c.started_at},
          {"uptime_s", std::chrono::duration_cast<std::chrono::seconds>(up).count()},
          {"vms", s.vms.LiveVms()},
          {"spares", s.launcher.SpareCounts()},
          {"store", store},
          {"limits", c.limits},
          {"log_file", c.settings.value("log_file", std::string())},
          {"retention", c.settings.value("retention", Json::object())},
          {"egress_profiles", profiles},
          {"managed_by", invocation && *invocation ? "systemd" : "none"},
          {"socket", s.paths.socket()}};
}

}  // namespace

void AddDaemonVerbs(VerbTable& t, Services& s, const DaemonControl& control) {
  t.AddUnary("daemon_status", [&s, &control](const Json& j, Connection&) -> Json {
    auto req = ParseDaemonStatus(j);
    if (!req.ok()) return ErrorReply(req.status());
    return StatusJson(s, control);
  });
  t.AddStreaming("daemon_stop", [&s, &control](channel::Stream& client, const Json& j,
                                               Connection&) {
    auto req = ParseDaemonStop(j);
    if (!req.ok()) {
      (void)client.End(ErrorReply(req.status()));
      return;
    }
    size_t vms = s.vms.LiveVms();
    // A restart starts a daemon that reads egress.json again: one that would refuse it is
    // refused here, before anything is stopped, and the running daemon and VMs stay.
    if (req->restart) {
      Status check = CheckEgressConfig(s.paths.config + "/egress.json");
      if (!check.ok()) {
        LogError("daemon", "restart refused: " + check.message());
        (void)client.End(ErrorReply(FailedPrecondition(
            "not restarted: a new daemon would refuse its configuration: " + check.message() +
            ". The running daemon and its " + std::to_string(vms) +
            " VMs were left alone; fix the file (`trybox daemon reload` checks it)")));
        return;
      }
    }
    LogInfo("daemon", std::string("stopping on request") + (req->restart ? " (a restart)" : "") +
                          "; " + std::to_string(vms) + " VMs will be destroyed");
    // The reply goes first: after stop() the daemon tears down while this thread may still
    // be running. The client waits for the daemon's lock to be released.
    (void)client.End({{"ok", true}, {"pid", ::getpid()}, {"vms", vms}});
    control.stop(req->restart ? "trybox daemon restart" : "trybox daemon stop");
  });
  t.AddUnary("daemon_reload", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseDaemonReload(j);
    if (!req.ok()) return ErrorReply(req.status());
    size_t running = s.vms.LiveVms();
    auto r = s.egress.Reload();
    if (!r.ok()) {
      LogError("daemon", "reload refused, the settings in force stay: " + r.status().message());
      return ErrorReply(
          r.status().Annotate("egress.json was not reloaded; the settings in "
                              "force stay"));
    }
    LogInfo("daemon", "reloaded egress.json: " + std::to_string(r->changed.size()) + " changes; " +
                          std::to_string(running) +
                          " running VMs keep the settings they were created with");
    return {{"ok", true},
            {"egress",
             {{"path", s.paths.config + "/egress.json"},
              {"changed", r->changed},
              {"restart_required", r->restart_required}}},
            {"running_vms_unchanged", running}};
  });
}

}  // namespace trybox::daemon
