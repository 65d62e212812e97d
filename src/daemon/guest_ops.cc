#include "daemon/guest_ops.h"

#include <atomic>
#include <thread>

namespace trybox::daemon {
namespace {

using Kind = channel::Stream::Message::Kind;

ExecResult BadReply(const std::string& what) {
  ExecResult r;
  r.outcome = ExecOutcome::kError;
  r.error = "bad_guest_reply";
  r.message = "the guest's reply was malformed: " + what;
  return r;
}

// The client side of an exec: forwards its input (when `forward`) and, for a terminal, its
// resize events, and turns its reset or loss into the command's cancellation. A client
// event that is not a well-formed resize of a terminal exec cancels the exec too: the
// client broke the protocol (`*why` says how). Returns when the exec is over (the stream is
// then Interrupt()ed) or the client cancelled.
void WatchClient(channel::Stream& client, channel::Stream& guest, bool forward, bool tty,
                 std::atomic<bool>* cancelled, std::string* why) {
  bool forwarding = forward;
  auto cancel = [&](const std::string& reason) {
    *why = reason;
    *cancelled = true;
    (void)guest.Reset(reason);
  };
  for (;;) {
    auto m = client.Next();
    if (!m.ok()) {
      // Interrupted: the exec is over. Anything else: the client is gone.
      if (m.status().code() != Code::kCancelled) cancel("the client cancelled the request");
      return;
    }
    if (m->kind == Kind::kReset || m->kind == Kind::kEnd) {
      cancel("the client cancelled the request");
      return;
    }
    if (m->kind == Kind::kEvent) {
      auto size = ParseResizeEvent(m->body);
      if (!size.ok() || !tty) {
        cancel("the client sent a bad event: " +
               (size.ok() ? std::string("a resize of an exec without a terminal")
                          : size.status().message()));
        return;
      }
      // Rebuilt from the typed value: nothing else of the client's object reaches the guest.
      (void)guest.SendEvent({{"type", "resize"}, {"rows", size->rows}, {"cols", size->cols}});
    } else if (m->kind == Kind::kData && forwarding) {
      if (!guest.Write(channel::kChanIn, m->data).ok()) forwarding = false;
    } else if (m->kind == Kind::kEof && forwarding) {
      (void)guest.CloseWrite(channel::kChanIn);
      forwarding = false;
    }
  }
}

void Capture(std::string* capture, std::string_view data) {
  if (!capture) return;
  capture->append(data);
  if (capture->size() > 2 * kCaptureBytes) capture->erase(0, capture->size() - kCaptureBytes);
}

}  // namespace

std::string ResetReason(const Json& body) {
  if (body.is_object() && body.contains("reason") && body["reason"].is_string()) {
    return body["reason"].get<std::string>();
  }
  return "no reason given";
}

Status GuestAborted(const Json& body) {
  return Unavailable("the guest aborted the request: " + ResetReason(body));
}

Status GuestGone(const GuestChannel& guest, const Status& fallback) {
  if (guest.alive() && guest.unresponsive()) {
    return Unavailable("the guest stopped answering (guest_unresponsive): " + fallback.message());
  }
  if (guest.alive()) return fallback;
  std::string why = guest.death_reason();
  return Unavailable("the guest is gone: " + (why.empty() ? fallback.message() : why));
}

Json TransferErrorReply(const GuestChannel& guest, const Status& st, const std::string& kind) {
  if (kind != "no_space") {
    if (std::string full = guest.host_no_space(); !full.empty()) {
      return ErrorReply(ResourceExhausted("no space: " + full + " (" + st.message() + ")"),
                        "no_space");
    }
  }
  return ErrorReply(WithHostDiskCause(guest, st), kind);
}

const char* ExecOutcomeName(ExecOutcome o) {
  switch (o) {
    case ExecOutcome::kExited:
      return "exited";
    case ExecOutcome::kSignaled:
      return "signaled";
    case ExecOutcome::kTimedOut:
      return "timed_out";
    case ExecOutcome::kError:
      return "error";
    case ExecOutcome::kChannelLost:
      return "channel_lost";
    case ExecOutcome::kCancelled:
      return "cancelled";
    case ExecOutcome::kGuestUnresponsive:
      return "guest_unresponsive";
    case ExecOutcome::kNotStarted:
      return "not_started";
  }
  return "error";
}

Json ExecResult::ToJson() const {
  Json j = {{"outcome", ExecOutcomeName(outcome)}};
  if (exit_code) j["exit_code"] = *exit_code;
  if (signal) j["signal"] = *signal;
  if (timeout_ms) j["timeout_ms"] = *timeout_ms;
  if (duration_ms) j["duration_ms"] = *duration_ms;
  if (!error.empty()) j["error"] = error;
  if (!message.empty()) j["message"] = message;
  return j;
}

ExecResult ExecResultFromGuest(const Json& end) {
  if (!end.is_object() || !end.contains("outcome") || !end["outcome"].is_string()) {
    return BadReply("the exec END has no string 'outcome'");
  }
  const std::string outcome = end["outcome"];
  ExecResult r;
  auto int_field = [&](const char* key, int64_t lo, int64_t hi) -> std::optional<int64_t> {
    if (!end.contains(key)) return std::nullopt;
    return IntIn(end[key], lo, hi);
  };
  if (end.contains("duration_ms")) {
    r.duration_ms = int_field("duration_ms", 0, INT64_MAX);
    if (!r.duration_ms) return BadReply("'duration_ms' is not a non-negative integer");
  }
  if (outcome == "exited") {
    auto code = int_field("exit_code", 0, 255);
    if (!code) return BadReply("an 'exited' END without an integer 'exit_code' from 0 to 255");
    r.outcome = ExecOutcome::kExited;
    r.exit_code = static_cast<int>(*code);
  } else if (outcome == "signaled") {
    auto sig = int_field("signal", 1, 64);
    if (!sig) return BadReply("a 'signaled' END without an integer 'signal' from 1 to 64");
    r.outcome = ExecOutcome::kSignaled;
    r.signal = static_cast<int>(*sig);
  } else if (outcome == "timed_out") {
    auto t = int_field("timeout_ms", 0, INT64_MAX);
    if (!t) return BadReply("a 'timed_out' END without an integer 'timeout_ms'");
    r.outcome = ExecOutcome::kTimedOut;
    r.timeout_ms = *t;
  } else if (outcome == "error") {
    if (!end.contains("error") || !end["error"].is_string()) {
      return BadReply("an 'error' END without a string 'error'");
    }
    r.outcome = ExecOutcome::kError;
    r.error = end["error"];
  } else {
    return BadReply("unknown outcome '" + outcome.substr(0, 40) + "'");
  }
  if (end.contains("message")) {
    if (!end["message"].is_string()) return BadReply("'message' is not a string");
    r.message = end["message"];
  }
  return r;
}

Result<std::optional<Json>> GuestExecEvent(const Json& body) {
  if (!body.is_object() || !body.contains("type") || !body["type"].is_string()) {
    return InvalidArgument("an exec event without a string 'type'");
  }
  if (body["type"] != "started") return std::optional<Json>();
  auto pid = IntIn(body.value("pid", Json()), 1, INT32_MAX);
  if (!pid) return InvalidArgument("a 'started' event without an integer 'pid'");
  return std::optional<Json>(Json{{"type", "started"}, {"pid", *pid}});
}

Json GuestExecRequest(const ExecSpec& spec) {
  Json req = {{"op", "exec"},
              {"argv", spec.argv},
              {"env", spec.env},
              {"timeout_ms", spec.timeout_ms},
              {"stdin", spec.stdin}};
  if (!spec.cwd.empty()) req["cwd"] = spec.cwd;
  if (!spec.user.empty()) req["user"] = spec.user;
  if (spec.privileged) req["privileged"] = true;
  if (spec.tty) req["tty"] = {{"rows", spec.tty->rows}, {"cols", spec.tty->cols}};
  return req;
}

ExecResult RunExec(GuestChannel& guest, const ExecSpec& spec, const ExecIo& io) {
  auto opened = guest.Open(GuestExecRequest(spec));
  if (!opened.ok()) {
    ExecResult r;
    r.outcome = ExecOutcome::kNotStarted;
    r.message = GuestGone(guest, opened.status()).message();
    return r;
  }
  // The host's own deadline: one wake-up at most, and only if the guest has not ended the
  // command by then.
  channel::Stream::Deadline deadline;
  if (spec.timeout_ms > 0) {
    deadline = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(spec.timeout_ms + spec.host_grace_ms);
  }
  bool started = false;
  std::shared_ptr<channel::Stream> s = *opened;
  if (io.on_open) io.on_open(s);
  std::atomic<bool> cancelled{false};
  std::string cancel_reason;  // written by the watcher before `cancelled`, read after its join
  std::thread watch;
  if (io.client) {
    watch = std::thread([&] {
      WatchClient(*io.client, *s, spec.stdin || spec.tty.has_value(), spec.tty.has_value(),
                  &cancelled, &cancel_reason);
    });
  }

  std::optional<ExecResult> result;
  Status failure;
  int64_t bytes[3] = {0, 0, 0};
  bool client_gone = false;
  while (!result && failure.ok()) {
    auto m = s->Next(deadline);
    if (!m.ok()) {
      failure = m.status();
      break;
    }
    switch (m->kind) {
      case Kind::kData:
        if (m->channel != channel::kChanOut && m->channel != channel::kChanErr) {
          (void)s->Reset("output on an input channel");
          result = BadReply("output on channel " + std::to_string(m->channel));
          break;
        }
        bytes[m->channel] += static_cast<int64_t>(m->data.size());
        Capture(io.capture, m->data);
        if (io.sink) io.sink->Append(m->channel, m->data);
        if (io.client && !client_gone && !io.client->Write(m->channel, m->data).ok()) {
          // The caller went away: stop the command rather than run it unobserved.
          client_gone = true;
          (void)s->Reset("the client disconnected");
        }
        break;
      case Kind::kEof:
        if (io.client && !client_gone) (void)io.client->CloseWrite(m->channel);
        break;
      case Kind::kEvent: {
        auto ev = GuestExecEvent(m->body);
        if (!ev.ok()) {
          (void)s->Reset("malformed event");
          result = BadReply(ev.status().message());
        } else if (*ev) {
          started = true;
          if (io.on_started) io.on_started();
          if (io.client && !client_gone) (void)io.client->SendEvent(**ev);
        }
        break;
      }
      case Kind::kEnd:
        result = ExecResultFromGuest(m->body);
        break;
      case Kind::kReset:
        failure = GuestAborted(m->body);
        break;
    }
  }
  if (io.client) {
    io.client->Interrupt();
    watch.join();
  }
  if (!result) {
    ExecResult r;
    const bool deadline_passed = failure.code() == Code::kDeadlineExceeded;
    if (deadline_passed || (failure.code() == Code::kCancelled && guest.unresponsive())) {
      r.outcome = ExecOutcome::kGuestUnresponsive;
      r.message = deadline_passed
                      ? "the guest did not end the command within its timeout of " +
                            std::to_string(spec.timeout_ms) + " ms plus the host's grace of " +
                            std::to_string(spec.host_grace_ms) + " ms"
                      : "the guest stopped answering the host's heartbeat";
      // The guest kills the command if it ever reads this. On a thread of its own: a
      // stopped guest reads nothing, and the write may wait until it is continued or killed.
      std::thread([s] {
        (void)s->Reset("the host gave up on this exec: guest unresponsive");
      }).detach();
    } else if (client_gone || cancelled || (io.cancelled && *io.cancelled)) {
      r.outcome = ExecOutcome::kCancelled;
      r.message = client_gone ? "the client disconnected"
                  : cancelled ? cancel_reason
                              : "stopped: the run was cancelled or its agent ended";
    } else {
      // The channel closed before an exit event: that is reported, never an exit code; and
      // before the guest said the command started, it is not recorded as one that ran.
      r.outcome = started ? ExecOutcome::kChannelLost : ExecOutcome::kNotStarted;
      r.message = GuestGone(guest, failure).message();
    }
    result = r;
  }
  result->stdout_bytes = bytes[channel::kChanOut];
  result->stderr_bytes = bytes[channel::kChanErr];
  return *result;
}

}  // namespace trybox::daemon
