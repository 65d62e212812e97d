// trybox-init's end of egress: a listener on 127.0.0.1:3128 for the life of the guest. Each
// accepted TCP connection becomes a stream the guest opens on the current session's Mux
// ({"op":"egress"}), carrying raw bytes both ways (docs/protocol/egress.md). The guest
// parses and decides nothing: the host reads the CONNECT request and answers it.
#pragma once

#include <functional>
#include <memory>

#include "channel/mux.h"
#include "util/status.h"

namespace trybox::guest {

inline constexpr uint16_t kEgressPort = 3128;
inline constexpr const char* kEgressProxyUrl = "http://127.0.0.1:3128";

// The current session's Mux, or null between sessions.
using CurrentMux = std::function<std::shared_ptr<channel::Mux>()>;

// Binds 127.0.0.1:3128 and serves it on a detached thread, one thread per connection.
// Fails only if the port cannot be bound.
Status StartEgressListener(CurrentMux current);

}  // namespace trybox::guest
