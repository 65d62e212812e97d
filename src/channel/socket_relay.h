// RelaySocket: one connected stream socket and one channel::Stream, bytes copied both ways
// with half-close kept (an EOF on one side is a shutdown(SHUT_WR) on the other). The guest's
// `port` op and the CLI's `trybox port` are its two ends (docs/protocol/guest.md, "port").
//
// The calling thread reads the stream; one helper thread reads the socket. Blocking
// sockets; nothing here polls on a timer.
#pragma once

#include <cstdint>
#include <optional>

#include "channel/mux.h"
#include "util/status.h"

namespace trybox::channel {

enum class RelaySide {
  // The side that opened the stream: the relay ends with the peer's END (or RESET). Socket
  // bytes go out on channel 0, channel 1 comes in.
  kOpener,
  // The side that answers: the relay ends once both directions are closed (the socket's EOF
  // forwarded, the peer's EOF received), and the caller then sends the END. Socket bytes go
  // out on channel 1, channel 0 comes in.
  kResponder,
};

struct SocketRelayResult {
  int64_t to_socket = 0;    // bytes written to the socket
  int64_t from_socket = 0;  // bytes read from the socket and sent on the stream
  std::optional<Json> end;  // kOpener: the peer's END
  // The stream died: reset by the peer (its reason), or the connection lost. Nothing more
  // may be sent on it.
  Status stream_failure;
  // Reading the socket failed (ECONNRESET, ...). kOpener: the stream was reset with this
  // reason. kResponder: the relay stopped early; the caller ENDs with it.
  Status socket_failure;
};

SocketRelayResult RelaySocket(Stream& s, int sock, RelaySide side);

}  // namespace trybox::channel
