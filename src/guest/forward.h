// The "port" request: a TCP connection to 127.0.0.1:PORT inside the guest, its bytes relayed
// over the request's stream both ways with half-close kept, so that `trybox port` can
// reach a server started in the VM. Protocol: docs/protocol/guest.md, "port".
#pragma once

#include <nlohmann/json.hpp>

#include "channel/mux.h"

namespace trybox::guest {

// Serves one port request from validation to END. Blocks for the connection's life.
void ServePort(channel::Stream& stream, const nlohmann::json& request);

}  // namespace trybox::guest
