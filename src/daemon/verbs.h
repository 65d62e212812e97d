// The verb table's entries (docs/protocol/daemon.md): for each verb, its request parser,
// the service call, and its result writer. The only place where the daemon's services meet
// the socket's JSON.
#pragma once

#include <string>

#include "daemon/agent_runner.h"
#include "daemon/control_server.h"
#include "daemon/egress_gateway.h"
#include "daemon/exec_logs.h"
#include "daemon/image_service.h"
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
};

// create, destroy, list, exec, put, get, doctor, audit, ping.
void AddVmVerbs(VerbTable& table, Services& s);
// workspace_in, collect, diff, agent, agent_answer, agent_resume, agent_show.
void AddWorkVerbs(VerbTable& table, Services& s);
// logs, ps, kill, port (verbs_term.cc).
void AddTerminalVerbs(VerbTable& table, Services& s);

// image_ls's `images` array: each image with its template's state as judged with the
// accelerator kept in state_dir/accel.json ("unknown" before any choice).
Json ImageListJson(const std::vector<ImageView>& list, const std::string& state_dir);
// commit, image_ls, image_rm, image_prune (verbs_image.cc).
void AddImageVerbs(VerbTable& table, ImageService& images, Services& s);

// At most this many changes in one collect or diff reply (a reply stays under the frame
// limit); diff pages through the rest.
inline constexpr int64_t kMaxReplyChanges = 2000;

}  // namespace trybox::daemon
