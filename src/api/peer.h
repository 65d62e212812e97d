// Telling the HTTP server's clients apart (docs/protocol/http.md, "Callers without
// credentials"). The server listens on loopback only, so every client connects from 127.0.0.1
// or ::1 and its address says nothing; what does is the user whose process made the
// client's socket, which the kernel tells through sock_diag (the query `ss -e` makes).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace trybox::api {

// The uid that owns the other end of `fd`, an accepted TCP connection whose two ends are on
// this machine; nothing when the kernel does not say (the client already closed, or the
// peer is on another host).
std::optional<uid_t> LocalPeerUid(int fd);

// What the per-peer limits count by: "uid N", or "address A" when the uid is unknown.
std::string PeerKey(int fd);

}  // namespace trybox::api
