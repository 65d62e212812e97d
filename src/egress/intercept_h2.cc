#include "egress/intercept_h2.h"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "egress/http.h"
#include "util/ascii.h"
#include "util/mutex.h"

namespace trybox::egress {
namespace {

using Clock = std::chrono::steady_clock;
using Fields = std::vector<std::pair<std::string, std::string>>;

constexpr size_t kReadChunk = 16 * 1024;
// The guest's bytes read ahead of the session (then its reader waits).
constexpr size_t kMaxGuestBacklog = 1 << 20;
constexpr int32_t kConnectionWindow = 4 << 20;
// A response head's or chunk-size line's bytes, from the lane's own relay.
constexpr size_t kMaxLine = 4096;

// One direction of an in-memory byte stream between two threads. With a `cap`, Write waits
// while that many bytes are unread (the writer is a thread that may block); without, the
// writer bounds what it writes itself.
class Pipe {
 public:
  explicit Pipe(size_t cap = 0) : cap_(cap) {}

  // Called, outside the lock, with the size of every read.
  void OnRead(std::function<void(size_t)> f) { on_read_ = std::move(f); }

  bool Write(std::string_view b) {
    MutexLock l(mu_);
    while (cap_ != 0 && buf_.size() - off_ >= cap_ && !closed_ && !aborted_) cv_.Wait(mu_);
    if (closed_ || aborted_) return false;
    buf_.append(b);
    cv_.SignalAll();
    return true;
  }

  Result<std::string> Read(size_t max, std::optional<Clock::time_point> deadline) {
    std::string out;
    {
      MutexLock l(mu_);
      while (buf_.size() == off_ && !closed_ && !aborted_) {
        if (!deadline) {
          cv_.Wait(mu_);
        } else if (!cv_.WaitUntil(mu_, *deadline) && buf_.size() == off_ && !closed_ && !aborted_) {
          return DeadlineExceeded("no bytes before the deadline");
        }
      }
      if (aborted_) return Unavailable("the stream was torn down");
      size_t n = std::min(max, buf_.size() - off_);
      out.assign(buf_, off_, n);
      off_ += n;
      if (off_ == buf_.size()) {
        buf_.clear();
        off_ = 0;
      } else if (off_ > (64 << 10) && off_ * 2 > buf_.size()) {
        buf_.erase(0, off_);  // at most as many bytes moved as were read since the last time
        off_ = 0;
      }
      cv_.SignalAll();  // room for a capped writer
    }
    if (on_read_ && !out.empty()) on_read_(out.size());
    return out;
  }

  void Close() {
    MutexLock l(mu_);
    closed_ = true;
    cv_.SignalAll();
  }
  void Abort() {
    MutexLock l(mu_);
    aborted_ = true;
    cv_.SignalAll();
  }

 private:
  const size_t cap_;
  std::function<void(size_t)> on_read_;
  Mutex mu_;
  CondVar cv_;
  std::string buf_ GUARDED_BY(mu_);
  size_t off_ GUARDED_BY(mu_) = 0;
  bool closed_ GUARDED_BY(mu_) = false;
  bool aborted_ GUARDED_BY(mu_) = false;
};

// What a lane's RelayHttp sees as its guest: it reads requests from one pipe and writes
// responses to the other.
class PipeEnd : public ByteStream {
 public:
  PipeEnd(Pipe& in, Pipe& out) : in_(in), out_(out) {}
  Result<std::string> Read(size_t max, std::optional<Clock::time_point> deadline) override {
    return in_.Read(max, deadline);
  }
  Status Write(std::string_view data) override {
    if (!out_.Write(data)) return Unavailable("the HTTP/2 stream is gone");
    return Status();
  }
  Status CloseWrite() override {
    out_.Close();
    return Status();
  }
  // As a socket's shutdown: reads fail at once, while what was written before stays readable
  // at the other end, then ends.
  void Abort() override {
    in_.Abort();
    out_.Close();
  }

 private:
  Pipe& in_;
  Pipe& out_;
};

struct Stream;

// One upstream HTTP/1.1 connection and its relay, serving one stream at a time.
struct Lane {
  Lane() : relay_side(requests, responses) {}
  Pipe requests;                         // HTTP/1.1 request bytes, to the lane's RelayHttp
  Pipe responses{kMaxBufferedResponse};  // HTTP/1.1 response bytes, from it
  PipeEnd relay_side;
  std::thread relay;       // dials, then runs RelayHttp
  std::thread reader;      // turns responses into the stream's events
  InterceptResult result;  // the relay thread's, read after it is joined
  // Guarded by Session::mu_.
  std::shared_ptr<Stream> current;  // the stream it serves; null while idle
  bool dead = false;                // the connection is gone or going: serves no more streams
  int threads_done = 0;             // 2 once both threads are about to return
};

struct Stream {
  int32_t id = 0;
  // The request, from its HEADERS (session thread only).
  std::string method, scheme, authority, path, host_field;
  std::vector<std::string> cookies;
  Fields fields;
  size_t head_bytes = 0;
  bool has_length = false;
  bool trailers = false;  // a second HEADERS block arrived
  bool chunked = false;
  bool started = false;  // its head went to a lane (or it was refused)
  bool refused = false;  // a made-up response was submitted
  bool response_started = false;
  std::shared_ptr<Lane> lane;
  uint64_t unconsumed = 0;  // DATA bytes received and not yet taken by the lane's relay
  // The response body, filled by the lane's reader (Session::mu_).
  std::string body;
  size_t body_off = 0;
  bool body_end = false;
  bool closed = false;    // nghttp2 closed the stream: the reader drops what is left
  bool complete = false;  // the reader has the whole response: its lane may serve another
  bool failed = false;    // the response broke off: reset once what arrived is sent
};

struct Event {
  enum Kind { kInterim, kHead, kData, kFail, kConsumed } kind;
  std::shared_ptr<Stream> stream;
  int status = 0;
  Fields fields;
  bool has_body = false;
  std::string reason;
  uint64_t n = 0;
};

bool IsConnectionSpecific(const std::string& lower_name) {
  return lower_name == "connection" || lower_name == "keep-alive" ||
         lower_name == "proxy-connection" || lower_name == "transfer-encoding" ||
         lower_name == "upgrade" || lower_name == "te";
}

std::vector<std::string> ConnectionTokens(const Fields& fields) {
  std::vector<std::string> out;
  for (const auto& [name, value] : fields) {
    if (!AsciiEqualsIgnoreCase(name, "connection")) continue;
    std::string_view v = value;
    while (!v.empty()) {
      size_t comma = v.find(',');
      std::string t = AsciiLower(TrimOws(v.substr(0, comma)));
      if (!t.empty()) out.push_back(t);
      if (comma == std::string_view::npos) break;
      v.remove_prefix(comma + 1);
    }
  }
  return out;
}

std::string FieldValue(const Fields& fields, std::string_view name) {
  for (const auto& [n, v] : fields) {
    if (AsciiEqualsIgnoreCase(n, name)) return std::string(TrimOws(v));
  }
  return "";
}

class Session {
 public:
  Session(ByteStream& guest, const UpstreamDialer& dial, const SecretSet& secrets,
          const std::string& host, const InterceptLimits& limits, const HttpRules* rules)
      : guest_(guest),
        dial_(dial),
        secrets_(secrets),
        host_(host),
        limits_(limits),
        rules_(rules) {}

  ~Session() {
    if (session_) nghttp2_session_del(session_);
  }

  InterceptResult Run() {
    if (Status s = Setup(); !s.ok()) {
      InterceptResult r;
      r.error = s.message();
      return r;
    }
    std::thread reader([this] { ReadGuest(); });
    Loop();
    // Flushes what the session still has (a GOAWAY), ends the guest's direction cleanly,
    // then wakes the reader if the guest has not closed its side.
    (void)Send();
    (void)guest_.CloseWrite();
    std::vector<std::shared_ptr<Lane>> lanes;
    bool guest_open;
    {
      MutexLock l(mu_);
      stopping_ = true;
      guest_open = !guest_eof_ && !guest_failed_;
      lanes = lanes_;
      cv_.SignalAll();
      space_.SignalAll();
    }
    if (guest_open) guest_.Abort();
    reader.join();
    for (auto& lane : lanes) Kill(*lane);
    for (auto& lane : lanes) Join(*lane);
    return result_;
  }

 private:
  // ---- Setup and the session thread's loop.

  Status Setup() {
    nghttp2_session_callbacks* cb = nullptr;
    if (nghttp2_session_callbacks_new(&cb) != 0) return Internal("nghttp2: out of memory");
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, &Session::OnBeginHeaders);
    nghttp2_session_callbacks_set_on_header_callback(cb, &Session::OnHeader);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, &Session::OnFrameRecv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, &Session::OnDataChunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, &Session::OnStreamClose);
    nghttp2_option* opt = nullptr;
    if (nghttp2_option_new(&opt) != 0) {
      nghttp2_session_callbacks_del(cb);
      return Internal("nghttp2: out of memory");
    }
    // Request bodies are flow-controlled by what the upstream has taken, not by arrival.
    nghttp2_option_set_no_auto_window_update(opt, 1);
    int rv = nghttp2_session_server_new2(&session_, cb, this, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    if (rv != 0) return Internal(std::string("nghttp2: ") + nghttp2_strerror(rv));
    const nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, kMaxStreams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, kStreamWindow},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<uint32_t>(limits_.max_head)},
    };
    rv = nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, std::size(settings));
    if (rv == 0) {
      rv = nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, kConnectionWindow);
    }
    if (rv != 0) return Internal(std::string("nghttp2: ") + nghttp2_strerror(rv));
    return Status();
  }

  void Loop() {
    auto last_active = Clock::now();
    for (;;) {
      std::string in;
      std::deque<Event> events;
      bool eof, failed, idle_out = false;
      std::string guest_error;
      {
        MutexLock l(mu_);
        for (;;) {
          if (!guest_in_.empty() || !events_.empty() || guest_failed_ ||
              (guest_eof_ && !eof_seen_)) {
            break;
          }
          if (!streams_.empty()) {
            cv_.Wait(mu_);
          } else if (!cv_.WaitUntil(mu_, last_active + limits_.head_timeout) && guest_in_.empty() &&
                     events_.empty()) {
            idle_out = true;
            break;
          }
        }
        in.swap(guest_in_);
        events.swap(events_);
        eof = guest_eof_;
        eof_seen_ = eof;
        failed = guest_failed_;
        if (failed) guest_error = guest_error_;
        space_.SignalAll();
      }
      if (idle_out) {
        nghttp2_session_terminate_session(session_, NGHTTP2_NO_ERROR);
        return;
      }
      bool broken = false;
      if (!in.empty()) {
        last_active = Clock::now();
        ssize_t rv = nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(in.data()),
                                              in.size());
        if (rv < 0) {
          SetError(std::string("HTTP/2 from the guest: ") + nghttp2_strerror(static_cast<int>(rv)));
          broken = true;
        }
      }
      for (Event& e : events) Handle(e);
      if (!Send().ok() || broken) return;
      if (failed) {
        SetError(guest_error);
        return;
      }
      // An HTTP/2 client does not half-close: its end is the connection's, and a response
      // still in flight has nobody to read it.
      if (eof) return;
      if (!streams_.empty()) last_active = Clock::now();
      if (!nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_)) return;
    }
  }

  // Everything the session has to say, written to the guest.
  Status Send() {
    std::string out;
    for (;;) {
      const uint8_t* data = nullptr;
      ssize_t n = nghttp2_session_mem_send(session_, &data);
      if (n < 0) {
        SetError(std::string("HTTP/2 to the guest: ") + nghttp2_strerror(static_cast<int>(n)));
        return Internal(result_.error);
      }
      if (n > 0) out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
      if (!out.empty() && (n == 0 || out.size() >= kReadChunk * 4)) {
        if (Status s = guest_.Write(out); !s.ok()) {
          SetError("writing to the guest: " + s.message());
          return s;
        }
        result_.bytes_down += static_cast<int64_t>(out.size());
        out.clear();
      }
      if (n == 0) return Status();
    }
  }

  void ReadGuest() {
    for (;;) {
      auto data = guest_.Read(kReadChunk, std::nullopt);
      MutexLock l(mu_);
      if (!data.ok() || data->empty()) {
        if (data.ok()) {
          guest_eof_ = true;
        } else {
          guest_failed_ = true;
          guest_error_ = "reading from the guest: " + data.status().message();
        }
        cv_.SignalAll();
        return;
      }
      guest_in_ += *data;
      cv_.SignalAll();
      while (guest_in_.size() > kMaxGuestBacklog && !stopping_) space_.Wait(mu_);
      if (stopping_) return;
    }
  }

  void SetError(const std::string& e) {
    if (result_.error.empty()) result_.error = e;
  }

  void Refused(int status, const std::string& reason) {
    if (result_.refused_status == 0) {
      result_.refused_status = status;
      result_.refused_reason = reason;
    }
  }

  // ---- nghttp2 callbacks (the session thread, inside mem_recv and mem_send).

  static Session& Of(void* p) { return *static_cast<Session*>(p); }

  std::shared_ptr<Stream> Find(int32_t id) {
    auto it = streams_.find(id);
    return it == streams_.end() ? nullptr : it->second;
  }

  static int OnBeginHeaders(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    Session& self = Of(user);
    if (frame->hd.type != NGHTTP2_HEADERS) return 0;
    if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
      // The advertised limit binds only once the guest has acknowledged it.
      if (self.streams_.size() >= static_cast<size_t>(kMaxStreams)) {
        nghttp2_submit_rst_stream(self.session_, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
                                  NGHTTP2_REFUSED_STREAM);
        return 0;
      }
      auto s = std::make_shared<Stream>();
      s->id = frame->hd.stream_id;
      self.streams_[s->id] = s;
    } else if (auto s = self.Find(frame->hd.stream_id)) {
      s->trailers = true;
    }
    return 0;
  }

  static int OnHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* user) {
    Session& self = Of(user);
    auto s = self.Find(frame->hd.stream_id);
    if (!s || s->trailers) return 0;
    s->head_bytes += namelen + valuelen + 4;
    if (s->head_bytes > self.limits_.max_head) return 0;
    std::string n(reinterpret_cast<const char*>(name), namelen);
    std::string v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":method") {
      s->method = std::move(v);
    } else if (n == ":scheme") {
      s->scheme = std::move(v);
    } else if (n == ":authority") {
      s->authority = std::move(v);
    } else if (n == ":path") {
      s->path = std::move(v);
    } else if (n[0] == ':') {
      // :protocol (extended CONNECT) is refused with CONNECT itself; nghttp2 refuses others.
    } else if (n == "host") {
      s->host_field = std::move(v);
    } else if (n == "cookie") {
      s->cookies.push_back(std::move(v));
    } else if (n == "te") {
      // "trailers" is all HTTP/2 allows, and means nothing to an HTTP/1.1 upstream.
    } else {
      if (n == "content-length") s->has_length = true;
      s->fields.emplace_back(std::move(n), std::move(v));
    }
    return 0;
  }

  static int OnFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    Session& self = Of(user);
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
    auto s = self.Find(frame->hd.stream_id);
    if (!s) return 0;
    bool end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    if (frame->hd.type == NGHTTP2_HEADERS) {
      if (s->trailers) {
        self.Refuse(*s, 400, "request trailers are not relayed to an intercepted host");
        return 0;
      }
      self.Start(s, end);
      return 0;
    }
    if (end) self.EndRequest(*s);
    return 0;
  }

  static int OnDataChunk(nghttp2_session*, uint8_t, int32_t stream_id, const uint8_t* data,
                         size_t len, void* user) {
    Session& self = Of(user);
    auto s = self.Find(stream_id);
    std::string_view bytes(reinterpret_cast<const char*>(data), len);
    if (!s || s->refused || !s->lane) {
      self.Consume(s.get(), stream_id, len, true);
      return 0;
    }
    s->unconsumed += len;
    if (s->chunked) {
      char size[32];
      std::snprintf(size, sizeof size, "%zx\r\n", len);
      std::string chunk = size;
      chunk.append(bytes);
      chunk += "\r\n";
      s->lane->requests.Write(chunk);
    } else {
      s->lane->requests.Write(bytes);
    }
    return 0;
  }

  static int OnStreamClose(nghttp2_session*, int32_t stream_id, uint32_t, void* user) {
    Session& self = Of(user);
    auto s = self.Find(stream_id);
    if (!s) return 0;
    self.Consume(s.get(), stream_id, s->unconsumed, true);
    self.streams_.erase(stream_id);
    std::shared_ptr<Lane> lane;
    {
      MutexLock l(self.mu_);
      s->closed = true;
      self.space_.SignalAll();
      // A lane still on this stream has a response in flight that nobody will read.
      if (s->lane && s->lane->current == s && !s->complete) {
        lane = s->lane;
        lane->dead = true;
      }
    }
    if (lane) Kill(*lane);
    return 0;
  }

  // Gives back `n` bytes of flow-control window (the stream's only if it still exists).
  void Consume(Stream* s, int32_t id, uint64_t n, bool all) {
    if (s) {
      n = std::min(n, s->unconsumed);
      s->unconsumed -= n;
      if (all) s->unconsumed = 0;
    }
    if (n == 0) return;
    nghttp2_session_consume_connection(session_, n);
    if (s && !s->closed) nghttp2_session_consume_stream(session_, id, n);
  }

  // ---- Requests.

  void Start(const std::shared_ptr<Stream>& s, bool end) {
    if (s->started) return;
    s->started = true;
    if (s->head_bytes > limits_.max_head) {
      return Refuse(*s, 431, "request head over " + std::to_string(limits_.max_head) + " bytes");
    }
    if (s->method == "CONNECT") {
      return Refuse(*s, 400, "CONNECT inside the tunnel to " + host_ + " is not relayed");
    }
    if (s->scheme != "https") {
      return Refuse(*s, 400, "a request inside the tunnel to " + host_ + " must be https");
    }
    std::string head = s->method + " " + s->path + " HTTP/1.1\r\n";
    if (!s->authority.empty()) head += "Host: " + s->authority + "\r\n";
    if (!s->host_field.empty() && s->host_field != s->authority) {
      head += "Host: " + s->host_field + "\r\n";
    }
    for (const auto& [name, value] : s->fields) head += name + ": " + value + "\r\n";
    if (!s->cookies.empty()) {
      head += "cookie: ";
      for (size_t i = 0; i < s->cookies.size(); ++i) {
        head += (i ? "; " : "") + s->cookies[i];
      }
      head += "\r\n";
    }
    if (!end && !s->has_length) {
      s->chunked = true;
      head += "Transfer-Encoding: chunked\r\n";
    } else if (end && !s->has_length &&
               (s->method == "POST" || s->method == "PUT" || s->method == "PATCH")) {
      head += "Content-Length: 0\r\n";
    }
    head += "\r\n";
    auto lane = AcquireLane(s);
    if (!lane) {
      return Refuse(*s, 503,
                    "too many upstream connections for this HTTP/2 connection (cap " +
                        std::to_string(2 * kMaxStreams) + ")");
    }
    s->lane = lane;
    lane->requests.Write(head);
    if (end) EndRequest(*s);
  }

  void EndRequest(Stream& s) {
    if (s.chunked && s.lane && !s.refused) s.lane->requests.Write("0\r\n\r\n");
  }

  // A response made up here, naming why; the stream's lane (if any) goes.
  void Refuse(Stream& s, int status, const std::string& reason) {
    Refused(status, reason);
    std::shared_ptr<Lane> lane;
    {
      MutexLock l(mu_);
      if (s.lane && s.lane->current.get() == &s && !s.complete) {
        lane = s.lane;
        lane->dead = true;
      }
    }
    if (lane) Kill(*lane);
    s.refused = true;
    Consume(&s, s.id, s.unconsumed, true);
    if (s.response_started) {
      nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_INTERNAL_ERROR);
      return;
    }
    std::string body = "trybox egress: " + reason + "\n";
    {
      MutexLock l(mu_);
      s.body = body;
      s.body_off = 0;
      s.body_end = true;
    }
    Fields fields = {{"content-type", "text/plain"},
                     {"content-length", std::to_string(body.size())},
                     {"x-trybox-reason", reason}};
    Submit(s, status, fields, true);
  }

  // ---- Responses.

  void Submit(Stream& s, int status, const Fields& fields, bool has_body) {
    s.response_started = true;
    std::string code = std::to_string(status);
    std::vector<nghttp2_nv> nva;
    auto add = [&nva](const std::string& n, const std::string& v) {
      nva.push_back({reinterpret_cast<uint8_t*>(const_cast<char*>(n.data())),
                     reinterpret_cast<uint8_t*>(const_cast<char*>(v.data())), n.size(), v.size(),
                     NGHTTP2_NV_FLAG_NONE});
    };
    static const std::string kStatus = ":status";
    add(kStatus, code);
    for (const auto& [n, v] : fields) add(n, v);
    nghttp2_data_provider provider;
    provider.source.ptr = nullptr;
    provider.read_callback = &Session::ReadBody;
    int rv = nghttp2_submit_response(session_, s.id, nva.data(), nva.size(),
                                     has_body ? &provider : nullptr);
    if (rv != 0) {
      nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_INTERNAL_ERROR);
    }
  }

  static ssize_t ReadBody(nghttp2_session*, int32_t stream_id, uint8_t* buf, size_t length,
                          uint32_t* flags, nghttp2_data_source*, void* user) {
    Session& self = Of(user);
    auto s = self.Find(stream_id);
    if (!s) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    MutexLock l(self.mu_);
    size_t n = std::min(length, s->body.size() - s->body_off);
    std::memcpy(buf, s->body.data() + s->body_off, n);
    s->body_off += n;
    if (s->body_off == s->body.size()) {
      s->body.clear();
      s->body_off = 0;
    } else if (s->body_off > kMaxBufferedResponse) {
      s->body.erase(0, s->body_off);  // what was sent goes, so the buffer stays bounded
      s->body_off = 0;
    }
    self.space_.SignalAll();
    // nghttp2 answers this by resetting the stream (INTERNAL_ERROR), after the DATA before it.
    if (n == 0 && s->failed) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (s->body.empty() && s->body_end) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      return static_cast<ssize_t>(n);
    }
    if (n == 0) return NGHTTP2_ERR_DEFERRED;
    return static_cast<ssize_t>(n);
  }

  void Handle(Event& e) {
    Stream& s = *e.stream;
    if (s.closed || s.refused) return;
    switch (e.kind) {
      case Event::kInterim: {
        if (s.response_started) return;
        std::string code = std::to_string(e.status);
        std::vector<nghttp2_nv> nva;
        static const std::string kStatus = ":status";
        nva.push_back({reinterpret_cast<uint8_t*>(const_cast<char*>(kStatus.data())),
                       reinterpret_cast<uint8_t*>(code.data()), kStatus.size(), code.size(),
                       NGHTTP2_NV_FLAG_NONE});
        nghttp2_submit_headers(session_, NGHTTP2_FLAG_NONE, s.id, nullptr, nva.data(), nva.size(),
                               nullptr);
        return;
      }
      case Event::kHead:
        Submit(s, e.status, e.fields, e.has_body);
        return;
      case Event::kData:
        nghttp2_session_resume_data(session_, s.id);
        return;
      case Event::kFail:
        SetError(e.reason);
        if (s.response_started) {
          {
            MutexLock l(mu_);
            s.failed = true;
          }
          nghttp2_session_resume_data(session_, s.id);
        } else {
          Refuse(s, 502, e.reason);
        }
        return;
      case Event::kConsumed:
        Consume(&s, s.id, e.n, false);
        return;
    }
  }

  void PostLocked(Event e) REQUIRES(mu_) {
    events_.push_back(std::move(e));
    cv_.SignalAll();
  }
  void Post(Event e) {
    MutexLock l(mu_);
    PostLocked(std::move(e));
  }

  // ---- Lanes.

  // A lane serving `s` from now on: an idle one, else a new one (dialling on its own thread).
  std::shared_ptr<Lane> AcquireLane(const std::shared_ptr<Stream>& s) {
    std::vector<std::shared_ptr<Lane>> finished;
    std::shared_ptr<Lane> lane;
    {
      MutexLock l(mu_);
      for (auto it = lanes_.begin(); it != lanes_.end();) {
        if ((*it)->threads_done == 2) {
          finished.push_back(*it);
          it = lanes_.erase(it);
        } else {
          ++it;
        }
      }
      while (!idle_.empty() && !lane) {
        lane = idle_.front();
        idle_.pop_front();
        if (lane->dead) lane = nullptr;
      }
      // Assigned under the same lock that saw it alive: its reader then reads this stream's
      // response even if the connection dies right after (a refusal, or its end).
      if (lane) {
        lane->current = s;
        cv_.SignalAll();
      }
    }
    for (auto& f : finished) Join(*f);
    if (lane) return lane;
    MutexLock l(mu_);
    if (lanes_.size() >= 2 * static_cast<size_t>(kMaxStreams)) return nullptr;
    lane = std::make_shared<Lane>();
    lane->current = s;
    lanes_.push_back(lane);
    Lane* raw = lane.get();
    lane->requests.OnRead([this, raw](size_t n) {
      MutexLock l(mu_);
      if (raw->current) PostLocked({Event::kConsumed, raw->current, 0, {}, false, "", n});
    });
    lane->relay = std::thread([this, raw] { RunLane(*raw); });
    lane->reader = std::thread([this, raw] { ReadResponses(*raw); });
    return lane;
  }

  // Ends the lane's relay (and so its upstream connection) and its reader.
  static void Kill(Lane& lane) {
    lane.relay_side.Abort();
    lane.responses.Abort();
  }

  void Join(Lane& lane) {
    if (lane.relay.joinable()) lane.relay.join();
    if (lane.reader.joinable()) lane.reader.join();
    const InterceptResult& r = lane.result;
    result_.requests += r.requests;
    for (const auto& [name, n] : r.substitutions) result_.substitutions[name] += n;
    result_.scrubbed += r.scrubbed;
    result_.bytes_up += r.bytes_up;
    if (r.refused_status != 0) Refused(r.refused_status, r.refused_reason);
  }

  void RunLane(Lane& lane) {
    auto up = dial_();
    if (!up.ok()) {
      lane.result.refused_status = 502;
      lane.result.refused_reason = up.status().message();
      lane.responses.Write(RefusalResponse(502, up.status().message()));
    } else {
      lane.result = RelayHttp(lane.relay_side, **up, secrets_, host_, limits_, rules_);
    }
    lane.responses.Close();
    lane.requests.Abort();
    MutexLock l(mu_);
    lane.dead = true;
    ++lane.threads_done;
    cv_.SignalAll();
  }

  // The lane's reader: one response per stream it is given, as events for that stream.
  void ReadResponses(Lane& lane) {
    std::string buf;
    for (;;) {
      std::shared_ptr<Stream> s;
      {
        MutexLock l(mu_);
        while (!lane.current && !lane.dead && !stopping_) cv_.Wait(mu_);
        s = lane.current;
        if (!s) break;
      }
      ReadResponse(lane, s, buf);
      MutexLock l(mu_);
      // A response that did not finish (Finish was not called) leaves its lane unusable. A
      // lane that died after handing itself on still owes its next stream what its relay
      // wrote (a refusal), or that stream's failure: the loop goes round for it.
      if (lane.current == s) {
        lane.current = nullptr;
        lane.dead = true;
      }
    }
    Kill(lane);
    MutexLock l(mu_);
    ++lane.threads_done;
  }

  // Reads more of the lane's response bytes into `buf`; false at their end or an error.
  static bool More(Lane& lane, std::string& buf) {
    auto got = lane.responses.Read(kReadChunk, std::nullopt);
    if (!got.ok() || got->empty()) return false;
    buf += *got;
    return true;
  }

  // Delivers `bytes` of the stream's body, waiting while the guest is behind; false once the
  // stream is gone. With `finish`, these are the response's last bytes (Finish).
  bool Deliver(const std::shared_ptr<Stream>& s, std::string_view bytes, Lane* finish = nullptr,
               bool keep = false) {
    MutexLock l(mu_);
    while (!s->closed && !stopping_ && s->body.size() - s->body_off > kMaxBufferedResponse) {
      space_.Wait(mu_);
    }
    if (s->closed || stopping_) return false;
    s->body.append(bytes);
    if (finish) {
      s->body_end = true;
      Finish(*finish, s, keep);
    }
    PostLocked({Event::kData, s, 0, {}, false, "", 0});
    return true;
  }

  // The response of `s` is all in: the lane serves the next stream if `keep` (the connection
  // stays open and nothing followed the response), else it ends. Done under the same lock
  // that hands the guest the response's end, so a stream the guest opens once it has the
  // response finds the lane idle.
  void Finish(Lane& lane, const std::shared_ptr<Stream>& s, bool keep) REQUIRES(mu_) {
    s->complete = true;
    lane.current = nullptr;
    if (keep && !lane.dead && !stopping_ && idle_.size() < static_cast<size_t>(kMaxIdleLanes)) {
      for (auto& p : lanes_) {
        if (p.get() == &lane) idle_.push_back(p);
      }
    } else {
      lane.dead = true;
    }
  }

  // One response for `s`, as events; calls Finish once it is all in.
  void ReadResponse(Lane& lane, const std::shared_ptr<Stream>& s, std::string& buf) {
    auto fail = [&](const std::string& why) { Post({Event::kFail, s, 0, {}, false, why, 0}); };
    std::optional<ResponseHead> head;
    for (;;) {
      auto parsed = ParseResponseHead(buf, limits_.max_head);
      if (!parsed.ok()) return fail("the upstream's response: " + parsed.status().message());
      if (!parsed->has_value()) {
        if (!More(lane, buf)) return fail("the upstream's connection ended before its response");
        continue;
      }
      head = std::move(**parsed);
      buf.erase(0, head->size);
      if (head->status == 101) return fail("the upstream switched protocols on an HTTP/2 stream");
      if (head->status >= 200) break;
      Post({Event::kInterim, s, head->status, {}, false, "", 0});
    }
    std::vector<std::string> named = ConnectionTokens(head->headers);
    bool close = std::find(named.begin(), named.end(), "close") != named.end();
    Fields fields;
    for (const auto& [name, value] : head->headers) {
      std::string n = AsciiLower(name);
      if (IsConnectionSpecific(n) || std::find(named.begin(), named.end(), n) != named.end()) {
        continue;
      }
      fields.emplace_back(std::move(n), value);
    }
    const bool bodyless = s->method == "HEAD" || head->status == 204 || head->status == 304;
    std::string te = AsciiLower(FieldValue(head->headers, "transfer-encoding"));
    std::string cl = FieldValue(head->headers, "content-length");
    {
      MutexLock l(mu_);
      if (bodyless) Finish(lane, s, !close && buf.empty());
      PostLocked({Event::kHead, s, head->status, std::move(fields), !bodyless, "", 0});
    }
    if (bodyless) return;
    if (!te.empty()) {
      // RelayHttp has checked the framing; this only takes it apart.
      for (;;) {
        size_t eol;
        while ((eol = buf.find("\r\n")) == std::string::npos) {
          if (buf.size() > kMaxLine || !More(lane, buf)) return fail("a response chunk cut short");
        }
        uint64_t size = 0;
        size_t i = 0;
        for (; i < eol && std::isxdigit(static_cast<unsigned char>(buf[i])); ++i) {
          if (size >> 56) return fail("a response chunk size out of range");
          char c = AsciiLower(buf[i]);
          size = size * 16 + static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
        }
        if (i == 0) return fail("a malformed response chunk size");
        buf.erase(0, eol + 2);
        if (size == 0) {
          // Trailer fields, dropped, up to the blank line.
          for (;;) {
            while ((eol = buf.find("\r\n")) == std::string::npos) {
              if (buf.size() > kMaxLine || !More(lane, buf))
                return fail("response trailers cut short");
            }
            bool blank = eol == 0;
            buf.erase(0, eol + 2);
            if (blank) break;
          }
          Deliver(s, "", &lane, !close && buf.empty());
          return;
        }
        while (size > 0) {
          if (buf.empty() && !More(lane, buf)) return fail("a response chunk cut short");
          size_t n = static_cast<size_t>(std::min<uint64_t>(size, buf.size()));
          if (!Deliver(s, std::string_view(buf).substr(0, n))) return;
          buf.erase(0, n);
          size -= n;
        }
        while (buf.size() < 2) {
          if (!More(lane, buf)) return fail("a response chunk cut short");
        }
        if (buf.compare(0, 2, "\r\n") != 0) return fail("a malformed response chunk");
        buf.erase(0, 2);
      }
    }
    if (!cl.empty()) {
      uint64_t left = std::strtoull(cl.c_str(), nullptr, 10);
      while (left > 0) {
        if (buf.empty() && !More(lane, buf)) return fail("the upstream's response body cut short");
        size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
        if (!Deliver(s, std::string_view(buf).substr(0, n))) return;
        buf.erase(0, n);
        left -= n;
      }
      Deliver(s, "", &lane, !close && buf.empty());
      return;
    }
    // No length: the body runs to the connection's end, and the lane ends with it.
    for (;;) {
      if (!buf.empty()) {
        if (!Deliver(s, buf)) return;
        buf.clear();
      }
      if (!More(lane, buf)) break;
    }
    Deliver(s, "", &lane, false);
  }

  ByteStream& guest_;
  const UpstreamDialer& dial_;
  const SecretSet& secrets_;
  const std::string host_;
  const InterceptLimits limits_;
  const HttpRules* rules_;

  // The session thread's own.
  nghttp2_session* session_ = nullptr;
  std::map<int32_t, std::shared_ptr<Stream>> streams_;
  InterceptResult result_;

  Mutex mu_;
  CondVar cv_;     // the session's events and guest bytes; lanes' assignments and ends
  CondVar space_;  // room in a response buffer or the guest backlog
  std::string guest_in_ GUARDED_BY(mu_);
  bool guest_eof_ GUARDED_BY(mu_) = false;
  bool eof_seen_ GUARDED_BY(mu_) = false;
  bool guest_failed_ GUARDED_BY(mu_) = false;
  std::string guest_error_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::deque<Event> events_ GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Lane>> lanes_ GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Lane>> idle_ GUARDED_BY(mu_);
};

}  // namespace

InterceptResult RelayHttp2(ByteStream& guest, const UpstreamDialer& dial, const SecretSet& secrets,
                           const std::string& host, const InterceptLimits& limits,
                           const HttpRules* rules) {
  Session session(guest, dial, secrets, host, limits, rules);
  return session.Run();
}

}  // namespace trybox::egress
