// Server: trybox-init's request loop. Finds the control port, serves a channel::Mux on it
// (one session per host connection, each opened with a hello event), and dispatches every
// OPEN to its handler on the Mux's per-request thread, so a long exec never blocks a ping.
//
// A handler's failure, even an exception, ends its own stream with an error and never
// the server. Thread-safe: handlers run concurrently.
#pragma once

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "channel/mux.h"
#include "guest/boot.h"
#include "guest/port.h"
#include "guest/reaper.h"
#include "util/thread_annotations.h"

namespace trybox::guest {

class Server {
 public:
  Server(Reaper& reaper, BootInfo boot) : reaper_(reaper), boot_(std::move(boot)) {}
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves one session after another for the life of the guest. A shutdown request powers
  // the guest off from its handler.
  [[noreturn]] void Run();

 private:
  void RunSession();
  void Handle(const std::shared_ptr<channel::Stream>& stream, const nlohmann::json& request);
  [[noreturn]] void Shutdown(channel::Stream& stream);

  Reaper& reaper_;
  const BootInfo boot_;
  std::mutex mu_;
  PortRelay* relay_ GUARDED_BY(mu_) = nullptr;         // the current session's, for Shutdown
  std::shared_ptr<channel::Mux> mux_ GUARDED_BY(mu_);  // the current session's, for egress
};

}  // namespace trybox::guest
