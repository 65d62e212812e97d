// trybox-init's end of egress: a listener on 127.0.0.1:3128 for the life of the guest. Each
// accepted TCP connection becomes a stream the guest opens on the current session's Mux
// ({"op":"egress"}), carrying raw bytes both ways (docs/protocol/egress.md). The guest
// parses and decides nothing: the host reads the CONNECT request and answers it.
#pragma once

#include <functional>
#include <memory>

#include "channel/mux.h"
#include "util/fd.h"
#include "util/status.h"

namespace trybox::guest {

inline constexpr uint16_t kEgressPort = 3128;
inline constexpr const char* kEgressProxyUrl = "http://127.0.0.1:3128";

// The current session's Mux, or null between sessions.
using CurrentMux = std::function<std::shared_ptr<channel::Mux>()>;

// Relays one accepted guest connection over a stream opened on `mux` with `request` (null
// `mux`: no host session). For the proxy (`transparent` false) a failure to open answers
// 503; for a connection a program dialled itself (guest/transparent.h) every failure, and
// the host's reset of the stream, resets the program's connection.
void RelayConnection(UniqueFd sock, std::shared_ptr<channel::Mux> mux, const channel::Json& request,
                     bool transparent);

// Blocks until a connection arrives on `listen_fd`; a failed accept (EMFILE) is logged and
// retried after a pause.
UniqueFd AcceptRetrying(int listen_fd);

// Runs `f` on a detached thread; false (logged, nothing started) when the guest is out of
// threads. PID 1 must not die of std::system_error.
bool SpawnDetached(std::function<void()> f);

// Binds 127.0.0.1:3128 and serves it on a detached thread, one thread per connection.
// Fails only if the port cannot be bound.
Status StartEgressListener(CurrentMux current);

}  // namespace trybox::guest
