// Server: trybox-init's request loop. Finds the control port, serves a channel::Mux on it
// (one session per host connection, each opened with a hello event), and dispatches every
// OPEN to its handler on the Mux's per-request thread, so a long exec never blocks a ping.
//
// A handler's failure, even an exception, ends its own stream with an error and never
// the server. Thread-safe: handlers run concurrently.
#pragma once

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>

#include "channel/mux.h"
#include "guest/boot.h"
#include "guest/port.h"
#include "guest/reaper.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace trybox::guest {

class Server {
 public:
  Server(Reaper& reaper, BootInfo boot)
      : reaper_(reaper),
        boot_(std::move(boot)),
        ready_(!boot_.cmdline.template_boot),
        boot_id_(boot_.boot_id) {}
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves one session after another for the life of the guest. A shutdown request powers
  // the guest off from its handler.
  [[noreturn]] void Run();

 private:
  // Blocks until a host has the control port open. The driver raises SIGIO on this thread
  // when the host's side changes; a restored clone thus answers as soon as its host
  // connects instead of on the next tick of a poll loop.
  void WaitForHost(int port_fd);
  void Identify(channel::Stream& stream, const nlohmann::json& request);
  void SetClock(channel::Stream& stream, const nlohmann::json& request);
  nlohmann::json BootIdField();
  void Handle(const std::shared_ptr<channel::Stream>& stream, const nlohmann::json& request);
  [[noreturn]] void Shutdown(channel::Stream& stream);

  Reaper& reaper_;
  const BootInfo boot_;
  // False in a template-booted guest until an identity request succeeded: until then it is
  // a copy of every other clone, and serves only ping and identity.
  std::atomic<bool> ready_;
  Mutex mu_;
  std::string boot_id_ GUARDED_BY(mu_);                // "" until ready
  std::shared_ptr<channel::Mux> mux_ GUARDED_BY(mu_);  // the current session's, for egress
};

}  // namespace trybox::guest
