#include "daemon/guest_ops.h"

#include <atomic>
#include <thread>

namespace trybox::daemon {
namespace {

using Kind = channel::Stream::Message::Kind;

// The reason of a RESET body (the Mux guarantees a string).
std::string ResetReason(const Json& body) {
  if (body.is_object() && body.contains("reason") && body["reason"].is_string()) {
    return body["reason"].get<std::string>();
  }
  return "no reason given";
}

Status GuestAborted(const Json& body) {
  return Unavailable("the guest aborted the request: " + ResetReason(body));
}

ExecResult BadReply(const std::string& what) {
  ExecResult r;
  r.outcome = ExecOutcome::kError;
  r.error = "bad_guest_reply";
  r.message = "the guest's reply was malformed: " + what;
  return r;
}

// A guest EVENT on an exec stream: only {"type":"started","pid":N} is known. Unknown types
// are ignored (a newer guest); a malformed one is an error.
Result<std::optional<Json>> ExecEvent(const Json& body) {
  if (!body.contains("type") || !body["type"].is_string()) {
    return InvalidArgument("an exec event without a string 'type'");
  }
  if (body["type"] != "started") return std::optional<Json>();
  auto pid = IntIn(body.value("pid", Json()), 1, INT32_MAX);
  if (!pid) return InvalidArgument("a 'started' event without an integer 'pid'");
  return std::optional<Json>(Json{{"type", "started"}, {"pid", *pid}});
}

// The client side of an exec: forwards its input (when `forward`), and turns its reset or
// loss into the command's cancellation. Returns when the exec is over (the stream is then
// Interrupt()ed), the client cancelled, or the client's input ended.
void WatchClient(channel::Stream& client, channel::Stream& guest, bool forward,
                 std::atomic<bool>* cancelled) {
  bool forwarding = forward;
  for (;;) {
    auto m = client.Next();
    if (!m.ok()) {
      // Interrupted: the exec is over. Anything else: the client is gone.
      if (m.status().code() != Code::kCancelled) {
        *cancelled = true;
        (void)guest.Reset("the client cancelled the request");
      }
      return;
    }
    if (m->kind == Kind::kReset || m->kind == Kind::kEnd) {
      *cancelled = true;
      (void)guest.Reset("the client cancelled the request");
      return;
    }
    if (m->kind == Kind::kData && forwarding) {
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

Json GuestFileError(const Status& st, const std::string& kind) { return ErrorReply(st, kind); }

}  // namespace

Status GuestGone(const GuestChannel& guest, const Status& fallback) {
  if (guest.alive()) return fallback;
  std::string why = guest.death_reason();
  return Unavailable("the guest is gone: " + (why.empty() ? fallback.message() : why));
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

Json GuestExecRequest(const ExecSpec& spec) {
  Json req = {{"op", "exec"},
              {"argv", spec.argv},
              {"env", spec.env},
              {"cwd", spec.cwd},
              {"timeout_ms", spec.timeout_ms},
              {"stdin", spec.stdin}};
  if (!spec.user.empty()) req["user"] = spec.user;
  if (spec.privileged) req["privileged"] = true;
  return req;
}

ExecResult RunExec(GuestChannel& guest, const ExecSpec& spec, const ExecIo& io) {
  auto opened = guest.Open(GuestExecRequest(spec));
  if (!opened.ok()) {
    ExecResult r;
    r.outcome = ExecOutcome::kChannelLost;
    r.message = GuestGone(guest, opened.status()).message();
    return r;
  }
  std::shared_ptr<channel::Stream> s = *opened;
  if (io.on_open) io.on_open(s);
  std::atomic<bool> cancelled{false};
  std::thread watch;
  if (io.client) {
    watch = std::thread([&] { WatchClient(*io.client, *s, spec.stdin, &cancelled); });
  }

  std::optional<ExecResult> result;
  Status failure;
  int64_t bytes[3] = {0, 0, 0};
  bool client_gone = false;
  while (!result && failure.ok()) {
    auto m = s->Next();
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
        auto ev = ExecEvent(m->body);
        if (!ev.ok()) {
          (void)s->Reset("malformed event");
          result = BadReply(ev.status().message());
        } else if (*ev && io.client && !client_gone) {
          (void)io.client->SendEvent(**ev);
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
    if (client_gone || cancelled) {
      r.outcome = ExecOutcome::kCancelled;
      r.message = client_gone ? "the client disconnected" : "the client cancelled the request";
    } else {
      // The channel closed before an exit event: that is reported, never an exit code.
      r.outcome = ExecOutcome::kChannelLost;
      r.message = GuestGone(guest, failure).message();
    }
    result = r;
  }
  result->stdout_bytes = bytes[channel::kChanOut];
  result->stderr_bytes = bytes[channel::kChanErr];
  return *result;
}

// ---- files ----

Status FileEndStatus(const Json& end, std::string* kind, int64_t* bytes) {
  if (!end.is_object() || !end.contains("ok") || !end["ok"].is_boolean()) {
    return Internal("the guest's reply was malformed: no boolean 'ok'");
  }
  if (end["ok"].get<bool>()) {
    if (bytes) *bytes = IntIn(end.value("bytes", Json(0)), 0, INT64_MAX).value_or(0);
    return Status::Ok();
  }
  if (!end.contains("error") || !end["error"].is_string()) {
    return Internal("the guest's reply was malformed: no string 'error'");
  }
  std::string k = end["error"];
  std::string message = k;
  if (end.contains("message") && end["message"].is_string()) message = end["message"];
  if (kind) *kind = k;
  Code code = Code::kInternal;
  if (k == "not_found") code = Code::kNotFound;
  if (k == "no_space") code = Code::kResourceExhausted;
  if (k == "not_a_directory" || k == "bad_request" || k == "unsupported") {
    code = Code::kInvalidArgument;
  }
  if (k == "not_identified") code = Code::kFailedPrecondition;
  return Status(code, message);
}

Result<Json> AwaitEnd(channel::Stream& s) {
  for (;;) {
    ASSIGN_OR_RETURN(auto m, s.Next());
    if (m.kind == Kind::kEnd) return m.body;
    if (m.kind == Kind::kReset) return GuestAborted(m.body);
  }
}

Status WriteFile(GuestChannel& guest, const std::string& path, std::string_view data, int mode,
                 bool mkdirs) {
  auto s = guest.Open(
      {{"op", "put"}, {"path", path}, {"kind", "file"}, {"mode", mode}, {"mkdirs", mkdirs}});
  if (!s.ok()) return GuestGone(guest, s.status());
  Status st = (*s)->Write(channel::kChanIn, data);
  if (st.ok()) st = (*s)->CloseWrite(channel::kChanIn);
  if (!st.ok()) {
    (void)(*s)->Reset("the host could not send the file");
    return GuestGone(guest, st);
  }
  auto end = AwaitEnd(**s);
  if (!end.ok()) return GuestGone(guest, end.status());
  return FileEndStatus(*end);
}

Result<FileRead> ReadFile(GuestChannel& guest, const std::string& path, int64_t max_bytes) {
  auto s = guest.Open({{"op", "get"}, {"path", path}});
  if (!s.ok()) return GuestGone(guest, s.status());
  FileRead out;
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) return GuestGone(guest, m.status());
    switch (m->kind) {
      case Kind::kEvent: {
        const Json& b = m->body;
        if (!b.contains("type") || !b["type"].is_string() || b["type"] != "meta") break;
        if (!b.contains("kind") || !b["kind"].is_string()) {
          (void)(*s)->Reset("malformed meta");
          return Internal("the guest's reply was malformed: a meta event without a kind");
        }
        std::string kind = b["kind"];
        if (kind != "file") {
          (void)(*s)->Reset("not a file");
          return FailedPrecondition(path + " is a " + (kind == "tar" ? "directory" : kind) +
                                    ", not a regular file");
        }
        out.size = IntIn(b.value("size", Json(-1)), 0, INT64_MAX).value_or(-1);
        break;
      }
      case Kind::kData:
        out.data += m->data;
        if (static_cast<int64_t>(out.data.size()) > max_bytes) {
          out.truncated = true;
          out.data.resize(static_cast<size_t>(max_bytes));
          (void)(*s)->Reset("read cap reached");
          return out;
        }
        break;
      case Kind::kEof:
        break;
      case Kind::kEnd:
        RETURN_IF_ERROR(FileEndStatus(m->body));
        return out;
      case Kind::kReset:
        return GuestGone(guest, GuestAborted(m->body));
    }
  }
}

Status PutTar(
    GuestChannel& guest, const std::string& path,
    const std::function<Status(const std::function<Status(std::string_view)>&)>& write_tar) {
  auto s = guest.Open({{"op", "put"}, {"path", path}, {"kind", "tar"}, {"mode", 0755}});
  if (!s.ok()) return GuestGone(guest, s.status());
  Status sent = write_tar([&](std::string_view d) { return (*s)->Write(channel::kChanIn, d); });
  if (sent.ok()) sent = (*s)->CloseWrite(channel::kChanIn);
  if (!sent.ok()) {
    // After a local reset no END will come: fail now, never wait for one.
    (void)(*s)->Reset("the host could not send the tree");
    return GuestGone(guest, sent);
  }
  auto end = AwaitEnd(**s);
  if (!end.ok()) return GuestGone(guest, end.status());
  Status st = FileEndStatus(*end);
  return st.ok() ? st : GuestGone(guest, st);
}

Result<std::unique_ptr<TarReader>> TarReader::Open(GuestChannel& guest, const std::string& path,
                                                   const std::vector<std::string>& excludes) {
  auto s = guest.Open({{"op", "get"}, {"path", path}, {"exclude", excludes}});
  if (!s.ok()) return GuestGone(guest, s.status());
  return std::unique_ptr<TarReader>(new TarReader(guest, *s));
}

Result<std::string> TarReader::Next() {
  for (;;) {
    if (eof_ || end_) return std::string();
    auto m = s_->Next();
    if (!m.ok()) return GuestGone(guest_, m.status());
    switch (m->kind) {
      case Kind::kData:
        if (m->channel == channel::kChanOut) return std::move(m->data);
        break;
      case Kind::kEof:
        eof_ = true;
        return std::string();
      case Kind::kEvent:
        break;
      case Kind::kEnd: {
        end_ = m->body;
        RETURN_IF_ERROR(FileEndStatus(m->body));
        return Internal("the guest ended the transfer before its data");
      }
      case Kind::kReset:
        return GuestGone(guest_,
                         Unavailable("the guest aborted the transfer: " + ResetReason(m->body)));
    }
  }
}

Result<std::string> TarReader::Finish() {
  if (!end_) {
    auto end = AwaitEnd(*s_);
    if (!end.ok()) return GuestGone(guest_, end.status());
    end_ = *end;
  }
  RETURN_IF_ERROR(FileEndStatus(*end_));
  const Json& w = end_->value("warnings", Json());
  return w.is_string() ? w.get<std::string>() : std::string();
}

void TarReader::Abort(const std::string& why) { (void)s_->Reset(why); }

// ---- the put and get verbs ----

void DrainInput(channel::Stream& client) {
  for (;;) {
    auto m = client.Next();
    if (!m.ok() || m->kind == Kind::kEof || m->kind == Kind::kReset || m->kind == Kind::kEnd) {
      return;
    }
  }
}

namespace {

// Ends a put/get client stream: the guest's END in the daemon's shape, or why none came.
void FinishRelay(GuestChannel& guest, channel::Stream& client, const std::optional<Json>& end,
                 const Status& failure) {
  if (!end) {
    (void)client.End(ErrorReply(GuestGone(guest, failure)));
    return;
  }
  std::string kind;
  int64_t bytes = 0;
  Status st = FileEndStatus(*end, &kind, &bytes);
  (void)client.End(st.ok() ? Json{{"ok", true}, {"bytes", bytes}} : GuestFileError(st, kind));
}

// A get's meta EVENT as the daemon forwards it: only known, well-typed fields.
Result<Json> MetaEvent(const Json& b) {
  if (!b.contains("type") || !b["type"].is_string()) {
    return InvalidArgument("an event without a string 'type'");
  }
  if (b["type"] != "meta") return Json();
  Json out = {{"type", "meta"}};
  if (!b.contains("kind") || !b["kind"].is_string()) {
    return InvalidArgument("a meta event without a string 'kind'");
  }
  out["kind"] = b["kind"];
  for (const char* k : {"mode", "mtime_ns", "size"}) {
    if (!b.contains(k)) continue;
    auto v = IntIn(b[k], k == std::string("mtime_ns") ? INT64_MIN : 0, INT64_MAX);
    if (!v) return InvalidArgument(std::string("'") + k + "' is not an integer");
    out[k] = *v;
  }
  return out;
}

}  // namespace

void RelayPut(GuestChannel& guest, const Json& greq, channel::Stream& client) {
  auto s = guest.Open(greq);
  if (!s.ok()) {
    DrainInput(client);
    (void)client.End(ErrorReply(GuestGone(guest, s.status())));
    return;
  }
  // The upload is pumped on its own thread: the guest may end early (no space, a bad path)
  // while the client still sends.
  std::thread pump([&] {
    bool forwarding = true;
    for (;;) {
      auto m = client.Next();
      if (!m.ok()) break;
      if (m->kind == Kind::kData && forwarding) {
        if (!(*s)->Write(channel::kChanIn, m->data).ok()) forwarding = false;
      } else if (m->kind == Kind::kEof) {
        if (forwarding) (void)(*s)->CloseWrite(channel::kChanIn);
        break;
      } else if (m->kind == Kind::kReset || m->kind == Kind::kEnd) {
        (void)(*s)->Reset("the client cancelled the request");
        break;
      }
    }
  });
  std::optional<Json> end;
  Status failure;
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) {
      failure = m.status();
      break;
    }
    if (m->kind == Kind::kEnd) {
      end = m->body;
      break;
    }
    if (m->kind == Kind::kReset) {
      failure = GuestAborted(m->body);
      break;
    }
  }
  if (!end) (void)(*s)->Reset("put failed");
  pump.join();
  FinishRelay(guest, client, end, failure);
}

void RelayGet(GuestChannel& guest, const Json& greq, channel::Stream& client) {
  auto s = guest.Open(greq);
  if (!s.ok()) {
    (void)client.End(ErrorReply(GuestGone(guest, s.status())));
    return;
  }
  std::optional<Json> end;
  Status failure;
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) {
      failure = m.status();
      break;
    }
    bool stop = false;
    switch (m->kind) {
      case Kind::kData:
        if (!client
                 .Write(m->channel == channel::kChanOut ? channel::kChanOut : channel::kChanErr,
                        m->data)
                 .ok()) {
          (void)s->get()->Reset("the client disconnected");
          failure = Unavailable("the client disconnected");
          stop = true;
        }
        break;
      case Kind::kEof:
        (void)client.CloseWrite(m->channel == channel::kChanOut ? channel::kChanOut
                                                                : channel::kChanErr);
        break;
      case Kind::kEvent: {
        auto ev = MetaEvent(m->body);
        if (!ev.ok()) {
          (void)s->get()->Reset("malformed event");
          failure = Internal("the guest's reply was malformed: " + ev.status().message());
          stop = true;
        } else if (!ev->is_null()) {
          (void)client.SendEvent(*ev);
        }
        break;
      }
      case Kind::kEnd:
        end = m->body;
        stop = true;
        break;
      case Kind::kReset:
        failure = GuestAborted(m->body);
        stop = true;
        break;
    }
    if (stop) break;
  }
  FinishRelay(guest, client, end, failure);
}

}  // namespace trybox::daemon
