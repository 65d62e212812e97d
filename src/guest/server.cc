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
#include "guest/forward.h"
#include "guest/identity.h"
#include "guest/layer.h"
#include "guest/requests.h"
#include "guest/transparent.h"
#include "guest/watch.h"
#include "guest/workspace_disk.h"
#include "util/log.h"
#include "util/names.h"

namespace trybox::guest {
namespace {

using channel::Stream;

constexpr auto kRetryPause = std::chrono::milliseconds(100);
// Socket buffers between the Mux and the relay: big enough for a few full frames.
constexpr int kSocketBuffer = 4 << 20;

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
  int sessions = 0;
  Status egress = StartEgressListener([this] {
    MutexLock lock(mu_);
    return mux_;
  });
  if (!egress.ok()) LogError("init", "egress listener: " + egress.message());
  Status transparent = StartTransparentEgress([this] {
    MutexLock lock(mu_);
    return mux_;
  });
  if (!transparent.ok()) {
    LogError("init",
             "transparent egress (programs that ignore the proxy variables stay "
             "offline): " +
                 transparent.message());
  }
  // Opened once and never closed: its /dev node is gone once it is open (guest/port.h).
  UniqueFd port;
  for (bool reported = false;;) {
    auto opened = OpenPortAndHideIt(kControlPortName);
    if (opened.ok()) {
      port = std::move(opened).value();
      break;
    }
    // The console hears about a missing port once, not every retry.
    if (!reported) LogError("init", opened.status().message());
    reported = true;
    std::this_thread::sleep_for(kRetryPause);
  }
  for (;;) {
    WaitForHost(port.get());
    // The new host sends nothing before our hello, so whatever the port holds now is what
    // the last host sent and nobody read (closing the port used to drop it).
    DiscardPending(port.get());

    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      LogError("init", ErrnoError("socketpair").message());
      std::this_thread::sleep_for(kRetryPause);
      continue;
    }
    UniqueFd mux_end(sv[0]), relay_end(sv[1]);
    GrowBuffers(mux_end.get());
    GrowBuffers(relay_end.get());
    auto relay = PortRelay::Start(port.get(), std::move(relay_end));
    if (!relay.ok()) {
      LogError("init", relay.status().message());
      std::this_thread::sleep_for(kRetryPause);
      continue;
    }
    std::string why;
    {
      // Shared with egress connections, which open their streams on it.
      auto mux = std::make_shared<channel::Mux>(std::move(mux_end), channel::Role::kGuest,
                                                (*relay)->Writer());
      mux->OnOpen([this](std::shared_ptr<Stream> s, Json req) { Handle(s, req); });
      PortRelay* r = relay->get();
      mux->OnDeath([r](const std::string& reason) { r->Stop("mux: " + reason); });
      mux->Start();
      {
        MutexLock lock(mu_);
        mux_ = mux;
      }
      Json hello_event = {{"type", "hello"},
                          {"agent", "trybox-init"},
                          {"version", 1},
                          {"template", boot_.cmdline.template_boot},
                          {"transfer_disk", boot_.transfer_disk != nullptr},
                          {"workspace_disk", boot_.workspace_disk != nullptr},
                          {"ready", ready_.load()}};
      hello_event.update(BootIdField());
      Status hello = mux->SendControl(hello_event);
      if (!hello.ok()) (*relay)->Stop("hello: " + hello.message());
      why = (*relay)->Wait();
      // In-flight requests (and egress tunnels) see the connection die.
      mux->Shutdown();
    }
    {
      MutexLock lock(mu_);
      mux_ = nullptr;
    }
    relay->reset();
    ++sessions;
    if (boot_.cmdline.template_boot) {
      // The host saving a template waits for this line before it stops the machine, so
      // that every clone resumes here, in WaitForHost, with no session half torn down.
      LogInfo("init", "parked after session " + std::to_string(sessions) + ": " + why);
    } else {
      LogDebug("init", "session ended: " + why);
    }
    // A host that went away may come back at once (a restored clone's new host does);
    // anything else is a fault worth not spinning on.
    if (why.find("host disconnected") == std::string::npos)
      std::this_thread::sleep_for(kRetryPause);
  }
}

void Server::WaitForHost(int port_fd) {
  // Ask for SIGIO on this thread alone; main() blocks SIGIO in every thread, so it stays
  // pending until sigtimedwait takes it and none is lost between the check and the wait.
  struct f_owner_ex owner = {F_OWNER_TID, static_cast<pid_t>(::gettid())};
  bool async = ::fcntl(port_fd, F_SETOWN_EX, &owner) == 0 &&
               ::fcntl(port_fd, F_SETFL, ::fcntl(port_fd, F_GETFL) | O_ASYNC) == 0;
  sigset_t io;
  sigemptyset(&io);
  sigaddset(&io, SIGIO);
  const struct timespec tick = {0, async ? 500 * 1000 * 1000 : 20 * 1000 * 1000};
  while (!HostConnected(port_fd)) ::sigtimedwait(&io, nullptr, &tick);
  ::fcntl(port_fd, F_SETFL, ::fcntl(port_fd, F_GETFL) & ~O_ASYNC);
  // Drain one that raced the last check, so the next wait starts clean.
  const struct timespec zero = {0, 0};
  while (::sigtimedwait(&io, nullptr, &zero) == SIGIO) {
  }
}

Json Server::BootIdField() {
  MutexLock lock(mu_);
  if (boot_id_.empty()) return Json::object();
  return {{"boot_id", boot_id_}};
}

void Server::Identify(Stream& stream, const Json& request) {
  if (!boot_.cmdline.template_boot) {
    (void)stream.End(Fail("bad_request",
                          "this guest was booted cold; its identity came from the kernel "
                          "command line"));
    return;
  }
  auto req = ParseIdentityRequest(request);
  if (!req.ok()) {
    (void)stream.End(Fail("bad_request", req.status().message()));
    return;
  }
  MutexLock lock(mu_);
  if (ready_) {
    (void)stream.End(Fail("already_identified", "this clone already has its identity"));
    return;
  }
  Identity id{req->vm_id, req->hostname, req->machine_id, req->seed, req->time_ns};
  IdentityTimings timings;
  Status st = ApplyIdentity(id, &timings);
  if (!st.ok()) {
    (void)stream.End(Fail("identity_failed", st.message()));
    return;
  }
  // First read after the reseed: the kernel generates this clone's own boot_id now.
  auto boot_id = ReadBootId();
  if (!boot_id.ok()) {
    (void)stream.End(Fail("identity_failed", boot_id.status().message()));
    return;
  }
  boot_id_ = *boot_id;
  ready_ = true;
  (void)stream.End({{"ok", true},
                    {"boot_id", boot_id_},
                    {"hostname", req->hostname},
                    {"timings_us",
                     {{"reseed", timings.reseed_us},
                      {"clock", timings.clock_us},
                      {"names", timings.names_us}}}});
}

void Server::SetClock(Stream& stream, const Json& request) {
  auto req = ParseClockRequest(request);
  if (!req.ok()) {
    (void)stream.End(Fail("bad_request", req.status().message()));
    return;
  }
  auto offset = guest::SetClock(req->time_ns);
  if (!offset.ok()) {
    (void)stream.End(Fail("clock_failed", offset.status().message()));
    return;
  }
  (void)stream.End({{"ok", true}, {"offset_ns", *offset}});
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
    if (!ready_ &&
        (op == "exec" || op == "put" || op == "get" || op == "port" || op == "layer_capture" ||
         op == "watch" || op == "workspace_mount" || op == "workspace_freeze")) {
      const char* why = "this clone has not been given its identity yet (identity request)";
      // Each request's own result shape, so the host reads it like any other failure.
      (void)stream->End(
          op == "exec" ? Json{{"outcome", "error"}, {"error", "not_identified"}, {"message", why}}
                       : Fail("not_identified", why));
    } else if (op == "identity") {
      Identify(*stream, request);
    } else if (op == "clock") {
      SetClock(*stream, request);
    } else if (op == "exec") {
      ServeExec(reaper_, *stream, request);
    } else if (op == "put") {
      ServePut(reaper_, *stream, request, boot_.transfer_disk.get());
    } else if (op == "get") {
      ServeGet(reaper_, *stream, request, boot_.transfer_disk.get());
    } else if (op == "port") {
      ServePort(*stream, request);
    } else if (op == "watch") {
      ServeWatch(*stream, request);
    } else if (op == "layer_size") {
      ServeLayerSize(*stream, boot_.upper_dir ? boot_.upper_dir->get() : -1);
    } else if (op == "layer_capture") {
      ServeLayerCapture(*stream, request, boot_.upper_dir ? boot_.upper_dir->get() : -1,
                        boot_.transfer_disk.get());
    } else if (op == "workspace_mount") {
      ServeWorkspaceMount(*stream, request, boot_.workspace_disk.get());
    } else if (op == "workspace_freeze") {
      ServeWorkspaceFreeze(*stream, boot_.workspace_disk.get());
    } else if (op == "ping") {
      Json reply = {{"ok", true}, {"uptime_ms", UptimeMs()}, {"ready", ready_.load()}};
      reply.update(BootIdField());
      (void)stream->End(reply);
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
  // The END is in the port already: the Mux writes to it directly (guest/port.h).
  UnmountAll();
  PowerOff();
}

}  // namespace trybox::guest
