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
#include <vector>

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
  // `st` as it should be told: once the daemon's connection is gone, DaemonUnreachable.
  Status Explain(const Status& st) const;
  // Closes the connection: every open stream fails, and the daemon destroys the VMs created
  // ephemeral on it. Safe from another thread (an interrupted build, cli/image_recipe.h).
  void Shutdown() { mux_->Shutdown(); }

 private:
  Client(std::unique_ptr<channel::Mux> mux, std::string socket)
      : mux_(std::move(mux)), socket_(std::move(socket)) {}
  std::unique_ptr<channel::Mux> mux_;
  const std::string socket_;
};

// The one name of a daemon that does not answer, whatever the command and whenever it is
// found out (before connecting, at the start, or mid-request): kUnavailable
// "cannot reach tryboxd at SOCKET: DETAIL".
Status DaemonUnreachable(const std::string& socket, const std::string& detail);
// The environment an auto-started tryboxd gets, from the CLI's own (`environ`): PATH, HOME,
// USER, LOGNAME, SHELL, TMPDIR, LANG, LC_*, TZ, every TRYBOX_* and XDG_* variable; nothing
// else. The CLI's environment may hold API keys and other secrets the daemon must never
// inherit: it is told what it needs by requests (a vm_agent call carries its model's key).
std::vector<std::string> DaemonEnvironment(const char* const* environ);

// OK if the process at the other end of the connected unix socket `fd` runs as our
// effective uid or as root; otherwise kPermissionDenied naming its uid and `socket`.
Status CheckDaemonPeer(int fd, const std::string& socket);

// Turns a daemon END body {"ok":false,"error":{...}} into a Status; OK for ok:true. A body
// of another shape is a malformed-reply error (cli/reply.h).
Status StatusFromReply(const Json& reply);

}  // namespace trybox::cli
