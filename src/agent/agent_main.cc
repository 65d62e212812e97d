// trybox-agent: the vm_agent loop in a process of its own (docs/agent.md,
// docs/protocol/agent.md). tryboxd starts one per call of a run, with one socket as fd 3 and
// nothing else: no key, no store, no image, no network. It sandboxes itself first
// (agent/sandbox.h), then asks the daemon what to do: probe the model, or work on the run.
//
// Usage (by tryboxd only): trybox-agent [--uid UID]
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

#include "agent/link.h"
#include "agent/loop.h"
#include "agent/sandbox.h"

using trybox::Status;

namespace {

constexpr int kLinkFd = 3;

int Fail(const std::string& what, const Status& st) {
  std::cerr << "trybox-agent: " << what << ": " << st.ToString() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The daemon dying takes this process with it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::optional<uid_t> uid;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--uid") == 0 && i + 1 < argc) {
      uid = static_cast<uid_t>(std::strtoul(argv[++i], nullptr, 10));
    } else {
      std::cerr << "usage: trybox-agent [--uid UID] (started by tryboxd)\n";
      return 2;
    }
  }
  auto sandbox = trybox::agent::EnterSandbox(uid);
  if (!sandbox.ok()) return Fail("sandbox", sandbox.status());

  trybox::agent::DaemonLink link{trybox::UniqueFd(kLinkFd)};
  auto hello = link.Start();
  if (!hello.ok()) return Fail("hello", hello.status());
  auto model = trybox::agent::ModelClient::Make(hello->model, link.Transport());
  if (!model.ok()) return Fail("model", model.status());
  if (hello->mode == "probe") {
    auto outcome = (*model)->Probe(std::chrono::steady_clock::now() + std::chrono::minutes(5));
    Status st = link.ProbeDone(outcome);
    return st.ok() ? 0 : Fail("done", st);
  }
  trybox::agent::LoopResult result = trybox::agent::RunLoop(
      **model, link.vm(), link.events(), hello->state, hello->limits, hello->system_prompt);
  link.events().Save(hello->state);
  Status st = link.Done(result);
  return st.ok() ? 0 : Fail("done", st);
}
