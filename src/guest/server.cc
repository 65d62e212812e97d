#include "guest/server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <thread>

#include "guest/cgroup.h"
#include "guest/egress.h"
#include "guest/exec.h"
#include "guest/files.h"
#include "guest/requests.h"
#include "util/log.h"
#include "util/names.h"

namespace trybox::guest {
namespace {

using channel::Stream;

constexpr auto kRetryPause = std::chrono::milliseconds(100);
constexpr auto kHostPoll = std::chrono::milliseconds(20);
// Socket buffers between the Mux and the relay: big enough for a few full frames.
constexpr int kSocketBuffer = 4 << 20;
constexpr int kShutdownFlushMs = 1000;

Json Fail(const char* error, const std::string& message) {
  return {{"ok", false}, {"error", error}, {"message", message}};
}

int64_t UptimeMs() {
  struct timespec ts;
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

void GrowBuffers(int fd) {
  for (int opt : {SO_SNDBUFFORCE, SO_RCVBUFFORCE}) {
    ::setsockopt(fd, SOL_SOCKET, opt, &kSocketBuffer, sizeof kSocketBuffer);
  }
}

}  // namespace

void Server::Run() {
  Status egress = StartEgressListener([this] {
    std::lock_guard<std::mutex> lock(mu_);
    return mux_;
  });
  if (!egress.ok()) LogError("init", "egress listener: " + egress.message());
  bool reported = false;  // the console hears about a missing port once, not every retry
  for (;;) {
    auto path = FindVirtioPort(kControlPortName);
    UniqueFd port;
    if (path.ok()) port.Reset(::open(path->c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK));
    if (!port.valid()) {
      if (!reported) {
        LogError("init",
                 path.ok() ? ErrnoError("open " + *path).message() : path.status().message());
        reported = true;
      }
      std::this_thread::sleep_for(kRetryPause);
      continue;
    }
    reported = false;
    while (!HostConnected(port.get())) std::this_thread::sleep_for(kHostPoll);

    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      LogError("init", ErrnoError("socketpair").message());
      std::this_thread::sleep_for(kRetryPause);
      continue;
    }
    UniqueFd mux_end(sv[0]), relay_end(sv[1]);
    GrowBuffers(mux_end.get());
    GrowBuffers(relay_end.get());
    auto relay = PortRelay::Start(std::move(port), std::move(relay_end));
    if (!relay.ok()) {
      LogError("init", relay.status().message());
      std::this_thread::sleep_for(kRetryPause);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      relay_ = relay->get();
    }
    std::string why;
    {
      // Shared with egress connections, which open their streams on it.
      auto mux = std::make_shared<channel::Mux>(std::move(mux_end), channel::Role::kGuest);
      mux->OnOpen([this](std::shared_ptr<Stream> s, Json req) { Handle(s, req); });
      PortRelay* r = relay->get();
      mux->OnDeath([r](const std::string& reason) { r->Stop("mux: " + reason); });
      mux->Start();
      {
        std::lock_guard<std::mutex> lock(mu_);
        mux_ = mux;
      }
      Status hello = mux->SendControl({{"type", "hello"},
                                       {"agent", "trybox-init"},
                                       {"version", 1},
                                       {"boot_id", boot_.boot_id}});
      if (!hello.ok()) (*relay)->Stop("hello: " + hello.message());
      why = (*relay)->Wait();
      // In-flight requests (and egress tunnels) see the connection die.
      mux->Shutdown();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      relay_ = nullptr;
      mux_ = nullptr;
    }
    LogDebug("init", "session ended: " + why);
    relay->reset();
    std::this_thread::sleep_for(kRetryPause);
  }
}

void Server::Handle(const std::shared_ptr<Stream>& stream, const Json& request) {
  std::string op;
  try {
    auto parsed = RequestOp(request);
    if (!parsed.ok()) {
      (void)stream->End(Fail("bad_request", parsed.status().message()));
      return;
    }
    op = *parsed;
    if (op == "exec") {
      ServeExec(reaper_, *stream, request);
    } else if (op == "put") {
      ServePut(reaper_, *stream, request);
    } else if (op == "get") {
      ServeGet(reaper_, *stream, request);
    } else if (op == "ping") {
      (void)stream->End({{"ok", true}, {"boot_id", boot_.boot_id}, {"uptime_ms", UptimeMs()}});
    } else if (op == "shutdown") {
      Shutdown(*stream);
    } else {
      (void)stream->End(Fail("bad_request", "unknown op " + QuoteForMessage(op)));
    }
  } catch (const std::exception& e) {
    std::string message = std::string("trybox-init failed serving ") +
                          (op.empty() ? "a request" : op) + ": " + e.what();
    LogError("init", message);
    if (!stream->finished()) {
      (void)stream->End(
          op == "exec" ? Json{{"outcome", "error"}, {"error", "internal"}, {"message", message}}
                       : Fail("internal", message));
    }
  }
  if (!stream->finished()) (void)stream->Reset("request handler ended without a result");
}

void Server::Shutdown(Stream& stream) {
  (void)stream.End({{"ok", true}});
  KillAllExecCgroups();
  // Everything but PID 1 itself.
  ::kill(-1, SIGKILL);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (relay_ != nullptr) relay_->Flush(kShutdownFlushMs);
  }
  UnmountAll();
  PowerOff();
}

}  // namespace trybox::guest
