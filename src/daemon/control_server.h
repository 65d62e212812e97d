// ControlServer: the daemon's unix socket (docs/protocol/daemon.md). It owns the listener,
// checks each connection's peer credentials (the daemon's own uid, or root), runs one
// channel::Mux per connection, and dispatches each request stream through the VerbTable.
// A connection's ephemeral VMs are destroyed when it closes, however the client went away.
//
// VerbTable: the fixed list of verbs, each unary (a reply object) or streaming (the handler
// owns the stream). Dispatch never lets an exception or a malformed request escape: a
// request that is not an object, has no string verb, or names an unknown verb is answered
// with INVALID_ARGUMENT, and the daemon keeps serving. Thread-safe after registration.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "channel/mux.h"
#include "daemon/wire.h"
#include "util/mutex.h"
#include "util/socket.h"

namespace trybox::daemon {

// One client connection.
class Connection {
 public:
  explicit Connection(uid_t uid) : uid_(uid) {}
  uid_t uid() const { return uid_; }
  // Records a VM to destroy when the connection closes; false if it has closed already
  // (the caller destroys the VM itself).
  bool AddEphemeral(const std::string& vm) EXCLUDES(mu_);
  // Marks the connection closed and returns its ephemeral VMs.
  std::vector<std::string> Close() EXCLUDES(mu_);

 private:
  const uid_t uid_;
  Mutex mu_;
  std::vector<std::string> ephemeral_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
};

class VerbTable {
 public:
  using Unary = std::function<Json(const Json& request, Connection& conn)>;
  // A streaming verb may change its request: one that carries a secret (the model key) wipes
  // the request's copy once it has been parsed.
  using Streaming = std::function<void(channel::Stream& stream, Json& request, Connection& conn)>;

  void AddUnary(const std::string& verb, Unary handler);
  void AddStreaming(const std::string& verb, Streaming handler);
  // Runs the verb's handler on this thread; the stream always ends (END or RESET).
  void Dispatch(channel::Stream& stream, Json& request, Connection& conn) const;
  std::vector<std::string> Names() const;

 private:
  struct Verb {
    Unary unary;
    Streaming streaming;
  };
  std::map<std::string, Verb> verbs_;
  std::vector<std::string> order_;
};

class ControlServer {
 public:
  // `on_close` destroys a closed connection's ephemeral VM.
  ControlServer(const VerbTable& verbs, std::function<void(const std::string&)> on_close)
      : verbs_(verbs), on_close_(std::move(on_close)) {}

  Status Listen(const std::string& socket_path);
  // Accepts connections until Stop().
  Status Serve();
  // From any thread.
  void Stop();
  // A connection from inside the daemon (the HTTP API's REST routes, rest_api.cc): one end
  // of a socket pair, whose other end is served as any client's, as the daemon's own uid.
  // The caller runs a channel::Mux (Role::kHost) on it; closing it ends the connection.
  Result<UniqueFd> Attach();

 private:
  void HandleClient(UniqueFd fd, uid_t uid);

  const VerbTable& verbs_;
  const std::function<void(const std::string&)> on_close_;
  std::optional<UnixListener> listener_;
  std::atomic<bool> stopping_{false};
};

}  // namespace trybox::daemon
