#include "cli/daemon_cmd.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>

#include "cli/agent_settings.h"
#include "cli/client.h"
#include "cli/reply.h"
#include "util/fd.h"
#include "util/utf8.h"
#include "util/version.h"

namespace trybox::cli {
namespace {

using Json = nlohmann::json;
constexpr int kNotRunning = 3;  // `daemon status|reload`: no daemon answers

// A stop destroys every VM first; each takes well under a second, a loaded host more.
constexpr auto kStopWait = std::chrono::minutes(5);

std::string Duration(int64_t s) {
  std::string out;
  if (s >= 86400) out += std::to_string(s / 86400) + "d";
  if (s >= 3600) out += std::to_string(s / 3600 % 24) + "h";
  if (s >= 60) out += std::to_string(s / 60 % 60) + "m";
  return out + std::to_string(s % 60) + "s";
}

std::string Bytes(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

// The daemon holds an exclusive lock on this file for its whole life; the kernel drops it
// when the process ends, whoever its parent is (an exited child not yet reaped holds
// nothing).
Status WaitForDaemonExit(const Paths& paths) {
  ASSIGN_OR_RETURN(UniqueFd lock, OpenFile(paths.runtime + "/tryboxd.lock", O_RDWR | O_CLOEXEC));
  auto until = std::chrono::steady_clock::now() + kStopWait;
  while (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (std::chrono::steady_clock::now() > until) {
      return DeadlineExceeded("tryboxd has not ended 5 minutes after it was asked to stop");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  (void)::flock(lock.get(), LOCK_UN);
  return Status::Ok();
}

// Asks the daemon to stop and waits until it has. False in *was_running when none answers.
Status Stop(const Paths& paths, bool restart, std::ostream& out, bool* was_running) {
  auto c = Client::Connect(paths, /*autostart=*/false);
  *was_running = c.ok();
  if (!c.ok()) return c.status().code() == Code::kUnavailable ? Status::Ok() : c.status();
  ASSIGN_OR_RETURN(Json r, (*c)->Call({{"verb", "daemon_stop"}, {"restart", restart}}));
  ReplyView v(r);
  ASSIGN_OR_RETURN(int64_t pid, v.Int("pid", 1));
  ASSIGN_OR_RETURN(int64_t vms, v.IntOr("vms", 0, 0));
  c->reset();
  RETURN_IF_ERROR(WaitForDaemonExit(paths));
  out << "tryboxd (pid " << pid << ") stopped; " << vms << " VM" << (vms == 1 ? "" : "s")
      << " destroyed\n";
  return Status::Ok();
}

int Failed(std::ostream& err, const Status& st) {
  err << "trybox: " << OneLine(st.message()) << "\n";
  return 125;
}

int NotRunning(const Paths& paths, std::ostream& err) {
  err << "trybox: tryboxd is not running (no daemon answers on " << paths.socket() << ")\n";
  return kNotRunning;
}

}  // namespace

void AddDaemonCommands(CLI::App& app, Invocation& inv) {
  auto* d = app.add_subcommand("daemon", "Manage tryboxd: status, stop, restart, reload");
  d->require_subcommand(1);
  auto* status = d->add_subcommand("status", "Print the daemon's pid, version, uptime, VMs");
  status->add_flag("--json", inv.json, "JSON output");
  status->callback([&inv] { inv.command = "daemon-status"; });
  d->add_subcommand("stop", "Destroy every VM and stop the daemon")->callback([&inv] {
    inv.command = "daemon-stop";
  });
  d->add_subcommand("restart", "Stop the daemon (destroying every VM) and start it again")
      ->callback([&inv] { inv.command = "daemon-restart"; });
  d->add_subcommand("reload",
                    "Read egress.json again for new VMs (running VMs keep theirs); check "
                    "agent.json")
      ->callback([&inv] { inv.command = "daemon-reload"; });
}

bool IsDaemonCommand(const std::string& command) { return command.rfind("daemon-", 0) == 0; }

Result<std::string> RenderDaemonStatus(const Json& reply) {
  ReplyView r(reply);
  ASSIGN_OR_RETURN(int64_t pid, r.Int("pid", 1));
  ASSIGN_OR_RETURN(std::string version, r.String("version"));
  ASSIGN_OR_RETURN(int64_t uptime, r.Int("uptime_s", 0));
  ASSIGN_OR_RETURN(int64_t vms, r.Int("vms", 0));
  ASSIGN_OR_RETURN(ReplyView store, r.Object("store"));
  ASSIGN_OR_RETURN(std::string db, store.String("path"));
  ASSIGN_OR_RETURN(int64_t db_bytes, store.Int("bytes", 0));
  ASSIGN_OR_RETURN(int64_t wal_bytes, store.IntOr("wal_bytes", 0, 0));
  ASSIGN_OR_RETURN(std::string managed, r.StringOr("managed_by", "none"));
  int64_t spares = 0;
  if (reply.contains("spares") && reply["spares"].is_object()) {
    for (const auto& [shape, n] : reply["spares"].items()) {
      if (n.is_number_integer()) spares += n.get<int64_t>();
    }
  }
  std::string out = "tryboxd: pid " + std::to_string(pid) + ", version " + version + ", up " +
                    Duration(uptime) + (managed == "systemd" ? " (a systemd user service)" : "") +
                    "\n";
  out += "VMs: " + std::to_string(vms) + " live, " + std::to_string(spares) + " spare clones\n";
  out += "store: " + db + ", " + Bytes(db_bytes) + " (+ " + Bytes(wal_bytes) + " WAL)\n";
  ASSIGN_OR_RETURN(auto check, store.OptionalObject("check"));
  if (check) {
    ASSIGN_OR_RETURN(bool ok, check->Bool("ok"));
    ASSIGN_OR_RETURN(std::string detail, check->StringOr("detail", ""));
    ASSIGN_OR_RETURN(int64_t at, check->IntOr("at", 0, 0));
    const int64_t ago = std::max<int64_t>(0, static_cast<int64_t>(std::time(nullptr)) - at);
    out += std::string("store check: ") + (ok ? "ok" : "DAMAGED") + ", " + Duration(ago) + " ago" +
           (ok ? "" : ": " + detail) + "\n";
  }
  ASSIGN_OR_RETURN(std::string log, r.StringOr("log_file", ""));
  out += "log: " + (log.empty() ? std::string("standard error (no --log-file)") : log) + "\n";
  ASSIGN_OR_RETURN(auto limits, r.OptionalObject("limits"));
  if (limits) {
    ASSIGN_OR_RETURN(int64_t reserve, limits->IntOr("memory_reserve_mib", 0, 0));
    ASSIGN_OR_RETURN(int64_t max_vms, limits->IntOr("max_vms", 0, 0));
    ASSIGN_OR_RETURN(int64_t budget, limits->IntOr("memory_budget_mib", 0, 0));
    const Json& ratio = limits->json().contains("memory_overcommit")
                            ? limits->json()["memory_overcommit"]
                            : Json(1.0);
    char line[160];
    std::snprintf(line, sizeof line, "%lld MiB VM memory budget (overcommit ratio %g), ",
                  static_cast<long long>(budget), ratio.is_number() ? ratio.get<double>() : 1.0);
    out += "admission: " + std::string(line) + std::to_string(reserve) + " MiB memory reserve, " +
           (max_vms > 0 ? "at most " + std::to_string(max_vms) + " VMs" : "no VM cap") + "\n";
    ASSIGN_OR_RETURN(int64_t disk_budget, limits->IntOr("disk_budget_mib", 0, 0));
    ASSIGN_OR_RETURN(int64_t disk_reserve, limits->IntOr("disk_reserve_mib", 0, 0));
    out += "disk: " + std::to_string(disk_budget) + " MiB budget for the VMs' disks, " +
           std::to_string(disk_reserve) + " MiB kept free for creates\n";
  }
  ASSIGN_OR_RETURN(auto retention, r.OptionalObject("retention"));
  if (retention) {
    ASSIGN_OR_RETURN(int64_t age, retention->IntOr("max_age_s", 0, 0));
    ASSIGN_OR_RETURN(int64_t keep_vms, retention->IntOr("max_vms", 0, 0));
    ASSIGN_OR_RETURN(int64_t keep_runs, retention->IntOr("max_runs", 0, 0));
    ASSIGN_OR_RETURN(int64_t every, retention->IntOr("prune_interval_s", 0, 0));
    out += "retention: ended VMs " + (age > 0 ? "for " + Duration(age) : "with no age limit") +
           ", " + (keep_vms > 0 ? "the newest " + std::to_string(keep_vms) : "any number") +
           "; agent runs " + (keep_runs > 0 ? "the newest " + std::to_string(keep_runs) : "any") +
           "; " + (every > 0 ? "pruned every " + Duration(every) : "pruned only by hand") + "\n";
  }
  return out;
}

int RunDaemonCommand(const Paths& paths, const Invocation& inv, std::ostream& out,
                     std::ostream& err) {
  const std::string& cmd = inv.command;
  if (cmd == "daemon-stop" || cmd == "daemon-restart") {
    bool was_running = false;
    Status st = Stop(paths, cmd == "daemon-restart", out, &was_running);
    if (!st.ok()) return Failed(err, st);
    if (!was_running) out << "tryboxd was not running\n";
    if (cmd == "daemon-stop") return 0;
    auto c = Client::Connect(paths, /*autostart=*/true);
    if (!c.ok()) return Failed(err, c.status());
    auto r = (*c)->Call({{"verb", "daemon_status"}});
    if (!r.ok()) return Failed(err, r.status());
    out << "tryboxd started again: pid " << r->value("pid", 0) << ", version "
        << r->value("version", "?") << "\n";
    return 0;
  }
  auto c = Client::Connect(paths, /*autostart=*/false);
  if (!c.ok()) {
    if (c.status().code() == Code::kUnavailable) return NotRunning(paths, err);
    return Failed(err, c.status());
  }
  if (cmd == "daemon-status") {
    auto r = (*c)->Call({{"verb", "daemon_status"}});
    if (!r.ok()) return Failed(err, r.status());
    if (inv.json) {
      out << r->dump(2) << "\n";
      return 0;
    }
    auto text = RenderDaemonStatus(*r);
    if (!text.ok()) return Failed(err, text.status());
    out << *text << "client: version " << Version() << "\n";
    return 0;
  }
  // daemon-reload
  auto r = (*c)->Call({{"verb", "daemon_reload"}});
  if (!r.ok()) return Failed(err, r.status());
  ReplyView v(*r);
  auto eg = v.Object("egress");
  if (!eg.ok()) return Failed(err, eg.status());
  auto changed = eg->Array("changed");
  auto restart = eg->Array("restart_required");
  auto running = v.IntOr("running_vms_unchanged", 0, 0);
  if (!changed.ok() || !restart.ok() || !running.ok()) {
    return Failed(err, !changed.ok()   ? changed.status()
                       : !restart.ok() ? restart.status()
                                       : running.status());
  }
  auto list = [](const Json* a) {
    std::string s;
    for (const auto& k : *a) s += (s.empty() ? "" : ", ") + k.get<std::string>();
    return s;
  };
  if ((*changed)->empty()) {
    out << "egress.json: no change\n";
  } else {
    out << "egress.json: changed " << list(*changed) << "; new VMs use it, the " << *running
        << " running VM" << (*running == 1 ? "" : "s") << " keep their settings\n";
  }
  if (!(*restart)->empty()) {
    out << "egress.json: " << list(*restart) << " take effect only after `trybox daemon restart`\n";
  }
  Status agent = CheckAgentConfig(paths);
  if (!agent.ok()) return Failed(err, agent.Annotate("agent.json"));
  out << "agent.json: read by each `trybox agent` and MCP call; the next one uses it\n";
  return 0;
}

}  // namespace trybox::cli
