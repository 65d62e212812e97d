#include "egress/intercept.h"

#include <string.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <deque>
#include <functional>
#include <set>
#include <thread>

#include "egress/hostname.h"
#include "egress/scrub.h"
#include "util/ascii.h"
#include "util/mutex.h"
#include "util/utf8.h"

namespace trybox::egress {
namespace {

using Clock = std::chrono::steady_clock;
using Headers = std::vector<std::pair<std::string, std::string>>;

constexpr size_t kBodyRead = 256 * 1024;
// Heads are read in smaller pieces: FdStream::Read allocates (and zeroes) `max` bytes.
constexpr size_t kHeadRead = 16 * 1024;
// Pieces at least this big are written as they are instead of copied into the write buffer.
constexpr size_t kDirectWrite = 64 * 1024;
constexpr size_t kMaxChunkLine = 4096;

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

size_t CountHeaders(const Headers& h, std::string_view name) {
  return static_cast<size_t>(std::count_if(
      h.begin(), h.end(), [&](const auto& f) { return AsciiEqualsIgnoreCase(f.first, name); }));
}

// The comma-separated elements of every `name` field, trimmed and lowercased; empty ones skipped.
std::vector<std::string> Elements(const Headers& h, std::string_view name) {
  std::vector<std::string> out;
  for (const auto& [n, value] : h) {
    if (!AsciiEqualsIgnoreCase(n, name)) continue;
    std::string_view rest = value;
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view e = TrimOws(rest.substr(0, comma));
      if (!e.empty()) out.push_back(AsciiLower(e));
      rest.remove_prefix(comma == std::string_view::npos ? rest.size() : comma + 1);
    }
  }
  return out;
}

bool HasElement(const Headers& h, std::string_view name, std::string_view element) {
  auto e = Elements(h, name);
  return std::find(e.begin(), e.end(), element) != e.end();
}

// An Accept-Encoding value with only the codings the relay can decode to scrub a response
// (gzip, deflate, identity), each element as it came; "identity" if none is left.
std::string InspectableCodings(std::string_view value) {
  std::string out;
  std::string_view rest = value;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view e = TrimOws(rest.substr(0, comma));
    std::string coding = AsciiLower(TrimOws(e.substr(0, e.find(';'))));
    if (coding == "gzip" || coding == "x-gzip" || coding == "deflate" || coding == "identity") {
      if (!out.empty()) out += ", ";
      out.append(e);
    }
    rest.remove_prefix(comma == std::string_view::npos ? rest.size() : comma + 1);
  }
  return out.empty() ? "identity" : out;
}

void Wipe(std::string& s) {
  if (!s.empty()) ::explicit_bzero(s.data(), s.size());
  s.clear();
}

// How a message's body is delimited (RFC 9112 section 6).
struct Framing {
  enum Kind { kNone, kLength, kChunked, kUntilClose } kind = kNone;
  uint64_t length = 0;
  bool only_chunked = false;  // Transfer-Encoding is exactly "chunked"
};

// One Content-Length, or a list of identical values (RFC 9110 section 8.6).
Result<std::optional<uint64_t>> ContentLength(const Headers& h) {
  std::optional<uint64_t> len;
  for (const auto& [name, value] : h) {
    if (!AsciiEqualsIgnoreCase(name, "content-length")) continue;
    std::string_view rest = value;
    for (;;) {
      size_t comma = rest.find(',');
      std::string_view e = TrimOws(rest.substr(0, comma));
      if (!IsDigits(e) || e.size() > 18) return InvalidArgument("Content-Length is not a number");
      uint64_t v = std::stoull(std::string(e));
      if (len && *len != v) return InvalidArgument("differing Content-Length values");
      len = v;
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return len;
}

Result<Framing> BodyFraming(const Headers& h, bool request) {
  ASSIGN_OR_RETURN(std::optional<uint64_t> len, ContentLength(h));
  if (CountHeaders(h, "transfer-encoding") == 0) {
    if (len) return Framing{Framing::kLength, *len};
    return Framing{request ? Framing::kNone : Framing::kUntilClose};
  }
  // Two framings are how requests are smuggled past one parser to another.
  if (len) return InvalidArgument("both Transfer-Encoding and Content-Length");
  std::vector<std::string> codings = Elements(h, "transfer-encoding");
  for (auto& c : codings) c = std::string(TrimOws(c.substr(0, c.find(';'))));
  size_t chunked = std::count(codings.begin(), codings.end(), "chunked");
  if (chunked == 1 && codings.back() == "chunked") {
    return Framing{Framing::kChunked, 0, codings.size() == 1};
  }
  if (request || chunked > 0) {
    return InvalidArgument("Transfer-Encoding must end in chunked, applied once");
  }
  return Framing{Framing::kUntilClose};
}

// The host a Host field names, canonical; a port is allowed and ignored.
Result<std::string> HostOf(std::string_view v) {
  v = TrimOws(v);
  size_t colon = v.rfind(':');
  if (colon != std::string_view::npos) {
    std::string_view port = v.substr(colon + 1);
    if (!IsDigits(port) || port.size() > 5) return InvalidArgument("bad port in Host");
    v = v.substr(0, colon);
  }
  return CanonicalHostname(v);
}

// "Basic <b64>" -> the scheme as sent and the decoded "user:pass"; nullopt for any other
// scheme or credentials that are not base64 (missing padding is tolerated).
std::optional<std::pair<std::string, std::string>> DecodeBasic(std::string_view value) {
  size_t sp = value.find(' ');
  if (sp == std::string_view::npos || !AsciiEqualsIgnoreCase(value.substr(0, sp), "basic"))
    return std::nullopt;
  std::string b64(TrimOws(value.substr(sp + 1)));
  if (b64.size() % 4 == 1) return std::nullopt;
  while (b64.size() % 4 != 0) b64 += '=';
  auto text = Base64Decode(b64);
  if (!text.ok()) return std::nullopt;
  return std::make_pair(std::string(value.substr(0, sp)), std::move(*text));
}

enum class Into { kTarget, kText };

// Bytes that keep their meaning anywhere in a request target.
bool TargetSafe(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("-._~!$'()*,:@").find(c) != std::string_view::npos;
}

// Replaces placeholders by values in one pass, left to right, so that a value put in is never
// searched again.
class Substituter {
 public:
  void Add(const Secret* s) { secrets_.push_back(s); }
  bool empty() const { return secrets_.empty(); }

  // `text` with every placeholder replaced, or nullopt if none occurs. Names of the secrets
  // put in are added to `used`.
  std::optional<std::string> Apply(std::string_view text, Into into,
                                   std::set<std::string>* used) const {
    std::vector<size_t> at(secrets_.size());
    bool any = false;
    for (size_t i = 0; i < secrets_.size(); ++i) {
      at[i] = text.find(secrets_[i]->placeholder);
      any = any || at[i] != std::string_view::npos;
    }
    if (!any) return std::nullopt;
    std::string out;
    out.reserve(text.size() + 64);
    size_t pos = 0;
    for (;;) {
      size_t best = std::string_view::npos;
      size_t which = 0;
      for (size_t i = 0; i < at.size(); ++i) {
        if (at[i] < best) {
          best = at[i];
          which = i;
        }
      }
      if (best == std::string_view::npos) break;
      const Secret& s = *secrets_[which];
      out.append(text.substr(pos, best - pos));
      if (into == Into::kText) {
        out.append(s.value.view());
      } else {
        static constexpr char kHex[] = "0123456789ABCDEF";
        for (char c : s.value.view()) {
          if (TargetSafe(c)) {
            out += c;
          } else {
            auto u = static_cast<unsigned char>(c);
            char pct[3] = {'%', kHex[u >> 4], kHex[u & 15]};
            out.append(pct, 3);
          }
        }
      }
      used->insert(s.name);
      pos = best + s.placeholder.size();
      for (size_t i = 0; i < at.size(); ++i) {
        if (at[i] != std::string_view::npos && at[i] < pos) {
          at[i] = text.find(secrets_[i]->placeholder, pos);
        }
      }
    }
    out.append(text.substr(pos));
    return out;
  }

 private:
  std::vector<const Secret*> secrets_;
};

// Writes to one stream through a buffer, so framing lines and small pieces leave in few
// writes, and counts what was written. The matching Input flushes it before every blocking
// read, so nothing waits in the buffer while the relay waits. `mu` serialises writes with
// the one other writer a stream may have (RelayHttp's made-up 100 Continue).
class Output {
 public:
  Output(ByteStream& s, std::atomic<int64_t>& written, Mutex& mu, bool wipe, const char* name)
      : s_(s), written_(written), mu_(mu), wipe_(wipe), name_(name) {}

  Status Add(std::string_view b) {
    if (b.size() >= kDirectWrite) {
      RETURN_IF_ERROR(Flush());
      return WriteNow(b);
    }
    if (pending_.size() + b.size() > kBodyRead) RETURN_IF_ERROR(Flush());
    pending_.append(b);
    return Status::Ok();
  }

  Status Flush() {
    if (pending_.empty()) return Status::Ok();
    Status s = WriteNow(pending_);
    if (wipe_) ::explicit_bzero(pending_.data(), pending_.size());
    pending_.clear();
    return s;
  }

  Status CloseWrite() {
    RETURN_IF_ERROR(Flush());
    MutexLock l(mu_);
    Status s = s_.CloseWrite();
    return s.ok() ? s : s.Annotate(std::string("closing ") + name_);
  }

 private:
  Status WriteNow(std::string_view b) {
    MutexLock l(mu_);
    Status s = s_.Write(b);
    if (!s.ok()) return s.Annotate(std::string("writing to ") + name_);
    written_ += static_cast<int64_t>(b.size());
    return s;
  }

  ByteStream& s_;
  std::atomic<int64_t>& written_;
  Mutex& mu_;
  bool wipe_;  // the buffer held substituted values
  const char* name_;
  std::string pending_;
};

// Reads from one stream into a buffer for the parsers; body bytes bypass it once it is
// empty. The peer's end and a failure are remembered, so a second look sees the same.
class Input {
 public:
  Input(ByteStream& s, Output& flush_first, const char* name)
      : s_(s), flush_(flush_first), name_(name) {}

  std::string_view buffered() const { return std::string_view(buf_).substr(pos_); }
  void Consume(size_t n) {
    pos_ += n;
    if (pos_ == buf_.size()) buf_.clear(), pos_ = 0;
  }
  const char* name() const { return name_; }

  // Appends the next bytes to the buffer; false at the peer's clean end.
  Result<bool> Fill(std::optional<Clock::time_point> deadline = std::nullopt) {
    ASSIGN_OR_RETURN(std::string got, Next(kHeadRead, deadline));
    if (got.empty()) return false;
    if (pos_ > 0) buf_.erase(0, pos_), pos_ = 0;
    if (buf_.empty()) {
      buf_ = std::move(got);
    } else {
      buf_ += got;
    }
    return true;
  }

  // The next bytes past the buffer (callers use the buffer first): "" at the clean end.
  Result<std::string> Next(size_t max, std::optional<Clock::time_point> deadline = std::nullopt) {
    RETURN_IF_ERROR(flush_.Flush());
    if (eof_) return std::string();
    if (!failed_.ok()) return failed_;
    auto got = s_.Read(max, deadline);
    if (!got.ok()) {
      if (got.status().code() == Code::kDeadlineExceeded) return got.status();
      failed_ = Unavailable(std::string("reading from ") + name_ + ": " + got.status().message());
      return failed_;
    }
    if (got->empty()) eof_ = true;
    return got;
  }

 private:
  ByteStream& s_;
  Output& flush_;
  const char* name_;
  std::string buf_;
  size_t pos_ = 0;
  bool eof_ = false;
  Status failed_;
};

// A gzip or deflate body decoded as it comes (RFC 9110 section 8.4.1). "deflate" is the
// zlib format, or raw deflate as some servers send it (told apart by the zlib header).
class Inflater {
 public:
  enum class Kind { kGzip, kDeflate };
  explicit Inflater(Kind kind) : kind_(kind) {}
  ~Inflater() {
    if (init_) ::inflateEnd(&z_);
  }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  // Decodes `in`, handing each piece of output to `emit`.
  Status Feed(std::string_view in, const std::function<Status(std::string_view)>& emit) {
    if (ended_ || in.empty()) return Status::Ok();  // bytes after the end are dropped
    if (!init_) {
      start_.append(in);
      if (kind_ == Kind::kDeflate && start_.size() < 2) return Status::Ok();
      int bits = 15 + 32;  // gzip (or zlib) by its header
      if (kind_ == Kind::kDeflate) {
        auto cmf = static_cast<unsigned char>(start_[0]),
             flg = static_cast<unsigned char>(start_[1]);
        bool zlib = (cmf & 0x0F) == 8 && ((cmf << 8) | flg) % 31 == 0;
        bits = zlib ? 15 : -15;
      }
      if (::inflateInit2(&z_, bits) != Z_OK) return Internal("inflateInit2 failed");
      init_ = true;
      std::string first = std::move(start_);
      return Run(first, emit);
    }
    return Run(in, emit);
  }

  // The body ended: an error if the compressed stream had not.
  Status Finish() {
    if (!ended_) return Unavailable("the compressed body ended before its compressed stream did");
    return Status::Ok();
  }

 private:
  Status Run(std::string_view in, const std::function<Status(std::string_view)>& emit) {
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    z_.avail_in = static_cast<uInt>(in.size());
    std::string out(64 * 1024, '\0');
    while (z_.avail_in > 0 && !ended_) {
      z_.next_out = reinterpret_cast<Bytef*>(out.data());
      z_.avail_out = static_cast<uInt>(out.size());
      int rc = ::inflate(&z_, Z_NO_FLUSH);
      size_t got = out.size() - z_.avail_out;
      if (got > 0) RETURN_IF_ERROR(emit(std::string_view(out.data(), got)));
      if (rc == Z_STREAM_END) {
        // gzip may have members one after another; anything else after the end is dropped.
        bool member = kind_ == Kind::kGzip && z_.avail_in >= 2 && z_.next_in[0] == 0x1f &&
                      z_.next_in[1] == 0x8b;
        if (!member) {
          ended_ = true;
          break;
        }
        if (::inflateReset(&z_) != Z_OK) return Internal("inflateReset failed");
        continue;
      }
      if (rc == Z_BUF_ERROR && got == 0) break;
      if (rc != Z_OK && rc != Z_BUF_ERROR) {
        return InvalidArgument("the compressed body does not decode (zlib error " +
                               std::to_string(rc) + ")");
      }
    }
    return Status::Ok();
  }

  const Kind kind_;
  z_stream z_{};
  bool init_ = false;
  bool ended_ = false;
  std::string start_;
};

// Where a body goes: to the output as it came, or, while capturing, into memory (the bytes
// as they came in raw(), the payload in data()) up to a cap; past it `spill` sends what was
// held and the rest goes to the output.
class BodySink {
 public:
  explicit BodySink(Output& out) : out_(out) {}
  ~BodySink() {
    Wipe(raw_);
    Wipe(data_);
  }

  void Capture(size_t cap, std::function<Status(std::string_view held)> spill) {
    capturing_ = true;
    cap_ = cap;
    spill_ = std::move(spill);
  }
  bool capturing() const { return capturing_; }
  std::string& raw() { return raw_; }
  std::string& data() { return data_; }

  // A response body for the guest, scrubbed of secret values (and decoded first by `inflate`,
  // if given): the incoming framing is dropped, and the payload goes out in chunks of its own
  // when `chunk`, else as it is (the scrubbing keeps its length when nothing decodes it).
  void Scrub(ScrubStream* scrub, Inflater* inflate, bool chunk) {
    scrub_ = scrub;
    inflate_ = inflate;
    chunk_ = chunk;
  }
  // The end of a scrubbed body: what the scrubber held, and the last chunk.
  Status End() {
    if (scrub_ == nullptr) return Status::Ok();
    if (inflate_) RETURN_IF_ERROR(inflate_->Finish());
    std::string rest;
    scrub_->Finish(&rest);
    RETURN_IF_ERROR(Put(rest));
    return chunk_ ? out_.Add("0\r\n\r\n") : Status::Ok();
  }

  Status Framing(std::string_view b) {
    if (scrub_) return Status::Ok();
    if (!capturing_) return out_.Add(b);
    raw_.append(b);
    return Status::Ok();
  }
  // Called before `n` payload bytes.
  Status Reserve(uint64_t n) {
    if (!capturing_ || data_.size() + n <= cap_) return Status::Ok();
    capturing_ = false;
    Status s = spill_(raw_);
    Wipe(raw_);
    Wipe(data_);
    return s;
  }
  Status Data(std::string_view b) {
    if (scrub_) {
      if (!inflate_) return Scrubbed(b);
      return inflate_->Feed(b, [this](std::string_view d) { return Scrubbed(d); });
    }
    if (!capturing_) return out_.Add(b);
    raw_.append(b);
    data_.append(b);
    return Status::Ok();
  }

 private:
  Status Scrubbed(std::string_view b) {
    std::string out;
    scrub_->Feed(b, &out);
    return Put(out);
  }
  Status Put(std::string_view b) {
    if (b.empty()) return Status::Ok();
    if (!chunk_) return out_.Add(b);
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", b.size());
    RETURN_IF_ERROR(out_.Add(size));
    RETURN_IF_ERROR(out_.Add(b));
    return out_.Add("\r\n");
  }

  Output& out_;
  ScrubStream* scrub_ = nullptr;
  Inflater* inflate_ = nullptr;
  bool chunk_ = false;
  bool capturing_ = false;
  size_t cap_ = 0;
  std::function<Status(std::string_view)> spill_;
  std::string raw_;
  std::string data_;
};

// Exactly `n` payload bytes.
Status RelayLength(Input& in, BodySink& sink, uint64_t n) {
  while (n > 0) {
    std::string_view b = in.buffered();
    if (!b.empty()) {
      size_t take = static_cast<size_t>(std::min<uint64_t>(n, b.size()));
      RETURN_IF_ERROR(sink.Data(b.substr(0, take)));
      in.Consume(take);
      n -= take;
      continue;
    }
    ASSIGN_OR_RETURN(std::string got,
                     in.Next(static_cast<size_t>(std::min<uint64_t>(n, kBodyRead))));
    if (got.empty()) return Unavailable(std::string(in.name()) + " closed in the middle of a body");
    RETURN_IF_ERROR(sink.Data(got));
    n -= got.size();
  }
  return Status::Ok();
}

// The length, CRLF included, of the line at the front of the buffer.
Result<size_t> Line(Input& in, size_t cap, const char* what) {
  for (;;) {
    std::string_view b = in.buffered();
    size_t crlf = b.find("\r\n");
    size_t bad = b.substr(0, crlf).find_first_of("\r\n");
    // A CR at the very end may yet be followed by its LF.
    if (bad != std::string_view::npos &&
        !(crlf == std::string_view::npos && bad + 1 == b.size() && b[bad] == '\r')) {
      return InvalidArgument(std::string("bare CR or LF in ") + what);
    }
    if (crlf != std::string_view::npos) {
      if (crlf + 2 > cap) return InvalidArgument(std::string(what) + " too long");
      return crlf + 2;
    }
    if (b.size() >= cap) return InvalidArgument(std::string(what) + " too long");
    ASSIGN_OR_RETURN(bool more, in.Fill());
    if (!more) return Unavailable(std::string(in.name()) + " closed in the middle of " + what);
  }
}

// "1A;ext=v" -> 26. Extensions are ignored but may hold no control bytes.
Result<uint64_t> ChunkSize(std::string_view line) {
  uint64_t v = 0;
  size_t i = 0;
  for (; i < line.size() && std::isxdigit(static_cast<unsigned char>(line[i])); ++i) {
    if (i == 15) return InvalidArgument("chunk size too large");
    char c = line[i];
    v = v * 16 + static_cast<uint64_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
  }
  if (i == 0) return InvalidArgument("chunk size is not hexadecimal");
  // Whitespace only before an extension's ';' (RFC 9112 section 7.1.1).
  std::string_view rest = line.substr(i);
  size_t ext = rest.find_first_not_of(" \t");
  if (!rest.empty() && (ext == std::string_view::npos || rest[ext] != ';')) {
    return InvalidArgument("junk after a chunk size");
  }
  if (std::any_of(rest.begin(), rest.end(), IsHttpCtl)) {
    return InvalidArgument("control byte in a chunk extension");
  }
  return v;
}

// A chunked body through its last chunk and trailer section, bytes as they came.
Status RelayChunked(Input& in, BodySink& sink, size_t max_trailers, bool* had_trailers) {
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, Line(in, kMaxChunkLine, "a chunk-size line"));
    std::string_view line = in.buffered().substr(0, n);
    ASSIGN_OR_RETURN(uint64_t size, ChunkSize(line.substr(0, n - 2)));
    RETURN_IF_ERROR(sink.Framing(line));
    in.Consume(n);
    if (size == 0) break;
    RETURN_IF_ERROR(sink.Reserve(size));
    RETURN_IF_ERROR(RelayLength(in, sink, size));
    ASSIGN_OR_RETURN(size_t end, Line(in, 2, "the CRLF after a chunk"));
    RETURN_IF_ERROR(sink.Framing(in.buffered().substr(0, end)));
    in.Consume(end);
  }
  size_t total = 0;
  for (;;) {
    if (max_trailers < total + 2) return InvalidArgument("trailer section too long");
    ASSIGN_OR_RETURN(size_t n, Line(in, max_trailers - total, "the trailer section"));
    std::string_view line = in.buffered().substr(0, n);
    if (n > 2) {
      size_t colon = line.find(':');
      if (colon == std::string_view::npos || !IsHttpToken(line.substr(0, colon)) ||
          std::any_of(line.begin() + colon, line.end() - 2, IsHttpCtl)) {
        return InvalidArgument("malformed trailer field");
      }
      *had_trailers = true;
    }
    RETURN_IF_ERROR(sink.Framing(line));
    in.Consume(n);
    total += n;
    if (n == 2) return Status::Ok();
  }
}

Status RelayUntilEof(Input& in, BodySink& sink) {
  if (!in.buffered().empty()) {
    RETURN_IF_ERROR(sink.Data(in.buffered()));
    in.Consume(in.buffered().size());
  }
  for (;;) {
    ASSIGN_OR_RETURN(std::string got, in.Next(kBodyRead));
    if (got.empty()) return Status::Ok();
    RETURN_IF_ERROR(sink.Data(got));
  }
}

// A request the response thread is to answer, in order: its response from upstream, or a
// refusal made up by the request thread.
struct Pending {
  bool refusal = false;
  std::string response;  // a refusal's bytes
  std::string method;
  std::string version;  // the request's
  uint64_t seq = 0;
  bool upgrade = false;  // asked to switch protocols: the request thread waits for the answer
  bool last = false;     // asked to close the connection after its response
};

struct EditedHead {
  std::string target;
  Headers headers;
};

// One connection. The request thread (the caller's) parses and forwards requests and pushes
// a Pending for each; the response thread relays responses in that order. Every guest write
// is the response thread's, but for a made-up 100 Continue written while it is idle.
class Relay {
 public:
  Relay(ByteStream& guest, ByteStream& upstream, const SecretSet& secrets, const std::string& host,
        const InterceptLimits& limits, const HttpRules* rules)
      : guest_(guest),
        upstream_(upstream),
        secrets_(secrets),
        rules_(rules),
        host_(host),
        limits_(limits),
        guest_out_(guest, bytes_down_, guest_mu_, false, "the guest"),
        up_out_(upstream, bytes_up_, up_mu_, true, "the upstream") {
    std::vector<const Secret*> bound;
    for (const auto& s : secrets.secrets()) {
      if (!s.BoundTo(host)) continue;
      head_subst_.Add(&s);
      if (s.target) target_subst_.Add(&s);
      if (s.body) body_subst_.Add(&s);
      keep_cookies_ = keep_cookies_ || s.keep_cookies;
      bound.push_back(&s);
    }
    scrubber_ = Scrubber(std::move(bound));
    MutexLock l(mu_);
    last_response_ = Clock::now();
  }

  InterceptResult Run() {
    std::thread responses([this] { Responses(); });
    Requests();
    responses.join();
    InterceptResult r;
    r.requests = requests_;
    r.substitutions = substitutions_;
    r.bytes_up = bytes_up_.load();
    r.bytes_down = bytes_down_.load();
    MutexLock l(mu_);
    r.scrubbed = scrubbed_;
    r.refused_status = refused_status_;
    r.refused_reason = refused_reason_;
    r.upgraded = raw_;
    r.error = error_;
    return r;
  }

 private:
  enum class After { kNext, kStop, kDrain, kRaw };
  enum class Answer { kAbort, kClose, k502 };

  // ---- Request thread.

  void Requests() {
    Input in(guest_, up_out_, "the guest");
    After after = After::kNext;
    while (after == After::kNext) {
      std::string raw;
      auto head = ReadRequestHead(in, &raw);
      if (!head.ok()) {
        const Status& s = head.status();
        if (s.code() == Code::kResourceExhausted) {
          Refuse(431, s.message());
        } else if (s.code() == Code::kInvalidArgument) {
          Refuse(400, "malformed request: " + s.message());
        } else if (s.code() == Code::kDeadlineExceeded) {
          Refuse(408, s.message());
        } else {
          FailUnlessEnded(s.message());
        }
        after = After::kStop;
      } else if (!head->has_value()) {
        // The guest closed its side, or stayed idle too long, between requests.
        (void)up_out_.CloseWrite();
        after = After::kStop;
      } else {
        after = Forward(in, **head, raw);
      }
    }
    if (after == After::kDrain) Drain(in);
    if (after == After::kRaw) RawUp(in);
    bool wake;
    {
      MutexLock l(mu_);
      request_done_ = true;
      request_finished_ = true;
      // The response thread may be blocked reading an idle upstream: only an Abort wakes it,
      // and nothing is outstanding there to lose.
      wake = !raw_ && !response_done_ && !in_progress_ &&
             (fifo_.empty() || (fifo_.size() == 1 && fifo_.front().refusal));
    }
    if (wake) upstream_.Abort();
  }

  Result<std::optional<RequestHead>> ReadRequestHead(Input& in, std::string* raw) {
    std::optional<Clock::time_point> started;
    for (;;) {
      // RFC 9112 section 2.2: empty lines before a request line are ignored.
      while (in.buffered().substr(0, 2) == "\r\n") {
        in.Consume(2);
        if (!started) started = Clock::now();
      }
      if (!in.buffered().empty()) {
        if (!started) started = Clock::now();
        auto parsed = ParseRequestHead(in.buffered(), limits_.max_head);
        if (!parsed.ok()) return parsed.status();
        if (parsed->has_value()) {
          raw->assign(in.buffered().substr(0, (*parsed)->size));
          in.Consume((*parsed)->size);
          return std::move(*parsed);
        }
      }
      auto more = in.Fill(started ? *started + limits_.head_timeout : IdleDeadline());
      if (!more.ok()) {
        if (more.status().code() != Code::kDeadlineExceeded) {
          return Unavailable(more.status().message());
        }
        if (started) {
          return DeadlineExceeded("request head not complete within " +
                                  std::to_string(limits_.head_timeout.count()) + " ms");
        }
        if (IdleExpired()) return std::optional<RequestHead>();
        continue;
      }
      if (!*more) {
        if (in.buffered().empty()) return std::optional<RequestHead>();
        return Unavailable("the guest closed its side in the middle of a request head");
      }
    }
  }

  // The idle clock runs only while no response is outstanding: a slow answer is not idleness.
  Clock::time_point IdleDeadline() {
    MutexLock l(mu_);
    if (in_progress_ || !fifo_.empty()) return Clock::now() + limits_.head_timeout;
    return last_response_ + limits_.head_timeout;
  }

  bool IdleExpired() {
    MutexLock l(mu_);
    return !in_progress_ && fifo_.empty() && Clock::now() >= last_response_ + limits_.head_timeout;
  }

  After Forward(Input& in, const RequestHead& head, const std::string& raw) {
    if (head.method == "TRACE" || head.method == "TRACK") {
      return Refuse(405, head.method +
                             " is refused inside an intercepted tunnel: its answer echoes the "
                             "request, secrets and all");
    }
    if (head.target.front() != '/' && !(head.target == "*" && head.method == "OPTIONS")) {
      return Refuse(400,
                    "the request target must be origin-form (/path) inside the tunnel to " + host_);
    }
    if (CountHeaders(head.headers, "host") != 1) {
      return Refuse(400, "a request needs exactly one Host header");
    }
    for (const auto& [name, value] : head.headers) {
      if (!AsciiEqualsIgnoreCase(name, "host")) continue;
      auto named = HostOf(value);
      if (!named.ok() || *named != host_) {
        return Refuse(
            403, "the Host header does not name " + host_ + ", the host this tunnel was opened to");
      }
    }
    auto framing = BodyFraming(head.headers, true);
    if (!framing.ok()) return Refuse(400, "malformed request: " + framing.status().message());
    if (framing->kind == Framing::kChunked && head.version == "HTTP/1.0") {
      return Refuse(400, "malformed request: Transfer-Encoding in an HTTP/1.0 request");
    }
    if (rules_) {
      if (std::string why = rules_->Check(host_, head.method, head.target); !why.empty()) {
        return Refuse(403, why);
      }
    }
    if (const Secret* f = secrets_.ForeignPlaceholder(raw, host_)) return RefuseForeign(*f);

    std::set<std::string> used;
    const Secret* foreign = nullptr;
    EditedHead edited = Edit(head, &used, &foreign);
    if (foreign) return RefuseForeign(*foreign);

    Pending p;
    p.method = head.method;
    p.version = head.version;
    p.upgrade = CountHeaders(head.headers, "upgrade") > 0;
    p.last = HasElement(head.headers, "connection", "close") ||
             (head.version == "HTTP/1.0" && !HasElement(head.headers, "connection", "keep-alive"));

    bool buffer =
        !body_subst_.empty() && ((framing->kind == Framing::kLength && framing->length > 0 &&
                                  framing->length <= limits_.max_buffered_body) ||
                                 (framing->kind == Framing::kChunked && framing->only_chunked));
    Status relayed;
    if (!buffer) {
      if (!BeginForward(p, edited, head, false, std::nullopt, used)) return After::kStop;
      BodySink sink(up_out_);
      bool trailers = false;
      if (framing->kind == Framing::kLength) relayed = RelayLength(in, sink, framing->length);
      if (framing->kind == Framing::kChunked) {
        relayed = RelayChunked(in, sink, limits_.max_head, &trailers);
      }
    } else {
      // The client may wait for a 100 before it sends the body that is needed before the
      // head can go: answer it here, and drop the Expect the upstream no longer needs to see.
      bool expect =
          head.version == "HTTP/1.1" && HasElement(head.headers, "expect", "100-continue");
      bool continued = expect && Continue();
      bool ended = false;
      BodySink sink(up_out_);
      sink.Capture(limits_.max_buffered_body, [&](std::string_view held) -> Status {
        if (!BeginForward(p, edited, head, continued, std::nullopt, used)) {
          ended = true;
          return Cancelled("the connection ended");
        }
        return up_out_.Add(held);
      });
      bool trailers = false;
      if (framing->kind == Framing::kLength) {
        relayed = RelayLength(in, sink, framing->length);
      } else {
        relayed = RelayChunked(in, sink, limits_.max_head, &trailers);
      }
      if (ended) return After::kStop;
      // Nothing went upstream yet, so a malformed body can still be answered.
      if (relayed.code() == Code::kInvalidArgument && sink.capturing()) {
        return Refuse(400, "malformed request body: " + relayed.message());
      }
      if (relayed.ok() && sink.capturing()) {
        if (const Secret* f = secrets_.ForeignPlaceholder(sink.data(), host_)) {
          return RefuseForeign(*f);
        }
        std::optional<std::string> body;
        if (!trailers) body = body_subst_.Apply(sink.data(), Into::kText, &used);
        if (!body) {
          // Nothing to put in (or trailers that a Content-Length body could not carry): the
          // body goes as it came, framing and all.
          if (!BeginForward(p, edited, head, continued, std::nullopt, used)) return After::kStop;
          relayed = up_out_.Add(sink.raw());
        } else {
          if (!BeginForward(p, edited, head, continued, body->size(), used)) {
            Wipe(*body);
            return After::kStop;
          }
          relayed = up_out_.Add(*body);
          Wipe(*body);
        }
      }
    }
    if (relayed.ok()) relayed = up_out_.Flush();
    if (!relayed.ok()) {
      FailUnlessEnded(relayed.message());
      return After::kStop;
    }
    if (p.upgrade) {
      MutexLock l(mu_);
      while (decided_ < p.seq && !response_done_ && !stopping_) cv_.Wait(mu_);
      if (decided_ < p.seq) return After::kStop;
      if (switched_) return After::kRaw;
    }
    return p.last ? After::kDrain : After::kNext;
  }

  // The head with bound placeholders replaced, or `foreign` set if decoded Basic credentials
  // carry another secret's placeholder.
  EditedHead Edit(const RequestHead& head, std::set<std::string>* used, const Secret** foreign) {
    EditedHead e;
    e.target = target_subst_.Apply(head.target, Into::kTarget, used).value_or(head.target);
    for (const auto& [name, value] : head.headers) {
      std::optional<std::string> v = head_subst_.Apply(value, Into::kText, used);
      // Only codings the relay can decode, so that it can scrub what comes back.
      if (!scrubber_.empty() && AsciiEqualsIgnoreCase(name, "accept-encoding")) {
        v = InspectableCodings(v ? *v : value);
      }
      if (!v && (AsciiEqualsIgnoreCase(name, "authorization") ||
                 AsciiEqualsIgnoreCase(name, "proxy-authorization"))) {
        if (auto basic = DecodeBasic(value)) {
          if (const Secret* f = secrets_.ForeignPlaceholder(basic->second, host_)) {
            *foreign = f;
            return {};
          }
          if (auto text = head_subst_.Apply(basic->second, Into::kText, used)) {
            v = basic->first + " " + Base64Encode(*text);
            Wipe(*text);
          }
        }
      }
      e.headers.emplace_back(name, v ? std::move(*v) : value);
    }
    return e;
  }

  static std::string Serialize(const RequestHead& head, const EditedHead& e, bool drop_expect,
                               std::optional<uint64_t> length) {
    std::string out;
    out.reserve(head.size + 128);
    out.append(head.method).append(" ").append(e.target).append(" ").append(head.version);
    out.append("\r\n");
    bool length_written = false;
    for (const auto& [name, value] : e.headers) {
      if (drop_expect && AsciiEqualsIgnoreCase(name, "expect")) continue;
      if (length && (AsciiEqualsIgnoreCase(name, "content-length") ||
                     AsciiEqualsIgnoreCase(name, "transfer-encoding"))) {
        if (!length_written) out.append("Content-Length: ").append(std::to_string(*length));
        if (!length_written) out.append("\r\n");
        length_written = true;
        continue;
      }
      out.append(name).append(": ").append(value).append("\r\n");
    }
    out.append("\r\n");
    return out;
  }

  // Announces the request to the response thread and sends its head; false once the
  // connection has ended (the guest sees it closed and may retry).
  bool BeginForward(Pending& p, EditedHead& e, const RequestHead& head, bool drop_expect,
                    std::optional<uint64_t> length, const std::set<std::string>& used) {
    {
      MutexLock l(mu_);
      if (response_done_ || stopping_) return false;
      p.seq = ++seq_;
      fifo_.push_back(p);
    }
    std::string text = Serialize(head, e, drop_expect, length);
    Status s = up_out_.Add(text);
    Wipe(text);
    Wipe(e.target);
    for (auto& [name, value] : e.headers) Wipe(value);
    if (!s.ok()) {
      FailUnlessEnded(s.message());
      return false;
    }
    ++requests_;
    for (const auto& name : used) ++substitutions_[name];
    return true;
  }

  // Writes "100 Continue" to the guest if no response is on its way there (which it would
  // otherwise interleave); true if written.
  bool Continue() {
    {
      MutexLock l(mu_);
      if (in_progress_ || !fifo_.empty() || response_done_ || stopping_) return false;
    }
    static constexpr std::string_view k100 = "HTTP/1.1 100 Continue\r\n\r\n";
    MutexLock l(guest_mu_);
    if (!guest_.Write(k100).ok()) return false;
    bytes_down_ += static_cast<int64_t>(k100.size());
    return true;
  }

  // After a request that closes the connection: later bytes are not requests; read them until
  // the guest closes its side or the response thread ends the connection.
  void Drain(Input& in) {
    in.Consume(in.buffered().size());
    for (;;) {
      auto got = in.Next(kBodyRead);
      if (!got.ok()) return FailUnlessEnded(got.status().message());
      if (got->empty()) {
        (void)up_out_.CloseWrite();
        return;
      }
    }
  }

  // After a 101: every byte from `in` to `out` as it comes, then the end of the direction.
  static Status Raw(Input& in, Output& out) {
    Status s = out.Add(in.buffered());
    in.Consume(in.buffered().size());
    while (s.ok()) {
      auto got = in.Next(kBodyRead);
      if (!got.ok()) return got.status();
      if (got->empty()) return out.CloseWrite();
      s = out.Add(*got);
    }
    return s;
  }

  void RawUp(Input& in) {
    Status s = Raw(in, up_out_);
    if (!s.ok()) FailUnlessEnded(s.message());
  }

  After RefuseForeign(const Secret& s) {
    // The same words as the proxy's check of plain requests (docs/secrets.md).
    return Refuse(403, "the placeholder of secret " + s.name + " may go only to its hosts");
  }

  // Queues a refusal behind the responses still owed, so the guest reads them in order.
  After Refuse(int status, const std::string& reason) {
    MutexLock l(mu_);
    if (response_done_ || stopping_) return After::kStop;
    refused_status_ = status;
    refused_reason_ = reason;
    Pending p;
    p.refusal = true;
    p.response = RefusalResponse(status, reason);
    fifo_.push_back(std::move(p));
    return After::kStop;
  }

  // ---- Response thread.

  void Responses() {
    Input in(upstream_, guest_out_, "the upstream");
    for (;;) {
      std::optional<Pending> next;
      bool done = false;
      {
        MutexLock l(mu_);
        if (!fifo_.empty()) {
          next = std::move(fifo_.front());
          fifo_.pop_front();
          in_progress_ = !next->refusal;
        } else {
          done = request_done_;
        }
      }
      if (done) return EndResponses();
      if (!next) {
        if (!Idle(in)) return;
        continue;
      }
      if (next->refusal) return Refused(next->response);
      After after = Respond(in, *next);
      {
        MutexLock l(mu_);
        in_progress_ = false;
        last_response_ = Clock::now();
      }
      if (after == After::kStop) return;
      if (after == After::kDrain) return EndResponses();
      if (after == After::kRaw) return RawDown(in);
    }
  }

  // Nothing is asked of the upstream: waits for its bytes or its end, or for the request
  // thread's wake-up (an Abort). False once the response direction has ended.
  bool Idle(Input& in) {
    Result<bool> more = true;
    if (in.buffered().empty()) more = in.Fill();
    enum { kClean, kUnsolicited, kFailed } what;
    {
      MutexLock l(mu_);
      // What arrived (or the end) belongs to a request sent meanwhile, or a refusal goes first.
      if (!fifo_.empty()) return true;
      if (stopping_) return false;
      if (!more.ok()) {
        what = request_done_ ? kClean : kFailed;
      } else {
        what = *more ? kUnsolicited : kClean;
      }
    }
    if (what == kClean) {
      EndResponses();
    } else if (what == kUnsolicited) {
      FailResponse("the upstream sent bytes with no request outstanding", Answer::kClose);
    } else {
      FailResponse(more.status().message(), Answer::kAbort);
    }
    return false;
  }

  // Relays the answer to `p`: interim responses, then the final one with its body.
  After Respond(Input& in, const Pending& p) {
    const std::string what = "the response to request " + std::to_string(p.seq);
    bool interim = false;
    for (;;) {
      std::optional<ResponseHead> head;
      while (!head) {
        auto parsed = ParseResponseHead(in.buffered(), limits_.max_head);
        if (!parsed.ok()) {
          FailResponse(what + " is malformed: " + parsed.status().message(), Answer::k502);
          return After::kStop;
        }
        if (parsed->has_value()) {
          head = std::move(**parsed);
          break;
        }
        bool nothing = in.buffered().empty() && !interim;
        auto more = in.Fill();
        if (!more.ok()) {
          FailResponse(more.status().message(), Answer::k502);
          return After::kStop;
        }
        if (!*more) {
          // With nothing answered, a closed connection lets the client retry the request
          // (RFC 9112 section 9.3.1); a 502 would not.
          FailResponse(
              "the upstream closed the connection " +
                  std::string(nothing ? "without answering request " + std::to_string(p.seq)
                                      : "in the middle of " + what),
              nothing ? Answer::kClose : Answer::k502);
          return After::kStop;
        }
      }
      std::string_view raw = in.buffered();
      // The status line as it came (its reason phrase scrubbed).
      std::string out(raw.substr(0, raw.find("\r\n") + 2));
      if (!scrubber_.empty()) out = scrubber_.ScrubAll(out, &scrubbed_);
      Headers fields;
      for (const auto& [name, value] : head->headers) {
        // A session won with the secret would let the guest act with it, without it.
        if (!keep_cookies_ && (AsciiEqualsIgnoreCase(name, "set-cookie") ||
                               AsciiEqualsIgnoreCase(name, "set-cookie2"))) {
          continue;
        }
        fields.emplace_back(name,
                            scrubber_.empty() ? value : scrubber_.ScrubAll(value, &scrubbed_));
      }
      auto serialize = [&]() {
        for (const auto& [name, value] : fields)
          out.append(name).append(": ").append(value).append("\r\n");
        out.append("\r\n");
      };
      in.Consume(head->size);
      const int status = head->status;
      if (status / 100 == 1 && status != 101) {
        serialize();
        Status s = guest_out_.Add(out);
        if (!s.ok()) {
          FailResponse(what + ": " + s.message(), Answer::kAbort);
          return After::kStop;
        }
        interim = true;
        continue;
      }
      if (status == 101) {
        if (!p.upgrade) {
          FailResponse(what + " is a 101, but the request asked for no upgrade", Answer::k502);
          return After::kStop;
        }
        serialize();
        Status s = guest_out_.Add(out);
        if (s.ok()) s = guest_out_.Flush();
        if (!s.ok()) {
          FailResponse(what + ": " + s.message(), Answer::kAbort);
          return After::kStop;
        }
        MutexLock l(mu_);
        decided_ = p.seq;
        switched_ = true;
        raw_ = true;
        cv_.SignalAll();
        return After::kRaw;
      }
      if (p.upgrade) {
        MutexLock l(mu_);
        decided_ = p.seq;
        switched_ = false;
        cv_.SignalAll();
      }
      Framing framing;
      if (p.method != "HEAD" && status != 204 && status != 304) {
        auto f = BodyFraming(head->headers, false);
        if (!f.ok()) {
          FailResponse(what + " is malformed: " + f.status().message(), Answer::k502);
          return After::kStop;
        }
        framing = *f;
      }
      bool close =
          framing.kind == Framing::kUntilClose || p.last ||
          HasElement(head->headers, "connection", "close") ||
          (head->version == "HTTP/1.0" && !HasElement(head->headers, "connection", "keep-alive"));
      BodySink sink(guest_out_);
      ScrubStream scrub(scrubber_, /*fit=*/true);
      std::optional<Inflater> inflate;
      std::optional<ScrubStream> decoded;
      if (!scrubber_.empty() && framing.kind != Framing::kNone) {
        // A body is scrubbed only once it can be read: decoded when gzip or deflate, refused
        // when coded any other way.
        std::string cannot;
        bool transfer_coded = CountHeaders(head->headers, "transfer-encoding") > 0 &&
                              !(framing.kind == Framing::kChunked && framing.only_chunked);
        std::vector<std::string> codings = Elements(head->headers, "content-encoding");
        codings.erase(std::remove(codings.begin(), codings.end(), "identity"), codings.end());
        if (transfer_coded) {
          cannot = "a transfer coding besides chunked";
        } else if (codings.size() > 1) {
          cannot = "more than one content coding";
        } else if (codings.size() == 1 && codings[0] != "gzip" && codings[0] != "x-gzip" &&
                   codings[0] != "deflate") {
          cannot = "the content coding '" + codings[0].substr(0, 32) + "'";
        }
        if (!cannot.empty()) {
          FailResponse(what + " from " + host_ + " comes with " + cannot +
                           ", which the relay cannot read to take secret values out of it "
                           "(it asks only for gzip, deflate or identity)",
                       Answer::k502);
          return After::kStop;
        }
        if (codings.empty()) {
          // Each occurrence is replaced by as many bytes: the framing stays as it came.
          sink.Scrub(&scrub, nullptr, framing.kind == Framing::kChunked);
        } else {
          // Decoded, the body has another length: chunked where both sides speak HTTP/1.1,
          // else delimited by the connection's end.
          inflate.emplace(codings[0] == "deflate" ? Inflater::Kind::kDeflate
                                                  : Inflater::Kind::kGzip);
          bool chunk = p.version == "HTTP/1.1" && head->version == "HTTP/1.1";
          Headers kept;
          for (auto& [name, value] : fields) {
            bool drop = false;
            for (std::string_view n : {"content-encoding", "content-length", "transfer-encoding",
                                       "content-md5", "digest", "content-digest", "repr-digest"}) {
              drop = drop || AsciiEqualsIgnoreCase(name, n);
            }
            if (!drop) kept.emplace_back(std::move(name), std::move(value));
          }
          fields = std::move(kept);
          if (chunk) fields.emplace_back("Transfer-Encoding", "chunked");
          close = close || !chunk;
          decoded.emplace(scrubber_, /*fit=*/false);
          sink.Scrub(&*decoded, &*inflate, chunk);
        }
      }
      serialize();
      bool trailers = false;
      Status s = guest_out_.Add(out);
      if (s.ok() && framing.kind == Framing::kLength) s = RelayLength(in, sink, framing.length);
      if (s.ok() && framing.kind == Framing::kChunked) {
        s = RelayChunked(in, sink, limits_.max_head, &trailers);
      }
      if (s.ok() && framing.kind == Framing::kUntilClose) s = RelayUntilEof(in, sink);
      if (s.ok()) s = sink.End();
      if (s.ok()) s = guest_out_.Flush();
      scrubbed_ += scrub.replaced();
      if (decoded) scrubbed_ += decoded->replaced();
      if (!s.ok()) {
        FailResponse(what + ": " + s.message(), Answer::kAbort);
        return After::kStop;
      }
      return close ? After::kDrain : After::kNext;
    }
  }

  // The last response went out: the guest sees the connection close. Nothing can answer a
  // later request, so a request thread still reading is stopped too.
  void EndResponses() {
    (void)guest_out_.CloseWrite();
    bool running;
    {
      MutexLock l(mu_);
      response_done_ = true;
      running = !request_finished_;
      cv_.SignalAll();
    }
    if (running) {
      guest_.Abort();
      upstream_.Abort();
    }
  }

  void Refused(const std::string& response) {
    Status s = guest_out_.Add(response);
    if (s.ok()) s = guest_out_.CloseWrite();
    {
      MutexLock l(mu_);
      response_done_ = true;
      cv_.SignalAll();
    }
    upstream_.Abort();
    guest_.Abort();
  }

  void RawDown(Input& in) {
    Status s = Raw(in, guest_out_);
    if (!s.ok()) FailUnlessEnded(s.message());
    MutexLock l(mu_);
    response_done_ = true;
    cv_.SignalAll();
  }

  // A failure of the response direction: records `error` and, as `answer` says, tells the
  // guest with a 502 (only before any of the final response went out), closes its side
  // cleanly, or just tears both streams down. A failure that follows the request thread's is
  // only its echo.
  void FailResponse(const std::string& error, Answer answer) {
    {
      MutexLock l(mu_);
      bool first = !stopping_;
      stopping_ = true;
      response_done_ = true;
      cv_.SignalAll();
      if (!first) return;
      if (error_.empty()) error_ = error;
      if (answer == Answer::k502) {
        refused_status_ = 502;
        refused_reason_ = error;
      }
    }
    if (answer == Answer::k502) (void)guest_out_.Add(RefusalResponse(502, error));
    if (answer != Answer::kAbort) (void)guest_out_.CloseWrite();
    guest_.Abort();
    upstream_.Abort();
  }

  // Records `error` (the first one wins) and tears both streams down, unless the connection
  // was already ending, in which case the failure is only its echo.
  void FailUnlessEnded(const std::string& error) {
    {
      MutexLock l(mu_);
      if (stopping_ || (response_done_ && !raw_)) return;
      stopping_ = true;
      if (error_.empty()) error_ = error;
      cv_.SignalAll();
    }
    guest_.Abort();
    upstream_.Abort();
  }

  ByteStream& guest_;
  ByteStream& upstream_;
  const SecretSet& secrets_;
  const HttpRules* rules_;  // may be null
  const std::string host_;
  const InterceptLimits limits_;
  Substituter head_subst_;    // secrets bound to host_
  Substituter target_subst_;  // ... that have `target`
  Substituter body_subst_;    // ... that have `body`
  Scrubber scrubber_;         // their values, taken out of responses
  bool keep_cookies_ = false;

  std::atomic<int64_t> bytes_up_{0};
  std::atomic<int64_t> bytes_down_{0};
  Mutex guest_mu_;  // guest writes: the response thread's, and Continue()
  Mutex up_mu_;     // upstream writes (the request thread's only)
  Output guest_out_;
  Output up_out_;

  // The response thread's own.
  int scrubbed_ = 0;

  // The request thread's own.
  int requests_ = 0;
  std::map<std::string, int> substitutions_;
  uint64_t seq_ = 0;

  Mutex mu_;
  CondVar cv_;  // decided_, response_done_, stopping_
  std::deque<Pending> fifo_ GUARDED_BY(mu_);
  bool in_progress_ GUARDED_BY(mu_) = false;       // a response is being relayed
  bool request_done_ GUARDED_BY(mu_) = false;      // no more Pending will come
  bool request_finished_ GUARDED_BY(mu_) = false;  // the request thread is done
  bool response_done_ GUARDED_BY(mu_) = false;     // the response thread ended the connection
  bool stopping_ GUARDED_BY(mu_) = false;          // a failure tore both streams down
  bool raw_ GUARDED_BY(mu_) = false;               // a 101 was relayed
  uint64_t decided_ GUARDED_BY(mu_) = 0;           // seq of the last upgrade request answered
  bool switched_ GUARDED_BY(mu_) = false;          // ... and whether with 101
  Clock::time_point last_response_ GUARDED_BY(mu_);
  int refused_status_ GUARDED_BY(mu_) = 0;
  std::string refused_reason_ GUARDED_BY(mu_);
  std::string error_ GUARDED_BY(mu_);
};

}  // namespace

Result<std::optional<ResponseHead>> ParseResponseHead(std::string_view buf, size_t max_head) {
  ASSIGN_OR_RETURN(auto lines, SplitHead(buf, max_head, "response"));
  if (!lines) return std::optional<ResponseHead>();
  ResponseHead h;
  h.size = lines->size;
  h.headers = std::move(lines->headers);
  std::string_view sl = lines->start;
  if (sl.size() < 12 || sl[8] != ' ' || !IsDigits(sl.substr(9, 3)) ||
      (sl.size() > 12 && sl[12] != ' ')) {
    return InvalidArgument("status line is not 'HTTP/1.x NNN reason'");
  }
  h.version = std::string(sl.substr(0, 8));
  if (h.version != "HTTP/1.1" && h.version != "HTTP/1.0") {
    return InvalidArgument("unsupported HTTP version in the status line");
  }
  h.status = std::stoi(std::string(sl.substr(9, 3)));
  if (h.status < 100 || h.status > 599) return InvalidArgument("status code out of range");
  if (sl.size() > 12) h.reason = std::string(sl.substr(13));
  if (std::any_of(h.reason.begin(), h.reason.end(), IsHttpCtl)) {
    return InvalidArgument("control byte in the reason phrase");
  }
  return std::optional<ResponseHead>(std::move(h));
}

InterceptResult RelayHttp(ByteStream& guest, ByteStream& upstream, const SecretSet& secrets,
                          const std::string& host, const InterceptLimits& limits,
                          const HttpRules* rules) {
  return Relay(guest, upstream, secrets, host, limits, rules).Run();
}

}  // namespace trybox::egress
