#include "egress/proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "egress/address.h"
#include "egress/hostname.h"
#include "egress/intercept.h"
#include "egress/intercept_h2.h"
#include "util/utf8.h"

namespace trybox::egress {
namespace {

using Clock = std::chrono::steady_clock;
using Kind = channel::Stream::Message::Kind;

constexpr size_t kRelayChunk = 256 * 1024;
// A stream Read re-checks for a local abort this often (Stream::Next has no other wake-up).
constexpr auto kAbortPoll = std::chrono::milliseconds(200);
// The guest's side of an intercepted TLS handshake. Not head_timeout: under TCG on a loaded
// 2-core host a guest's curl took 6-9 s to its first request and 10 s timed some out; the
// tunnel holds one of the VM's capped slots meanwhile, so a stalled guest only stalls itself.
constexpr auto kGuestTlsTimeout = std::chrono::seconds(60);

int PollMs(std::optional<Deadline> d) {
  if (!d) return -1;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(*d - Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

double EpochSeconds() {
  struct timeval tv;
  ::gettimeofday(&tv, nullptr);
  return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6;
}

// The "reason" of a guest's RESET, for the audit and the log: any JSON type may come (a
// number made json::value() throw, which ended the daemon), of any length up to a frame.
std::string GuestReason(const nlohmann::json& body) {
  constexpr size_t kMax = 200;
  auto it = body.is_object() ? body.find("reason") : body.end();
  if (it == body.end() || !it->is_string()) return "no reason given";
  const std::string& r = it->get_ref<const std::string&>();
  return r.size() <= kMax ? r : JsonSafe(r.substr(0, kMax)) + "...";
}

std::string PlaceholderRefusal(const Secret& s) {
  return "the placeholder of secret " + s.name + " may go only to its hosts";
}

Result<UniqueFd> Dial(const sockaddr_storage& a, std::chrono::milliseconds timeout) {
  UniqueFd fd(::socket(a.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket");
  socklen_t len = a.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    if (errno != EINPROGRESS) return ErrnoError("connect " + FormatAddress(a));
    pollfd p{fd.get(), POLLOUT, 0};
    int n;
    do {
      n = ::poll(&p, 1, static_cast<int>(timeout.count()));
    } while (n < 0 && errno == EINTR);
    if (n == 0) return DeadlineExceeded("connect " + FormatAddress(a) + ": timed out");
    int err = 0;
    socklen_t el = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) return ErrnoError("connect " + FormatAddress(a), err);
  }
  int flags = ::fcntl(fd.get(), F_GETFL);
  ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Empty if the guest may use the model route on `port`, else why not.
std::string ModelRouteRefusal(const Policy& pol, int port) {
  if (!pol.model_route) {
    return std::string(kModelHost) +
           " leads nowhere: the operator configured no model route (egress.json model_route)";
  }
  std::string denied = pol.reach.DeniedBy(kModelHost, port);
  if (!denied.empty()) return denied;
  if (port != kModelPort) {
    return std::string(kModelHost) + " serves port " + std::to_string(kModelPort) + " only";
  }
  return "";
}

class Connection {
 public:
  Connection(Client& c, const ProxyContext& ctx, const std::optional<TransparentTarget>& t)
      : client_(c), ctx_(ctx), transparent_(t) {
    d_.vm_id = ctx.vm_id;
    d_.started_at = EpochSeconds();
  }

  Decision Run() {
    Serve();
    if (slot_) ctx_.slots->Release();
    d_.duration_ms = std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
    if (ctx_.audit) {
      if (!decided_) Decide();
      ctx_.audit->Closed(audit_id_, d_);
    }
    return d_;
  }

 private:
  // Reports the verdict once. The id is the sink's business: a sink that failed to record
  // (or chose not to) may return any value, and is still asked only once.
  void Decide() {
    if (!ctx_.audit || decided_) return;
    decided_ = true;
    audit_id_ = ctx_.audit->Decided(d_);
  }

  void Refuse(int status, const std::string& verdict, const std::string& reason) {
    d_.status = transparent_ ? 0 : status;
    d_.verdict = verdict;
    d_.reason = reason;
    Decide();
    // A program that dialled the address itself speaks no HTTP: its connection is reset.
    if (transparent_) {
      client_.Abort(reason);
      return;
    }
    if (status != 0) {
      (void)client_.Write(RefusalResponse(status, reason));
      (void)client_.CloseWrite();
    }
  }

  // The request head, or for a transparent connection what the guest's stream named.
  Result<ProxyTarget> ReadTarget(std::string& buf, std::optional<RequestHead>& head,
                                 std::string& origin_head) {
    if (transparent_) {
      d_.method = "TCP";
      d_.host = transparent_->host.substr(0, kMaxAuditHost);
      d_.port = transparent_->port;
      if (transparent_->port < 1 || transparent_->port > 65535) {
        return InvalidArgument("port " + std::to_string(transparent_->port) + " is out of range");
      }
      return ProxyTarget{true, transparent_->host, transparent_->port, ""};
    }
    const Policy& pol = *ctx_.policy;
    auto deadline = start_ + pol.head_timeout;
    for (;;) {
      auto parsed = ParseRequestHead(buf, pol.max_head);
      if (!parsed.ok()) {
        bool big = parsed.status().code() == Code::kResourceExhausted;
        refuse_status_ = big ? 431 : 400;
        return InvalidArgument("malformed request: " + parsed.status().message());
      }
      if (parsed->has_value()) {
        head = std::move(**parsed);
        break;
      }
      auto more = client_.Read(deadline);
      if (!more.ok()) {
        if (more.status().code() == Code::kDeadlineExceeded) {
          refuse_status_ = 408;
          return InvalidArgument("request head not complete within " +
                                 std::to_string(pol.head_timeout.count()) + " ms");
        }
        refuse_status_ = 0;
        return InvalidArgument("client aborted before its request head: " +
                               more.status().message());
      }
      if (more->empty()) {
        refuse_status_ = 0;
        return InvalidArgument("client closed before its request head");
      }
      buf += *more;
    }
    d_.method = head->method.substr(0, 32);
    ASSIGN_OR_RETURN(ProxyTarget target, ParseProxyTarget(*head));
    d_.host = target.host.substr(0, kMaxAuditHost);
    d_.port = target.port;
    if (!target.tunnel) {  // plain HTTP: the head the upstream gets
      ASSIGN_OR_RETURN(origin_head, OriginRequest(*head, target));
    }
    return target;
  }

  void Serve() {
    const Policy& pol = *ctx_.policy;
    std::string buf;
    std::optional<RequestHead> head;
    std::string origin_head;
    auto target = ReadTarget(buf, head, origin_head);
    if (!target.ok()) return Refuse(refuse_status_, "refused", target.status().message());
    auto host = CanonicalHostname(target->host);
    if (!host.ok()) return Refuse(403, "refused", host.status().message());
    d_.host = *host;
    const bool model = *host == kModelHost;
    std::string why =
        model ? ModelRouteRefusal(pol, target->port) : pol.reach.Check(*host, target->port);
    if (!why.empty()) return Refuse(403, "refused", why);
    // A placeholder is refused wherever it is seen heading to a host not bound to it: in a
    // request head, and in a tunnel's first bytes (plaintext protocols show it there).
    if (ctx_.secrets) {
      if (const Secret* s = ctx_.secrets->ForeignPlaceholder(buf, *host)) {
        return Refuse(403, "refused", PlaceholderRefusal(*s));
      }
    }
    const bool ruled = ctx_.rules && ctx_.rules->Covers(*host);
    if (ruled && !target->tunnel) {
      return Refuse(403, "refused",
                    *host +
                        " has HTTP rules, which the proxy can apply only inside HTTPS: "
                        "plain HTTP to it is refused");
    }
    const bool intercept =
        target->tunnel && (ruled || (ctx_.secrets && ctx_.secrets->BindsHost(*host)));
    if (!ctx_.slots->TryAcquire()) {
      return Refuse(503, "refused",
                    "too many concurrent tunnels for this VM (cap " +
                        std::to_string(ctx_.slots->max()) + ")");
    }
    slot_ = true;
    // The model route is the operator's own address: not resolved, not classified.
    auto addrs = model ? Result<std::vector<sockaddr_storage>>(
                             std::vector<sockaddr_storage>{pol.model_route->addr})
                       : ctx_.resolver->Resolve(*host, target->port);
    if (!addrs.ok()) return Refuse(502, "failed", addrs.status().message());
    // Only addresses checked here are dialled; nothing is resolved a second time.
    std::vector<std::pair<sockaddr_storage, bool>> permitted;  // address, via override
    std::string refused;
    for (const auto& a : *addrs) {
      AddressClass c = Classify(a);
      bool over = model;
      for (const auto& o : pol.overrides) over = over || o.Matches(a);
      if (c == AddressClass::kPublic || over) {
        permitted.emplace_back(a, over && c != AddressClass::kPublic);
      } else {
        refused +=
            (refused.empty() ? "" : ", ") + FormatAddress(a) + " (" + AddressClassName(c) + ")";
      }
    }
    if (permitted.empty()) {
      return Refuse(403, "refused", *host + " resolves only to refused addresses: " + refused);
    }
    UniqueFd up;
    sockaddr_storage dialed{};
    std::string dial_errors;
    for (const auto& [a, over] : permitted) {
      auto fd = Dial(a, pol.connect_timeout);
      d_.address = FormatAddress(a);
      d_.override_used = over;
      if (fd.ok()) {
        up = std::move(*fd);
        dialed = a;
        break;
      }
      dial_errors += (dial_errors.empty() ? "" : "; ") + fd.status().message();
    }
    if (!up.valid()) return Refuse(502, "failed", dial_errors);
    // Bytes the client sent after its head (none on the transparent path: nothing was read).
    std::string first = head ? buf.substr(head->size) : "";
    if (intercept) return Intercept(std::move(up), dialed, *host, std::move(first));
    d_.verdict = "allowed";
    d_.status = 200;
    d_.reason = model              ? "the operator's model route (egress.json model_route)"
                : d_.override_used ? "internal address allowed by the operator's override"
                                   : pol.reach.AllowedBecause();
    Decide();
    if (transparent_) {
      // Nothing to answer: the program's connection is already open.
    } else if (target->tunnel) {
      if (!client_.Write("HTTP/1.1 200 Connection established\r\n\r\n").ok()) return;
    } else {
      first = origin_head + first;
    }
    Relay(up.get(), first);
  }

  // A tunnel to a secret's host (docs/secrets.md): TLS to the real server first (verified;
  // a bad certificate fails the CONNECT), then TLS with the guest under the VM's CA, and
  // HTTP between the two with the placeholders swapped: HTTP/1.1 (intercept.h), or HTTP/2 with
  // the guest when it asks for it, carried upstream as HTTP/1.1 over more connections to the
  // same address as requests run concurrently (intercept_h2.h).
  void Intercept(UniqueFd up, const sockaddr_storage& address, const std::string& host,
                 std::string early) {
    const Policy& pol = *ctx_.policy;
    if (!ctx_.ca || !ctx_.upstream_tls) {
      return Refuse(502, "failed", "TLS interception is not set up for this VM");
    }
    auto upstream =
        ctx_.upstream_tls->Connect(std::move(up), host, Clock::now() + pol.connect_timeout);
    if (!upstream.ok()) return Refuse(502, "failed", upstream.status().message());
    auto server = ctx_.ca->ServerContext(host);
    if (!server.ok()) return Refuse(502, "failed", server.status().message());
    d_.verdict = "allowed";
    d_.status = 200;
    d_.reason = (d_.override_used ? "internal address allowed by the operator's override"
                                  : pol.reach.AllowedBecause()) +
                "; TLS intercepted for its " +
                (ctx_.rules && ctx_.rules->Covers(host)
                     ? (ctx_.secrets && ctx_.secrets->BindsHost(host) ? "secrets and HTTP rules"
                                                                      : "HTTP rules")
                     : "secrets");
    Decide();
    if (!transparent_ && !client_.Write("HTTP/1.1 200 Connection established\r\n\r\n").ok()) {
      return;
    }
    // TLS runs over a socket (tls.h) and the guest's bytes arrive on a channel stream: a
    // socketpair joins the two, with one thread per direction.
    int sp[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) {
      client_.Abort("socketpair failed");
      return;
    }
    UniqueFd inner(sp[0]);
    UniqueFd outer(sp[1]);
    std::atomic<bool> guest_done{false};
    std::thread in([&] {
      bool ok = early.empty() || WriteFull(outer.get(), early).ok();
      while (ok) {
        auto data = client_.Read(std::nullopt);
        if (!data.ok()) break;
        if (data->empty()) {
          ::shutdown(outer.get(), SHUT_WR);
          guest_done = true;
          return;
        }
        ok = WriteFull(outer.get(), *data).ok();
      }
      guest_done = true;
      ::shutdown(outer.get(), SHUT_RDWR);
    });
    std::thread out([&] {
      std::string chunk(kRelayChunk, '\0');
      for (;;) {
        auto n = ReadSome(outer.get(), chunk.data(), chunk.size());
        if (!n.ok()) {
          client_.Abort("interception ended: " + n.status().message());
          return;
        }
        if (*n == 0) {
          (void)client_.CloseWrite();
          return;
        }
        if (!client_.Write(std::string_view(chunk.data(), *n)).ok()) {
          ::shutdown(outer.get(), SHUT_RDWR);
          return;
        }
      }
    });
    InterceptResult r;
    auto guest = TlsStream::Accept(std::move(inner), *server, Clock::now() + kGuestTlsTimeout);
    if (guest.ok() && (*guest)->alpn() == "h2") {
      static const SecretSet kNoSecrets;
      // The connection verified before the guest's handshake serves the first stream.
      std::unique_ptr<ByteStream> first_upstream = std::move(*upstream);
      Mutex dial_mu;
      UpstreamDialer dial = [&]() -> Result<std::unique_ptr<ByteStream>> {
        {
          MutexLock l(dial_mu);
          if (first_upstream) return std::move(first_upstream);
        }
        auto fd = Dial(address, pol.connect_timeout);
        if (!fd.ok()) return fd.status();
        auto tls =
            ctx_.upstream_tls->Connect(std::move(*fd), host, Clock::now() + pol.connect_timeout);
        if (!tls.ok()) return tls.status();
        return std::unique_ptr<ByteStream>(std::move(*tls));
      };
      d_.reason += "; HTTP/2 with the guest";
      r = RelayHttp2(**guest, dial, ctx_.secrets ? *ctx_.secrets : kNoSecrets, host, {},
                     ctx_.rules);
      (void)(*guest)->CloseWrite();
      guest->reset();
    } else if (guest.ok()) {
      static const SecretSet kNoSecrets;
      r = RelayHttp(**guest, **upstream, ctx_.secrets ? *ctx_.secrets : kNoSecrets, host, {},
                    ctx_.rules);
      (void)(*guest)->CloseWrite();
      guest->reset();  // closes the inner socket: `out` sees the end
    } else {
      r.error = "TLS with the guest failed: " + guest.status().message();
      ::shutdown(outer.get(), SHUT_RDWR);
    }
    upstream->reset();
    out.join();
    // The guest may still hold its side open after an error: end the stream to wake `in`.
    if (!guest_done) client_.Abort(r.error.empty() ? "interception over" : r.error);
    in.join();
    d_.bytes_up = r.bytes_up;
    d_.bytes_down = r.bytes_down;
    d_.reason += "; " + std::to_string(r.requests) + " request(s)";
    for (const auto& [name, n] : r.substitutions) {
      d_.reason += ", " + name + " put into " + std::to_string(n);
    }
    if (r.scrubbed > 0) {
      d_.reason += ", " + std::to_string(r.scrubbed) + " secret value(s) taken out of responses";
    }
    if (r.refused_status != 0) {
      d_.verdict = "refused";
      d_.status = r.refused_status;
      d_.reason += "; refused: " + r.refused_reason;
    } else if (!r.error.empty()) {
      d_.reason += "; ended: " + r.error;
    }
  }

  void Relay(int up, const std::string& first) {
    std::thread down([&] {
      std::string chunk(kRelayChunk, '\0');
      for (;;) {
        auto n = ReadSome(up, chunk.data(), chunk.size());
        if (!n.ok()) {
          client_.Abort("upstream failed: " + n.status().message());
          return;
        }
        if (*n == 0) {
          (void)client_.CloseWrite();
          return;
        }
        d_.bytes_down += static_cast<int64_t>(*n);
        if (!client_.Write(std::string_view(chunk.data(), *n)).ok()) {
          ::shutdown(up, SHUT_RDWR);
          return;
        }
      }
    });
    bool ok = first.empty() || WriteFull(up, first).ok();
    if (ok) d_.bytes_up += static_cast<int64_t>(first.size());
    while (ok) {
      auto data = client_.Read(std::nullopt);
      if (!data.ok()) break;
      if (data->empty()) {
        ::shutdown(up, SHUT_WR);
        down.join();
        return;
      }
      if (!WriteFull(up, *data).ok()) break;
      d_.bytes_up += static_cast<int64_t>(data->size());
    }
    // The guest aborted, or the upstream stopped taking bytes: tear down both directions.
    ::shutdown(up, SHUT_RDWR);
    down.join();
  }

  Client& client_;
  const ProxyContext& ctx_;
  const std::optional<TransparentTarget>& transparent_;
  int refuse_status_ = 400;  // the HTTP status for a ReadTarget error
  Decision d_;
  Clock::time_point start_ = Clock::now();
  bool slot_ = false;
  int64_t audit_id_ = -1;
  bool decided_ = false;
};

}  // namespace

Result<std::vector<sockaddr_storage>> SystemResolver::Resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return NotFound("cannot resolve " + host + ": " + ::gai_strerror(rc));
  std::vector<sockaddr_storage> out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, ai->ai_addr, ai->ai_addrlen);
    if (s.ss_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&s)->sin_port = htons(static_cast<uint16_t>(port));
    } else if (s.ss_family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&s)->sin6_port = htons(static_cast<uint16_t>(port));
    } else {
      continue;
    }
    out.push_back(s);
  }
  ::freeaddrinfo(res);
  if (out.empty()) return NotFound("cannot resolve " + host + ": no IPv4 or IPv6 address");
  return out;
}

Result<std::unique_ptr<MapResolver>> MapResolver::FromJson(const nlohmann::json& map) {
  if (!map.is_object()) return InvalidArgument("resolver map must be an object");
  auto r = std::make_unique<MapResolver>();
  for (const auto& [name, addrs] : map.items()) {
    auto host = CanonicalHostname(name);
    if (!host.ok()) return host.status().Annotate("resolver map");
    if (!addrs.is_array()) return InvalidArgument("resolver map: '" + name + "' needs an array");
    for (const auto& a : addrs) {
      if (!a.is_string()) return InvalidArgument("resolver map: addresses must be strings");
      std::string text = a.get<std::string>();
      auto o = AddressOverride::Parse(text.find(':') == std::string::npos ? text + ":1"
                                                                          : "[" + text + "]:1");
      if (!o.ok()) return InvalidArgument("resolver map: '" + text + "' is not an IP address");
      r->names_[*host].push_back(o->addr);
    }
  }
  return r;
}

Result<std::vector<sockaddr_storage>> MapResolver::Resolve(const std::string& host, int port) {
  auto it = names_.find(host);
  if (it == names_.end()) return NotFound("cannot resolve " + host + ": not in the resolver map");
  std::vector<sockaddr_storage> out = it->second;
  for (auto& s : out) {
    if (s.ss_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&s)->sin_port = htons(static_cast<uint16_t>(port));
    } else {
      reinterpret_cast<sockaddr_in6*>(&s)->sin6_port = htons(static_cast<uint16_t>(port));
    }
  }
  return out;
}

Result<std::string> FdClient::Read(std::optional<Deadline> deadline) {
  pollfd p{fd_, POLLIN, 0};
  int n;
  do {
    n = ::poll(&p, 1, PollMs(deadline));
  } while (n < 0 && errno == EINTR);
  if (n == 0) return DeadlineExceeded("no bytes from the client in time");
  std::string buf(kRelayChunk, '\0');
  auto got = ReadSome(fd_, buf.data(), buf.size());
  if (!got.ok()) return Unavailable(got.status().message());
  buf.resize(*got);
  return buf;
}

Status FdClient::Write(std::string_view data) { return WriteFull(fd_, data); }

Status FdClient::CloseWrite() {
  if (::shutdown(fd_, SHUT_WR) != 0) return ErrnoError("shutdown");
  return Status::Ok();
}

void FdClient::Abort(const std::string&) { ::shutdown(fd_, SHUT_RDWR); }

Result<std::string> StreamClient::Read(std::optional<Deadline> deadline) {
  while (!eof_) {
    if (aborted_) return Unavailable("aborted");
    auto until = Clock::now() + kAbortPoll;
    if (deadline && *deadline < until) until = *deadline;
    auto m = s_.Next(until);
    if (!m.ok()) {
      if (m.status().code() == Code::kDeadlineExceeded) {
        if (deadline && Clock::now() >= *deadline) return m.status();
        continue;
      }
      return Unavailable(m.status().message());
    }
    switch (m->kind) {
      case Kind::kData:
        if (m->channel == channel::kChanIn) return std::move(m->data);
        break;
      case Kind::kEof:
        if (m->channel == channel::kChanIn) eof_ = true;
        break;
      case Kind::kReset:
        return Unavailable("the guest reset the connection: " + GuestReason(m->body));
      case Kind::kEnd:
        return Unavailable("the guest ended the stream");
      case Kind::kEvent:
        break;
    }
  }
  return std::string();
}

Status StreamClient::Write(std::string_view data) { return s_.Write(channel::kChanOut, data); }

Status StreamClient::CloseWrite() { return s_.CloseWrite(channel::kChanOut); }

void StreamClient::Abort(const std::string& reason) {
  aborted_ = true;
  (void)s_.Reset(reason);
}

bool TunnelSlots::TryAcquire() {
  int cur = in_use_.load();
  while (cur < max_) {
    if (in_use_.compare_exchange_weak(cur, cur + 1)) return true;
  }
  return false;
}

void TunnelSlots::Release() { in_use_.fetch_sub(1); }

Decision ServeConnection(Client& client, const ProxyContext& ctx,
                         const std::optional<TransparentTarget>& transparent) {
  return Connection(client, ctx, transparent).Run();
}

std::string NameRefusal(const Policy& pol, const std::string& raw_host) {
  auto host = CanonicalHostname(raw_host);
  if (!host.ok()) return host.status().message();
  if (*host == kModelHost) return ModelRouteRefusal(pol, kModelPort);
  return pol.reach.CheckName(*host);
}

}  // namespace trybox::egress
