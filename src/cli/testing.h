// Test support for the CLI's unit tests: a scripted tryboxd speaking the real channel
// protocol on a real unix socket. Not used by trybox itself.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "channel/mux.h"
#include "util/fd.h"
#include "util/paths.h"
#include "util/process.h"
#include "util/socket.h"
#include "util/status.h"
#include "util/thread_annotations.h"

namespace trybox::cli::testing {

// A private TRYBOX_HOME-like layout in a fresh temp dir under /tmp; nothing listens on its
// socket, and its runtime directory does not exist until a ScriptedDaemon makes it.
struct Home {
  Home();
  TempDir dir;
  Paths paths;
};

// The daemon's side of the channel protocol on a real unix socket at paths.socket() (the
// runtime directory is created private). Each verb stream is handed to `script` on its own
// thread, with the request. Thread-safe; the destructor shuts every connection down and
// waits for the scripts to return.
class ScriptedDaemon {
 public:
  using Script =
      std::function<void(std::shared_ptr<channel::Stream>, const nlohmann::json& request)>;

  static Result<std::unique_ptr<ScriptedDaemon>> Start(const Paths& paths, Script script);
  ~ScriptedDaemon();

  // Every request received so far, in order.
  std::vector<nlohmann::json> requests();

 private:
  ScriptedDaemon(UnixListener listener, Script script);

  Script script_;
  UnixListener listener_;
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable done_;
  int handlers_ GUARDED_BY(mu_) = 0;
  std::vector<nlohmann::json> requests_ GUARDED_BY(mu_);
  std::vector<std::unique_ptr<channel::Mux>> muxes_ GUARDED_BY(mu_);
};

// Runs the trybox binary (beside the running test binary, or in $TRYBOX_BIN_DIR to try
// another build) with `args` and TRYBOX_HOME set to `home`; its stdout and stderr are kept.
struct ProgramResult {
  ExitInfo exit;
  std::string out, err;
};
Result<ProgramResult> RunTryboxBinary(const Home& home, const std::vector<std::string>& args);

}  // namespace trybox::cli::testing
