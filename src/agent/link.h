// DaemonLink: trybox-agent's end of its one connection to tryboxd (docs/protocol/agent.md).
// The loop's VM, its caller and its model transport are all requests on it; the daemon binds
// every request to this process's run, so nothing here names a VM, a run or a key.
// Thread-compatible: the loop uses it from one thread.
#pragma once

#include <memory>
#include <string>

#include "agent/http.h"
#include "agent/loop.h"
#include "agent/model.h"
#include "channel/mux.h"
#include "util/fd.h"

namespace trybox::agent {

class DaemonLink {
 public:
  // Speaks over `fd` (the socket tryboxd handed down).
  explicit DaemonLink(UniqueFd fd);

  struct Hello {
    std::string mode;  // "probe" or "loop"
    std::string run;
    ModelSettings model;  // no key
    LoopLimits limits;
    std::string system_prompt;
    LoopState state;  // the transcript so far, usage, turn times
  };
  Result<Hello> Start();

  // Model requests go to the daemon, which sends them on with the credential.
  std::unique_ptr<HttpTransport> Transport();
  RunVm& vm() { return *vm_; }
  RunEvents& events() { return *events_; }
  // The loop's end (after a last save), with the question's pending results if it asked.
  Status Done(const LoopResult& result);
  Status ProbeDone(const Outcome& outcome);

  // One request: `upload` (if any) on channel 0; the END body (an error reply becomes a
  // Status) and the bytes of channel 1.
  struct Reply {
    nlohmann::json end;
    std::string data;
  };
  Result<Reply> Call(const nlohmann::json& request, const std::string* upload = nullptr);

 private:
  class Vm;
  class Events;
  class Http;
  channel::Mux mux_;
  std::unique_ptr<RunVm> vm_;
  std::unique_ptr<RunEvents> events_;
  size_t saved_entries_ = 0;  // transcript entries the daemon has
};

}  // namespace trybox::agent
