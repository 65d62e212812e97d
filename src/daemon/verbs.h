// The verb table's entries (docs/protocol/daemon.md): for each verb, its request parser,
// the service call, and its result writer. The only place where the daemon's services meet
// the socket's JSON.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "daemon/agent_runner.h"
#include "daemon/control_server.h"
#include "daemon/egress_gateway.h"
#include "daemon/exec_logs.h"
#include "daemon/http_api.h"
#include "daemon/image_service.h"
#include "daemon/record_keeper.h"
#include "daemon/vm_launcher.h"
#include "daemon/vm_service.h"
#include "daemon/workspace_service.h"
#include "util/paths.h"

namespace trybox::daemon {

struct Services {
  const Paths& paths;
  std::string qemu;
  VmService& vms;
  VmLauncher& launcher;
  EgressGateway& egress;
  WorkspaceService& workspaces;
  AgentRunner& agents;
  ExecLogs& logs;
  RecordKeeper& records;
  HttpApi& http;
};

// create, destroy, list, exec, put, get, doctor, audit, ping.
void AddVmVerbs(VerbTable& table, Services& s);
// workspace_in, collect, diff, agent, agent_answer, agent_resume, agent_show.
void AddWorkVerbs(VerbTable& table, Services& s);
// logs, ps, kill, port (verbs_term.cc).
void AddTerminalVerbs(VerbTable& table, Services& s);
// prune (verbs_store.cc).
void AddStoreVerbs(VerbTable& table, Services& s);
// serve, api_key_create, api_key_ls, api_key_rm (verbs_http.cc).
void AddHttpVerbs(VerbTable& table, Services& s);
// doctor's `store` object.
Json StoreHealthJson(const StoreHealth& h);

// commit, image_ls, image_rm, image_prune (verbs_image.cc).
void AddImageVerbs(VerbTable& table, ImageService& images, Services& s);

// What the daemon_* verbs need of the daemon itself (verbs_daemon.cc).
struct DaemonControl {
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  int64_t started_at = 0;  // seconds since the epoch
  Json limits;             // the admission and disk settings in force, for status
  Json settings;           // the log file and retention, for status
  // The last integrity check of the store (Daemon::CheckStore), for status.
  std::function<Json()> store_check;
  // Stops serving; the daemon then ends its VMs and exits. Called after the reply is sent,
  // with what asked ("trybox daemon stop"): execs cut off by the stop report it.
  std::function<void(const std::string&)> stop;
};
// daemon_status, daemon_stop, daemon_reload.
void AddDaemonVerbs(VerbTable& table, Services& s, const DaemonControl& control);

// At most this many changes in one collect or diff reply (a reply stays under the frame
// limit); diff pages through the rest.
inline constexpr int64_t kMaxReplyChanges = 2000;

}  // namespace trybox::daemon
