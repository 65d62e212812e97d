#include "guest/forward.h"

#include "channel/socket_relay.h"
#include "guest/requests.h"
#include "util/tcp.h"

namespace trybox::guest {

void ServePort(channel::Stream& stream, const nlohmann::json& request) {
  auto fail = [&](const char* error, const std::string& message) {
    (void)stream.End({{"ok", false}, {"error", error}, {"message", message}});
  };
  auto req = ParsePortRequest(request);
  if (!req.ok()) return fail("bad_request", req.status().message());
  auto sock = ConnectTcpLoopback(req->port);
  if (!sock.ok()) return fail("connect_failed", sock.status().message());
  auto r = channel::RelaySocket(stream, sock->get(), channel::RelaySide::kResponder);
  if (!r.stream_failure.ok()) return;  // reset by the host, or the session is gone
  if (!r.socket_failure.ok()) {
    return fail("io", "127.0.0.1:" + std::to_string(req->port) + ": " + r.socket_failure.message());
  }
  (void)stream.End({{"ok", true}, {"bytes_in", r.to_socket}, {"bytes_out", r.from_socket}});
}

}  // namespace trybox::guest
