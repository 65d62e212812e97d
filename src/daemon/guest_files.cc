#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <thread>

#include "daemon/guest_disk.h"
#include "daemon/guest_ops.h"

namespace trybox::daemon {
namespace {

using Kind = channel::Stream::Message::Kind;

// How much of a transfer through the disk is handed on at a time.
constexpr size_t kDiskChunk = 1 << 20;
// A put over the channel whose guest takes none of its bytes for this long is ended
// (docs/reliability.md, "A full disk"): trybox-init may answer heartbeats while the
// writer of one put is stuck, and a user's copy must not wait for ever.
constexpr std::chrono::seconds kPutStallLimit{60};

}  // namespace

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
  if (k == "connect_failed" || k == "io") code = Code::kUnavailable;
  return Status(code, message);
}

Result<Json> AwaitEnd(channel::Stream& s) {
  for (;;) {
    ASSIGN_OR_RETURN(auto m, s.Next());
    if (m.kind == Kind::kEnd) return m.body;
    if (m.kind == Kind::kReset) return GuestAborted(m.body);
  }
}

Status GuestRefusal(const Json& end, const std::string& what) {
  const std::string error = end.is_object() ? end.value("error", "") : "";
  const std::string message = end.is_object() ? end.value("message", "") : "";
  const std::string text = "the guest could not " + what + ": " +
                           (error.empty() ? "no reason given" : error) +
                           (message.empty() ? "" : ": " + message);
  return error == "no_space" ? ResourceExhausted(text) : FailedPrecondition(text);
}

Status WithHostDiskCause(const GuestChannel& guest, const Status& st) {
  if (st.ok()) return st;
  const std::string& m = st.message();
  std::string lower = m;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  bool io = false;
  // The guest's words vary in case ("/root: read-only file system" from a put).
  for (const char* sign : {"input/output error", "read-only file system", "no space left"}) {
    io |= lower.find(sign) != std::string::npos;
  }
  if (!io) return st;
  std::string cause = guest.host_no_space();
  if (cause.empty()) cause = guest.host_disk_damage();
  if (cause.empty()) return st;
  return Status(st.code(), m + " (the host's disk caused it: " + cause + ")");
}

Result<Json> AwaitGuestOk(GuestChannel& guest, channel::Stream& stream, const std::string& what) {
  auto end = AwaitEnd(stream);
  if (!end.ok()) return GuestGone(guest, end.status().Annotate(what));
  if (!end->is_object() || !end->value("ok", false)) {
    return WithHostDiskCause(guest, GuestRefusal(*end, what));
  }
  return *end;
}

Result<Json> GuestCall(GuestChannel& guest, const Json& request, const std::string& what) {
  auto stream = guest.Open(request);
  if (!stream.ok()) return GuestGone(guest, stream.status().Annotate(what));
  return AwaitGuestOk(guest, **stream, what);
}

Status WriteFile(GuestChannel& guest, const std::string& path, std::string_view data, int mode,
                 bool mkdirs) {
  auto s = guest.Open(
      {{"op", "put"}, {"path", path}, {"kind", "file"}, {"mode", mode}, {"mkdirs", mkdirs}});
  if (!s.ok()) return GuestGone(guest, s.status());
  (*s)->SetWriteStallLimit(kPutStallLimit);
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

Status PutTar(GuestChannel& guest, const std::string& path, const ContentWriter& write_tar,
              bool* via_disk) {
  const Json greq = {{"op", "put"}, {"path", path}, {"kind", "tar"}, {"mode", 0755}};
  ASSIGN_OR_RETURN(std::optional<Json> disk_end, PutViaDisk(guest, greq, write_tar));
  if (via_disk) *via_disk = disk_end.has_value();
  if (disk_end) {
    Status st = FileEndStatus(*disk_end);
    return st.ok() ? st : GuestGone(guest, st);
  }
  auto s = guest.Open(greq);
  if (!s.ok()) return GuestGone(guest, s.status());
  (*s)->SetWriteStallLimit(kPutStallLimit);
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
                                                   const std::vector<std::string>& excludes,
                                                   uint64_t max_disk_bytes) {
  const Json greq = {{"op", "get"}, {"path", path}, {"exclude", excludes}};
  ASSIGN_OR_RETURN(auto content, GetViaDisk(guest, greq, max_disk_bytes));
  if (content) {
    Status st = FileEndStatus(content->end());
    if (!st.ok()) return GuestGone(guest, st);
    return std::unique_ptr<TarReader>(new TarReader(guest, std::move(content)));
  }
  auto s = guest.Open(greq);
  if (!s.ok()) return GuestGone(guest, s.status());
  return std::unique_ptr<TarReader>(new TarReader(guest, *s));
}

TarReader::TarReader(GuestChannel& guest, std::shared_ptr<channel::Stream> s)
    : guest_(guest), s_(std::move(s)) {}

TarReader::TarReader(GuestChannel& guest, std::unique_ptr<DiskContent> disk)
    : guest_(guest), disk_(std::move(disk)), end_(disk_->end()) {}

TarReader::~TarReader() = default;

Result<std::string> TarReader::Next() {
  if (disk_) return disk_->Read(kDiskChunk);
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
  if (!end_ && s_) {
    auto end = AwaitEnd(*s_);
    if (!end.ok()) return GuestGone(guest_, end.status());
    end_ = *end;
  }
  RETURN_IF_ERROR(FileEndStatus(*end_));
  const Json& w = end_->value("warnings", Json());
  return w.is_string() ? w.get<std::string>() : std::string();
}

void TarReader::Abort(const std::string& why) {
  if (s_) (void)s_->Reset(why);
  disk_.reset();  // the guest is done; the disk is emptied
}

// ---- the put and get verbs ----

void DrainInput(channel::Stream& client) {
  for (;;) {
    auto m = client.Next();
    if (!m.ok() || m->kind == Kind::kEof || m->kind == Kind::kReset || m->kind == Kind::kEnd) {
      return;
    }
  }
}

// Ends a put/get client stream: the guest's END in the daemon's shape, or why none came.
void FinishRelay(GuestChannel& guest, channel::Stream& client, const std::optional<Json>& end,
                 const Status& failure, bool via_disk) {
  if (!end) {
    (void)client.End(TransferErrorReply(guest, GuestGone(guest, failure), ""));
    return;
  }
  std::string kind;
  int64_t bytes = 0;
  Status st = FileEndStatus(*end, &kind, &bytes);
  (void)client.End(
      st.ok() ? Json{{"ok", true}, {"bytes", bytes}, {"via", via_disk ? "disk" : "channel"}}
              : TransferErrorReply(guest, st, kind));
}

Result<Json> GuestMetaEvent(const Json& b) {
  if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) {
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

void RelayPut(GuestChannel& guest, const Json& greq, channel::Stream& client) {
  if (!guest.transfer_disk()) return RelayPutChannel(guest, greq, client, nullptr);
  // The upload's first kChannelMaxBytes are held here: one that ends within them is small,
  // and takes the channel (guest_disk.h).
  Spooled head;
  while (!head.upload_ended && head.tail.size() <= kChannelMaxBytes) {
    auto m = client.Next();
    if (!m.ok() || m->kind == Kind::kReset || m->kind == Kind::kEnd) return;  // gone
    if (m->kind == Kind::kEof) head.upload_ended = true;
    if (m->kind == Kind::kData) head.tail += m->data;
  }
  const bool small = head.upload_ended && head.tail.size() <= kChannelMaxBytes;
  if (!small && RelayPutViaDisk(guest, greq, client, head)) return;
  RelayPutChannel(guest, greq, client, &head);
}

void RelayPutChannel(GuestChannel& guest, const Json& greq, channel::Stream& client,
                     const Spooled* spooled) {
  auto s = guest.Open(greq);
  if (!s.ok()) {
    if (!spooled || !spooled->upload_ended) DrainInput(client);
    (void)client.End(ErrorReply(GuestGone(guest, s.status())));
    return;
  }
  (*s)->SetWriteStallLimit(kPutStallLimit);
  // Why the pump stopped sending, when the guest stopped taking the bytes.
  std::mutex stall_mu;
  Status stalled;
  // The upload is pumped on its own thread: the guest may end early (no space, a bad path)
  // while the client still sends.
  std::thread pump([&] {
    bool forwarding = true;
    auto send = [&](std::string_view d) {
      Status st = (*s)->Write(channel::kChanIn, d);
      if (st.code() == Code::kDeadlineExceeded) {
        {
          std::lock_guard<std::mutex> lock(stall_mu);
          stalled = st;
        }
        (void)(*s)->Reset("the host stopped the put: " + st.message());
      }
      return st.ok();
    };
    if (spooled) {
      // What a transfer through the disk had already taken from the client goes first.
      std::string buf(kDiskChunk, '\0');
      for (uint64_t at = 0; at < spooled->bytes && forwarding;) {
        ssize_t n =
            ::pread(spooled->fd, buf.data(),
                    static_cast<size_t>(std::min<uint64_t>(kDiskChunk, spooled->bytes - at)),
                    static_cast<off_t>(at));
        if (n <= 0) {
          if (n < 0 && errno == EINTR) continue;
          (void)(*s)->Reset("the host lost part of the upload");
          forwarding = false;
          break;
        }
        if (!send(std::string_view(buf.data(), static_cast<size_t>(n)))) forwarding = false;
        at += static_cast<uint64_t>(n);
      }
      if (forwarding && !spooled->tail.empty()) {
        forwarding = send(spooled->tail);
      }
      if (spooled->upload_ended) {
        if (forwarding) (void)(*s)->CloseWrite(channel::kChanIn);
        return;
      }
    }
    for (;;) {
      auto m = client.Next();
      if (!m.ok()) break;
      if (m->kind == Kind::kData && forwarding) {
        if (!send(m->data)) forwarding = false;
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
  if (!end && !stalled.ok()) {
    failure =
        Status(Code::kDeadlineExceeded, "guest_stalled: the guest took no data of this copy for " +
                                            std::to_string(kPutStallLimit.count()) +
                                            " s, so it was stopped (the VM keeps running)");
  }
  FinishRelay(guest, client, end, failure);
}

namespace {

// The get verb through the channel. With `cap`, content larger than it is left alone: the
// guest answers "too_large" before sending any, and so does this (the client has been sent
// nothing); otherwise the client stream has been ended and the answer is false.
bool RelayGetChannel(GuestChannel& guest, Json greq, channel::Stream& client,
                     std::optional<uint64_t> cap = std::nullopt) {
  if (cap) greq["channel_max_bytes"] = *cap;
  auto s = guest.Open(greq);
  if (!s.ok()) {
    (void)client.End(ErrorReply(GuestGone(guest, s.status())));
    return false;
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
        auto ev = GuestMetaEvent(m->body);
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
  if (cap && end && end->is_object() && end->value("error", Json()) == "too_large") return true;
  FinishRelay(guest, client, end, failure);
  return false;
}

}  // namespace

void RelayGet(GuestChannel& guest, const Json& greq, channel::Stream& client) {
  // Small content stays on the channel (guest_disk.h); the guest says when it is not small.
  if (guest.transfer_disk()) {
    if (!RelayGetChannel(guest, greq, client, kChannelMaxBytes)) return;
    if (RelayGetViaDisk(guest, greq, client)) return;
  }
  RelayGetChannel(guest, greq, client);
}

}  // namespace trybox::daemon
