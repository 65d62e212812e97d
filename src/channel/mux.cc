#include "channel/mux.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <system_error>
#include <vector>

namespace trybox::channel {

Result<std::string> EncodeJsonPayload(const Json& body) {
  std::string text;
  try {
    text = body.dump();
  } catch (const std::exception& e) {
    // nlohmann refuses strings that are not UTF-8; such a body cannot be sent as JSON.
    return InvalidArgument(std::string("the message cannot be encoded as JSON (") + e.what() + ")");
  }
  if (text.size() > kMaxPayload) {
    return ResourceExhausted("the message is " + std::to_string(text.size()) +
                             " bytes of JSON, over the frame limit of " +
                             std::to_string(kMaxPayload));
  }
  return text;
}

namespace {

// A RESET's reason as the protocol defines it: {"reason": string}. Anything else from the
// peer is replaced, so that no reader ever meets a reason of another type.
Json ResetBody(const Json& body) {
  if (body.is_object() && body.contains("reason") && body["reason"].is_string()) {
    return {{"reason", body["reason"]}};
  }
  return {{"reason", "the peer reset the stream (with a malformed reason)"}};
}

// Frames to the Mux's own fd (a socket on the host, a socketpair in tests).
class FdWriter : public FrameWriter {
 public:
  explicit FdWriter(int fd) : fd_(fd) {}

  Status Write(struct iovec* iov, int count) override {
    for (;;) {
      while (count > 0 && iov->iov_len == 0) {
        ++iov;
        --count;
      }
      if (count == 0) return Status::Ok();
      ssize_t w = ::writev(fd_, iov, count);
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("write to channel");
      }
      AdvanceIov(&iov, &count, static_cast<size_t>(w));
    }
  }

  Status Splice(int pipe, size_t len) override {
    while (len > 0 && splice_works_) {
      ssize_t w = ::splice(pipe, nullptr, fd_, nullptr, len, 0);
      if (w > 0) {
        len -= static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      // Not a socket, or the kernel refused these pages: the rest is copied (a connection
      // that is gone fails that write too).
      if (w < 0 && errno == EINVAL) splice_works_ = false;
      break;
    }
    return CopyFromPipe(*this, pipe, len);
  }

 private:
  const int fd_;
  bool splice_works_ = true;
};

}  // namespace

void AdvanceIov(struct iovec** iov, int* count, size_t done) {
  while (*count > 0 && done >= (*iov)->iov_len) {
    done -= (*iov)->iov_len;
    ++*iov;
    --*count;
  }
  if (*count > 0) {
    (*iov)->iov_base = static_cast<char*>((*iov)->iov_base) + done;
    (*iov)->iov_len -= done;
  }
}

Status CopyFromPipe(FrameWriter& writer, int pipe, size_t len) {
  char buf[64 * 1024];
  while (len > 0) {
    ssize_t got = ::read(pipe, buf, std::min(len, sizeof buf));
    if (got < 0 && errno == EINTR) continue;
    // The caller promised these bytes: the frame cannot be finished, the framing is lost.
    if (got <= 0) return Internal("the pipe held less than the frame announced");
    struct iovec part[1] = {{buf, static_cast<size_t>(got)}};
    RETURN_IF_ERROR(writer.Write(part, 1));
    len -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

class MuxCore : public std::enable_shared_from_this<MuxCore> {
 public:
  MuxCore(UniqueFd fd, Role role, std::unique_ptr<FrameWriter> writer)
      : fd_(std::move(fd)), role_(role) {
    MutexLock lock(write_mu_);
    writer_ = writer ? std::move(writer) : std::make_unique<FdWriter>(fd_.get());
  }

  Status SendFrame(uint32_t stream, FrameType type, uint8_t channel, std::string_view payload) {
    char hdr[kHeaderSize];
    EncodeHeader(stream, type, channel, static_cast<uint32_t>(payload.size()), hdr);
    MutexLock lock(write_mu_);
    if (write_failed_) return Unavailable("channel lost: " + DeathReason());
    struct iovec iov[2] = {{hdr, kHeaderSize}, {const_cast<char*>(payload.data()), payload.size()}};
    return Failed(writer_->Write(iov, 2));
  }

  // A DATA frame of the next `len` bytes `pipe` holds, moved by the writer's Splice.
  Status SendDataFromPipe(uint32_t stream, uint8_t channel, int pipe, size_t len) {
    char hdr[kHeaderSize];
    EncodeHeader(stream, FrameType::kData, channel, static_cast<uint32_t>(len), hdr);
    MutexLock lock(write_mu_);
    if (write_failed_) return Unavailable("channel lost: " + DeathReason());
    struct iovec iov[1] = {{hdr, kHeaderSize}};
    RETURN_IF_ERROR(Failed(writer_->Write(iov, 1)));
    return Failed(writer_->Splice(pipe, len));
  }

  // A write that failed loses the connection: a frame may be cut.
  Status Failed(Status st) REQUIRES(write_mu_) {
    if (st.ok()) return st;
    write_failed_ = true;
    return Unavailable("channel lost: " + st.message());
  }

  std::string DeathReason() const {
    MutexLock lock(state_mu_);
    return death_reason_;
  }

  bool Alive() const {
    MutexLock lock(state_mu_);
    return death_reason_.empty();
  }

  Result<std::shared_ptr<Stream>> Open(const Json& request) {
    std::shared_ptr<Stream> s;
    {
      MutexLock lock(state_mu_);
      if (!death_reason_.empty()) return Unavailable("channel lost: " + death_reason_);
      uint32_t id = next_id_;
      next_id_ += 2;
      s.reset(new Stream(shared_from_this(), id));
      streams_[id] = s;
    }
    auto payload = EncodeJsonPayload(request);
    if (!payload.ok()) {
      Forget(s->id());
      return payload.status().Annotate("open a stream");
    }
    Status st = SendFrame(s->id(), FrameType::kOpen, 0, *payload);
    if (!st.ok()) {
      Forget(s->id());
      return st;
    }
    return s;
  }

  void Forget(uint32_t id) {
    MutexLock lock(state_mu_);
    streams_.erase(id);
  }

  void ReadLoop() {
    // Not zeroed: every connection has one, and zeroing it faulted in all 128 pages up front
    // (about 1 ms in a nested VM) for a client that may send one small request.
    constexpr size_t kReadSize = 512 * 1024;
    auto buf = std::make_unique_for_overwrite<char[]>(kReadSize);
    std::string reason;
    for (;;) {
      ssize_t n = ::read(fd_.get(), buf.get(), kReadSize);
      if (n < 0) {
        if (errno == EINTR) continue;
        reason = ErrnoError("read from channel").message();
        break;
      }
      if (n == 0) {
        reason = decoder_.HasPartial()
                     ? "connection closed mid-frame (" + decoder_.DescribePartial() + ")"
                     : "connection closed";
        break;
      }
      decoder_.Feed(std::string_view(buf.get(), static_cast<size_t>(n)));
      Status bad;
      for (;;) {
        auto f = decoder_.Next();
        if (!f.ok()) {
          if (f.status().code() != Code::kUnavailable) bad = f.status();
          break;
        }
        Dispatch(std::move(f).value());
        if (!control_error_.empty()) {
          bad = InvalidArgument(control_error_);
          break;
        }
      }
      if (!bad.ok()) {
        reason = bad.message();
        break;
      }
      if (stopping_) {
        reason = "shut down";
        break;
      }
    }
    Die(reason);
  }

  void Die(const std::string& reason) {
    std::map<uint32_t, std::weak_ptr<Stream>> streams;
    DeathHandler_t on_death;
    std::string why;
    {
      MutexLock lock(state_mu_);
      if (!death_reason_.empty()) return;
      death_reason_ = reason.empty() ? "connection closed" : reason;
      why = death_reason_;
      streams.swap(streams_);
      on_death = on_death_;
    }
    {
      MutexLock lock(write_mu_);
      write_failed_ = true;
    }
    for (auto& [id, weak] : streams) {
      if (auto s = weak.lock()) {
        MutexLock lock(s->mu_);
        s->conn_error_ = why;
        s->cv_.SignalAll();
      }
    }
    if (on_death) {
      try {
        on_death(why);
      } catch (...) {
      }
    }
  }

  void Dispatch(Frame f) {
    if (f.stream == 0) {
      if (f.type == FrameType::kEvent) {
        Json body = Json::parse(f.payload, nullptr, /*allow_exceptions=*/false);
        if (body.is_discarded() || !body.is_object()) {
          control_error_ = "malformed control event from the peer (not a JSON object)";
          return;
        }
        if (!on_control_) return;
        try {
          on_control_(body);
        } catch (const std::exception& e) {
          control_error_ = std::string("control event from the peer not understood: ") + e.what();
        }
      }
      return;
    }
    if (f.type == FrameType::kOpen) {
      HandleOpen(std::move(f));
      return;
    }
    std::shared_ptr<Stream> s;
    {
      MutexLock lock(state_mu_);
      auto it = streams_.find(f.stream);
      if (it != streams_.end()) s = it->second.lock();
    }
    // Frames for a stream we no longer track are late arrivals after a local reset: dropped.
    if (!s) return;
    Stream::Message m;
    bool finish = false;
    switch (f.type) {
      case FrameType::kCredit: {
        const auto* u = reinterpret_cast<const unsigned char*>(f.payload.data());
        uint32_t grant = u[0] | u[1] << 8 | u[2] << 16 | static_cast<uint32_t>(u[3]) << 24;
        MutexLock lock(s->mu_);
        s->send_credit_ += grant;
        s->cv_.SignalAll();
        return;
      }
      case FrameType::kData: {
        bool violated;
        {
          MutexLock lock(s->mu_);
          violated = f.payload.size() > s->recv_window_;
          if (!violated) s->recv_window_ -= f.payload.size();
        }
        if (violated) {
          (void)s->Reset("flow control violated: peer sent past its window");
          return;
        }
        m.kind = Stream::Message::Kind::kData;
        m.channel = f.channel;
        m.data = std::move(f.payload);
        break;
      }
      case FrameType::kEof:
        m.kind = Stream::Message::Kind::kEof;
        m.channel = f.channel;
        break;
      case FrameType::kEvent:
      case FrameType::kEnd:
      case FrameType::kReset: {
        Json body = Json::parse(f.payload, nullptr, false);
        if (body.is_discarded() || !body.is_object()) {
          m.kind = Stream::Message::Kind::kReset;
          m.body = {{"reason", std::string("malformed JSON in ") + FrameTypeName(f.type) +
                                   " frame from peer"}};
          finish = true;
          (void)SendFrame(f.stream, FrameType::kReset, 0, m.body.dump());
          break;
        }
        m.kind = f.type == FrameType::kEvent ? Stream::Message::Kind::kEvent
                 : f.type == FrameType::kEnd ? Stream::Message::Kind::kEnd
                                             : Stream::Message::Kind::kReset;
        m.body = f.type == FrameType::kReset ? ResetBody(body) : std::move(body);
        finish = f.type != FrameType::kEvent;
        break;
      }
      default:
        return;
    }
    const bool is_reset = m.kind == Stream::Message::Kind::kReset;
    bool forget = false;
    {
      MutexLock lock(s->mu_);
      if (s->remote_done_) return;  // nothing is accepted after END/RESET
      if (finish) {
        s->remote_done_ = true;
        if (is_reset) s->local_done_ = true;
        forget = s->local_done_;
      }
      s->inbox_.push_back(std::move(m));
      s->cv_.SignalAll();
    }
    if (forget) Forget(f.stream);
  }

  void HandleOpen(Frame f) {
    bool peer_parity_ok = (role_ == Role::kHost) ? (f.stream % 2 == 0) : (f.stream % 2 == 1);
    Json req = Json::parse(f.payload, nullptr, false);
    std::shared_ptr<Stream> s;
    std::string refuse;
    {
      MutexLock lock(state_mu_);
      if (!peer_parity_ok) {
        refuse = "stream id has the wrong parity for the opener";
      } else if (streams_.count(f.stream)) {
        refuse = "stream id already in use";
      } else if (!on_open_) {
        refuse = "this end accepts no requests";
      } else if (req.is_discarded() || !req.is_object()) {
        refuse = "malformed JSON in OPEN frame";
      } else {
        s.reset(new Stream(shared_from_this(), f.stream));
        streams_[f.stream] = s;
      }
    }
    if (!s) {
      (void)SendFrame(f.stream, FrameType::kReset, 0, Json{{"reason", refuse}}.dump());
      return;
    }
    try {
      std::thread([handler = on_open_, s, req = std::move(req)]() mutable {
        // A handler that throws costs its own stream, never the process or the connection.
        try {
          handler(s, std::move(req));
        } catch (const std::exception& e) {
          (void)s->Reset(std::string("the request handler failed: ") + e.what());
        } catch (...) {
          (void)s->Reset("the request handler failed");
        }
      }).detach();
    } catch (const std::system_error& e) {
      // No thread to serve it (the task limit): this request fails, the connection lives.
      (void)s->Reset(std::string("could not start a thread for the request: ") + e.what());
    }
  }

  using DeathHandler_t = Mux::DeathHandler;

  UniqueFd fd_;
  const Role role_;
  FrameDecoder decoder_;       // reader thread only
  std::string control_error_;  // reader thread only: a bad stream-0 event ends the connection
  Mutex write_mu_;
  bool write_failed_ GUARDED_BY(write_mu_) = false;
  std::unique_ptr<FrameWriter> writer_ GUARDED_BY(write_mu_);
  mutable Mutex state_mu_;
  std::map<uint32_t, std::weak_ptr<Stream>> streams_ GUARDED_BY(state_mu_);
  uint32_t next_id_ GUARDED_BY(state_mu_) = 1;
  std::string death_reason_ GUARDED_BY(state_mu_);
  std::atomic<bool> stopping_{false};
  // Set before Start(); read-only afterwards.
  Mux::OpenHandler on_open_;
  Mux::ControlHandler on_control_;
  Mux::DeathHandler on_death_;
};

// ---- Stream ----

Stream::~Stream() {
  bool abandoned;
  {
    MutexLock lock(mu_);
    // Abandoned means finished by neither side. After our own END the peer has its answer:
    // a RESET on top would contradict it (a responder drops its stream right after END).
    abandoned = !local_done_ && !remote_done_ && conn_error_.empty();
    local_done_ = true;
  }
  if (abandoned) {
    // Tell the peer, so it stops sending and frees its half.
    (void)core_->SendFrame(id_, FrameType::kReset, 0,
                           Json{{"reason", "stream abandoned by its owner"}}.dump());
  }
  core_->Forget(id_);
}

void Stream::SetWriteStallLimit(std::chrono::milliseconds limit) {
  MutexLock lock(mu_);
  write_stall_limit_ = limit;
}

Result<size_t> Stream::TakeCredit(size_t want) {
  MutexLock lock(mu_);
  auto waiting = [&]() REQUIRES(mu_) {
    return send_credit_ == 0 && !local_done_ && !remote_done_ && conn_error_.empty();
  };
  const bool limited = write_stall_limit_.has_value();
  const auto until = std::chrono::steady_clock::now() +
                     (limited ? *write_stall_limit_ : std::chrono::milliseconds(0));
  while (waiting()) {
    if (!limited) {
      cv_.Wait(mu_);
    } else if (!cv_.WaitUntil(mu_, until) && waiting()) {
      return DeadlineExceeded(
          "the peer took none of this stream's data for " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::seconds>(*write_stall_limit_).count()) +
          " s");
    }
  }
  if (!conn_error_.empty()) return Unavailable("channel lost: " + conn_error_);
  if (local_done_) return FailedPrecondition("write after the stream was finished");
  if (remote_done_ && send_credit_ == 0) return Unavailable("peer finished the stream");
  size_t n = std::min<uint64_t>({want, send_credit_, kMaxDataChunk});
  send_credit_ -= n;
  return n;
}

Status Stream::Write(uint8_t channel, std::string_view data) {
  while (!data.empty()) {
    ASSIGN_OR_RETURN(size_t n, TakeCredit(data.size()));
    RETURN_IF_ERROR(core_->SendFrame(id_, FrameType::kData, channel, data.substr(0, n)));
    data.remove_prefix(n);
  }
  return Status::Ok();
}

Status Stream::WriteFromPipe(uint8_t channel, int pipe, size_t len) {
  while (len > 0) {
    ASSIGN_OR_RETURN(size_t n, TakeCredit(len));
    RETURN_IF_ERROR(core_->SendDataFromPipe(id_, channel, pipe, n));
    len -= n;
  }
  return Status::Ok();
}

Status Stream::CloseWrite(uint8_t channel) {
  return core_->SendFrame(id_, FrameType::kEof, channel, {});
}

Status Stream::SendEvent(const Json& body) {
  ASSIGN_OR_RETURN(std::string payload, EncodeJsonPayload(body));
  return core_->SendFrame(id_, FrameType::kEvent, 0, payload);
}

Status Stream::End(const Json& body) {
  auto payload = EncodeJsonPayload(body);
  if (!payload.ok()) {
    // The peer still learns why its request has no answer; nothing waits forever.
    (void)Reset("the result could not be sent: " + payload.status().message());
    return payload.status();
  }
  bool forget;
  {
    MutexLock lock(mu_);
    if (local_done_) return FailedPrecondition("stream already finished");
    local_done_ = true;
    forget = remote_done_;
    cv_.SignalAll();
  }
  Status st = core_->SendFrame(id_, FrameType::kEnd, 0, *payload);
  if (forget) core_->Forget(id_);
  return st;
}

Status Stream::Reset(const std::string& reason) {
  {
    MutexLock lock(mu_);
    if (local_done_ && remote_done_) return Status::Ok();
    local_done_ = true;
    remote_done_ = true;
    reset_here_ = true;
    cv_.SignalAll();
  }
  auto payload = EncodeJsonPayload(Json{{"reason", reason}});
  Status st = core_->SendFrame(
      id_, FrameType::kReset, 0,
      payload.ok() ? *payload : std::string(R"x({"reason":"(a reason that is not UTF-8)"})x"));
  core_->Forget(id_);
  return st;
}

uint64_t Stream::wakeups() const {
  MutexLock lock(mu_);
  return wakeups_;
}

void Stream::Interrupt() {
  MutexLock lock(mu_);
  interrupted_ = true;
  cv_.SignalAll();
}

bool Stream::finished() const {
  MutexLock lock(mu_);
  return local_done_ || remote_done_;
}

Result<Stream::Message> Stream::Next(Deadline deadline) {
  uint64_t grant = 0;
  Message m;
  {
    MutexLock lock(mu_);
    auto ready = [&]() REQUIRES(mu_) {
      return !inbox_.empty() || !conn_error_.empty() || end_delivered_ || reset_here_ ||
             interrupted_;
    };
    while (!ready()) {
      ++wakeups_;
      if (deadline) {
        if (!cv_.WaitUntil(mu_, *deadline) && !ready()) {
          return DeadlineExceeded("no message in time");
        }
      } else {
        cv_.Wait(mu_);
      }
    }
    if (inbox_.empty()) {
      if (end_delivered_) return FailedPrecondition("stream already ended");
      if (reset_here_) return FailedPrecondition("stream was reset by this side");
      if (interrupted_) return Cancelled("interrupted by this side");
      return Unavailable("channel lost: " + conn_error_);
    }
    m = std::move(inbox_.front());
    inbox_.pop_front();
    if (m.kind == Message::Kind::kEnd || m.kind == Message::Kind::kReset) end_delivered_ = true;
    if (m.kind == Message::Kind::kData) {
      consumed_unacked_ += m.data.size();
      if (consumed_unacked_ >= kInitialWindow / 4 && !remote_done_) {
        grant = consumed_unacked_;
        consumed_unacked_ = 0;
        recv_window_ += grant;
      }
    }
  }
  if (grant > 0) {
    char p[4];
    for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((grant >> (8 * i)) & 0xff);
    // A lost credit frame means the connection is dead, which the next Next() reports.
    (void)core_->SendFrame(id_, FrameType::kCredit, 0, std::string_view(p, 4));
  }
  return m;
}

// ---- Mux ----

Mux::Mux(UniqueFd fd, Role role, std::unique_ptr<FrameWriter> writer)
    : core_(std::make_shared<MuxCore>(std::move(fd), role, std::move(writer))) {
  MutexLock lock(core_->state_mu_);
  core_->next_id_ = role == Role::kHost ? 1 : 2;
}

Mux::~Mux() { Shutdown(); }

void Mux::OnOpen(OpenHandler h) { core_->on_open_ = std::move(h); }
void Mux::OnControl(ControlHandler h) { core_->on_control_ = std::move(h); }
void Mux::OnDeath(DeathHandler h) { core_->on_death_ = std::move(h); }

void Mux::Start() {
  reader_ = std::thread([core = core_] { core->ReadLoop(); });
}

Result<std::shared_ptr<Stream>> Mux::Open(const Json& request) { return core_->Open(request); }

Status Mux::SendControl(const Json& event) {
  ASSIGN_OR_RETURN(std::string payload, EncodeJsonPayload(event));
  return core_->SendFrame(0, FrameType::kEvent, 0, payload);
}

bool Mux::alive() const { return core_->Alive(); }
std::string Mux::death_reason() const { return core_->DeathReason(); }

void Mux::Shutdown() {
  core_->stopping_ = true;
  // Wakes the reader: sockets get shutdown(2); anything else (a tty-like port) is left to
  // the peer, and the reader is detached rather than joined forever.
  struct stat st;
  bool is_socket = ::fstat(core_->fd_.get(), &st) == 0 && S_ISSOCK(st.st_mode);
  if (is_socket) ::shutdown(core_->fd_.get(), SHUT_RDWR);
  if (reader_.joinable()) {
    if (is_socket) {
      reader_.join();
    } else {
      reader_.detach();
    }
  }
  core_->Die("shut down");
}

}  // namespace trybox::channel
