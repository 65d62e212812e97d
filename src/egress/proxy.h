// The egress proxy's decision and relay for one client connection.
//
// A Client is the guest end of one connection: in the daemon a channel::Stream the guest
// opened (StreamClient), in tests and benchmarks a real TCP socket (FdClient). ServeConnection
// reads the request head (capped, with a deadline), decides, dials the exact address it
// checked (so a second DNS answer can never change the destination), answers, then relays
// bytes both ways until both directions are closed. Refusals answer with an HTTP status and
// an X-Trybox-Reason header. Every connection produces one Decision, reported to the audit
// sink when decided and again when closed.
//
// Thread-safety: ServeConnection is called concurrently, one call per connection; Policy and
// Resolver are shared read-only; TunnelSlots is thread-safe.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "channel/mux.h"
#include "egress/allowlist.h"
#include "egress/http.h"
#include "egress/http_rules.h"
#include "egress/secrets.h"
#include "egress/tls.h"
#include "util/fd.h"
#include "util/status.h"

namespace trybox::egress {

using Deadline = std::chrono::steady_clock::time_point;

// Name resolution on the host. The daemon uses getaddrinfo; tests use a fixed map.
class Resolver {
 public:
  virtual ~Resolver() = default;
  // Addresses for `host` with `port` filled in; kNotFound if the name does not resolve.
  virtual Result<std::vector<sockaddr_storage>> Resolve(const std::string& host, int port) = 0;
};

class SystemResolver : public Resolver {
 public:
  Result<std::vector<sockaddr_storage>> Resolve(const std::string& host, int port) override;
};

// Names to numeric addresses, set by the operator (tests point names at loopback upstreams).
// A name not in the map does not resolve: the map never falls back to DNS.
class MapResolver : public Resolver {
 public:
  // {"upstream.test": ["127.0.0.1", "::1"]}. Fails on a key that is not a valid hostname or
  // a value that is not a numeric address.
  static Result<std::unique_ptr<MapResolver>> FromJson(const nlohmann::json& map);
  Result<std::vector<sockaddr_storage>> Resolve(const std::string& host, int port) override;

 private:
  std::map<std::string, std::vector<sockaddr_storage>> names_;
};

// The guest end of one proxied connection.
class Client {
 public:
  virtual ~Client() = default;
  // Next bytes from the guest; "" at its EOF. kDeadlineExceeded when `deadline` passes first;
  // kUnavailable if the guest aborted the connection.
  virtual Result<std::string> Read(std::optional<Deadline> deadline) = 0;
  virtual Status Write(std::string_view data) = 0;
  // Half-close towards the guest.
  virtual Status CloseWrite() = 0;
  // Tears the connection down in both directions and wakes a blocked Read (from any thread).
  virtual void Abort(const std::string& reason) = 0;
};

// A TCP (or unix) socket as the client. Does not own the fd.
class FdClient : public Client {
 public:
  explicit FdClient(int fd) : fd_(fd) {}
  Result<std::string> Read(std::optional<Deadline> deadline) override;
  Status Write(std::string_view data) override;
  Status CloseWrite() override;
  void Abort(const std::string& reason) override;

 private:
  int fd_;
};

// A channel stream the guest opened with {"op":"egress"}: guest bytes arrive on channel 0,
// bytes for the guest go out on channel 1 (docs/protocol/egress.md).
class StreamClient : public Client {
 public:
  explicit StreamClient(channel::Stream& s) : s_(s) {}
  Result<std::string> Read(std::optional<Deadline> deadline) override;
  Status Write(std::string_view data) override;
  Status CloseWrite() override;
  void Abort(const std::string& reason) override;

 private:
  channel::Stream& s_;
  bool eof_ = false;
  std::atomic<bool> aborted_{false};
};

// Caps concurrent tunnels of one VM. Thread-safe.
class TunnelSlots {
 public:
  explicit TunnelSlots(int max) : max_(max) {}
  bool TryAcquire();
  void Release();
  int max() const { return max_; }
  int in_use() const { return in_use_.load(); }

 private:
  const int max_;
  std::atomic<int> in_use_{0};
};

// The fixed name under which guests reach the model server the operator configured
// (egress.json model_route): no destination of the guest's choosing.
inline constexpr const char* kModelHost = "model.trybox.internal";
inline constexpr int kModelPort = 80;

struct Policy {
  Reach reach;
  std::vector<AddressOverride> overrides;  // operator-only; empty by default
  // Where kModelHost:kModelPort goes; unset: the name is refused.
  std::optional<AddressOverride> model_route;
  std::chrono::milliseconds head_timeout{10000};
  size_t max_head = kDefaultMaxHead;
  std::chrono::milliseconds connect_timeout{10000};
};

// Guest text in an audit row's host is cut to this many bytes.
inline constexpr size_t kMaxAuditHost = 255;

// One connection's outcome. verdict: "allowed" (dialled), "refused" (policy or malformed
// request), "failed" (allowed but the upstream could not be reached).
struct Decision {
  std::string vm_id;
  std::string method;
  std::string host;  // canonical if valid, else as sent (capped at 255 bytes)
  int port = 0;
  std::string address;  // the address dialled, "" if none
  std::string verdict;
  std::string reason;
  bool override_used = false;
  int status = 0;  // HTTP status sent to the guest (200 for an opened tunnel)
  int64_t bytes_up = 0;
  int64_t bytes_down = 0;
  double started_at = 0;  // seconds since the epoch
  double duration_ms = 0;
};

// Where decisions go: the daemon's audit table and log (wrapped in RateLimitedAudit,
// audit_limit.h). Called from many connections' threads at once.
class AuditSink {
 public:
  virtual ~AuditSink() = default;
  // Called exactly once per connection, once the verdict is known; returns an id passed to
  // Closed (any value, negative ones included: the proxy does not interpret it).
  virtual int64_t Decided(const Decision& d) = 0;
  // Called when the connection is over, with byte counts and duration filled in.
  virtual void Closed(int64_t id, const Decision& d) = 0;
};

struct ProxyContext {
  const Policy* policy;
  Resolver* resolver;
  TunnelSlots* slots;
  AuditSink* audit;  // may be null
  std::string vm_id;
  // The VM's secrets (docs/secrets.md): tunnels to a host bound to one are TLS-intercepted
  // with `ca`'s certificates and opened upstream with `upstream_tls`; a placeholder seen
  // on its way anywhere else is refused. All null for a VM without secrets.
  const SecretSet* secrets = nullptr;
  CertAuthority* ca = nullptr;
  UpstreamTls* upstream_tls = nullptr;
  // The VM's HTTP rules (http_rules.h): tunnels to a host they cover are intercepted
  // as secrets' hosts are (so `ca` and `upstream_tls` are set), and plain HTTP to it is
  // refused. Null for a VM without rules.
  const HttpRules* rules = nullptr;
};

// A connection a guest program dialled itself (docs/protocol/egress.md, "Transparent
// egress"): the name its address maps back to in the guest's resolver (or the address
// literal, which is refused), and the port. It comes with the stream, not in a request head.
struct TransparentTarget {
  std::string host;
  int port = 0;
};

// Serves one connection. With `transparent`, no request head is read and no HTTP is
// answered: the same decision by name, then raw bytes; a refusal aborts the client with
// its reason (the guest resets the program's connection). Audited with method "TCP".
Decision ServeConnection(Client& client, const ProxyContext& ctx,
                         const std::optional<TransparentTarget>& transparent = std::nullopt);

// The guest resolver's question: empty if `host` may be dialled on some port under `pol`
// (Reach::CheckName; the model route's name when one is configured), else why not.
std::string NameRefusal(const Policy& pol, const std::string& host);

}  // namespace trybox::egress
