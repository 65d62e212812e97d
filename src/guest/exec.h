// The "exec" request: run a command in the guest, stream its output, report how it ended.
// Protocol: docs/protocol/guest.md.
#pragma once

#include <nlohmann/json.hpp>

#include "channel/mux.h"
#include "guest/credentials.h"
#include "guest/reaper.h"

namespace trybox::guest {

struct ExecOptions {
  AccountFiles accounts;  // where "user" is looked up
  // One cgroup per exec (guest/cgroup.h). Off in tests on a host, where the tree is still
  // killed through its process group.
  bool cgroups = true;
};

// Serves one exec on `stream` from validation to END (or to the stream's death, in which
// case the command's whole process tree is killed). Blocks the calling thread for the
// command's lifetime; starts one helper thread for host-to-guest traffic.
void ServeExec(Reaper& reaper, channel::Stream& stream, const nlohmann::json& request,
               const ExecOptions& options = {});

}  // namespace trybox::guest
