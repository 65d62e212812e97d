// Client: the CLI's connection to tryboxd. Starts a per-user daemon if none answers.
//
// The CLI talks only to its own daemon (docs/protocol/daemon.md, "The client's checks"):
// the runtime directory that holds the socket must be a private directory of this user
// (util/private_dir.h), and the process at the other end of the socket must run as this
// user's effective uid or as root (SO_PEERCRED). Both are checked before a byte is sent:
// requests carry model API keys.
#pragma once

#include <memory>
#include <string>

#include "channel/mux.h"
#include "util/paths.h"
#include "util/status.h"

namespace trybox::cli {

using Json = nlohmann::json;

class Client {
 public:
  // Connects to the daemon's socket; if nothing listens there and `autostart`, starts
  // `tryboxd` (beside this binary, else on PATH) detached and waits for it. With
  // `autostart`, a missing runtime directory is created (mode 0700); an existing one that
  // is not private is refused, as is a daemon running as another user (kPermissionDenied).
  static Result<std::unique_ptr<Client>> Connect(const Paths& paths, bool autostart = true);

  // Opens a verb stream.
  Result<std::shared_ptr<channel::Stream>> Open(const Json& request);
  // A verb with no data: returns the END body, or an error Status built from it.
  Result<Json> Call(const Json& request);
  // Closes the connection: every open stream fails, and the daemon destroys the VMs created
  // ephemeral on it. Safe from another thread (an interrupted build, cli/image_recipe.h).
  void Shutdown() { mux_->Shutdown(); }

 private:
  explicit Client(std::unique_ptr<channel::Mux> mux) : mux_(std::move(mux)) {}
  std::unique_ptr<channel::Mux> mux_;
};

// OK if the process at the other end of the connected unix socket `fd` runs as our
// effective uid or as root; otherwise kPermissionDenied naming its uid and `socket`.
Status CheckDaemonPeer(int fd, const std::string& socket);

// Turns a daemon END body {"ok":false,"error":{...}} into a Status; OK for ok:true. A body
// of another shape is a malformed-reply error (cli/reply.h).
Status StatusFromReply(const Json& reply);

}  // namespace trybox::cli
