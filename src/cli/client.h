// Client: the CLI's connection to tryboxd. Starts a per-user daemon if none answers.
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
  // `tryboxd` (beside this binary, else on PATH) detached and waits for it.
  static Result<std::unique_ptr<Client>> Connect(const Paths& paths, bool autostart = true);

  // Opens a verb stream.
  Result<std::shared_ptr<channel::Stream>> Open(const Json& request);
  // A verb with no data: returns the END body, or an error Status built from it.
  Result<Json> Call(const Json& request);

 private:
  explicit Client(std::unique_ptr<channel::Mux> mux) : mux_(std::move(mux)) {}
  std::unique_ptr<channel::Mux> mux_;
};

// Turns a daemon END body {"ok":false,"error":{...}} into a Status; OK for ok:true.
Status StatusFromReply(const Json& reply);

}  // namespace trybox::cli
