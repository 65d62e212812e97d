// TLS for the egress proxy's interception of hosts bound to a secret (docs/secrets.md): the
// proxy ends the guest's TLS with a certificate minted by the VM's own CA (CertAuthority),
// and opens its own verified TLS connection to the real upstream (UpstreamTls). Both ends
// are TlsStreams, ByteStreams the relay copies between.
//
// The process must ignore SIGPIPE (tryboxd does): OpenSSL writes to the socket with write(2),
// and a peer that has gone would otherwise kill the daemon.
#pragma once

#include <openssl/types.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "egress/byte_stream.h"
#include "util/fd.h"
#include "util/mutex.h"
#include "util/status.h"

namespace trybox::egress {

namespace tls_internal {
struct OpenSslFree {
  void operator()(X509* p) const;
  void operator()(EVP_PKEY* p) const;
  void operator()(SSL_CTX* p) const;
  void operator()(SSL* p) const;
};
}  // namespace tls_internal

// One VM's certificate authority. Its EC P-256 key and the one leaf key it certifies for
// every host are generated in memory at Create and never leave the process; only the CA's
// certificate (cert_pem) is given out, for the guest to trust. The CA certificate is valid
// for a year, constrained to issue leaves only (pathlen 0).
//
// Thread-safe: ServerContext may be called concurrently from any number of connections.
class CertAuthority {
 public:
  // The CA certificate's subject is CN=`common_name` (at most 64 bytes).
  static Result<std::unique_ptr<CertAuthority>> Create(const std::string& common_name);
  ~CertAuthority();
  CertAuthority(const CertAuthority&) = delete;
  CertAuthority& operator=(const CertAuthority&) = delete;

  // The CA certificate, PEM.
  const std::string& cert_pem() const { return cert_pem_; }

  // A TLS server context presenting a certificate for `host`, a canonical hostname
  // (egress/hostname.h; anything else is kInvalidArgument). The certificate is minted on
  // the first call for a host and the context cached, so later calls return the same one;
  // past kMaxCachedHosts distinct hosts (a guest walking a wildcard's names) new hosts get
  // a fresh, uncached context each call. TLS 1.2 or later; ALPN selects "h2" when the client
  // offers it (intercept_h2.h), else "http/1.1" when offered, and nothing otherwise.
  //
  // The caller shares ownership; the context stays valid after the CA is gone, and a
  // TlsStream accepted with it holds its own reference.
  Result<std::shared_ptr<SSL_CTX>> ServerContext(const std::string& host) EXCLUDES(mu_);

  static constexpr size_t kMaxCachedHosts = 1024;

 private:
  CertAuthority() = default;
  Result<std::shared_ptr<SSL_CTX>> MintContext(const std::string& host) const;

  std::unique_ptr<EVP_PKEY, tls_internal::OpenSslFree> ca_key_;
  std::unique_ptr<X509, tls_internal::OpenSslFree> ca_cert_;
  std::unique_ptr<EVP_PKEY, tls_internal::OpenSslFree> leaf_key_;
  std::time_t ca_not_after_ = 0;
  std::string cert_pem_;

  Mutex mu_;
  std::map<std::string, std::shared_ptr<SSL_CTX>> contexts_ GUARDED_BY(mu_);
};

class TlsStream;

// The client side towards real servers: TLS 1.2 or later, the peer's chain verified against
// the system's trust store (or one PEM file) and its name against the host dialled. Offers
// ALPN "http/1.1" only, unless made otherwise.
//
// Thread-safe: Connect may be called concurrently.
class UpstreamTls {
 public:
  // `ca_file`: trust only the certificates in this PEM file instead of the system store
  // (tests, or an operator's private upstream). An unreadable file is an error naming it.
  // `alpn`: the protocols offered, in order (the proxy's upstreams: "http/1.1" only; a bench
  // playing the guest offers "h2").
  static Result<std::unique_ptr<UpstreamTls>> Create(const std::optional<std::string>& ca_file,
                                                     const std::vector<std::string>& alpn = {
                                                         "http/1.1"});
  ~UpstreamTls();
  UpstreamTls(const UpstreamTls&) = delete;
  UpstreamTls& operator=(const UpstreamTls&) = delete;

  // Runs the handshake over `fd` (a connected stream socket, taken over) with SNI `host`,
  // checking the certificate names `host`. kPermissionDenied when the certificate is not
  // trusted ("upstream certificate for HOST not trusted: hostname mismatch"),
  // kDeadlineExceeded when `deadline` passes first, kUnavailable for any other failure.
  Result<std::unique_ptr<TlsStream>> Connect(UniqueFd fd, const std::string& host,
                                             std::chrono::steady_clock::time_point deadline);

 private:
  UpstreamTls() = default;
  std::unique_ptr<SSL_CTX, tls_internal::OpenSslFree> ctx_;
};

// One TLS session over a connected stream socket, which it owns and makes non-blocking.
//
// Thread-safety (as ByteStream): one thread may Read while another Writes or CloseWrites;
// Abort and the const getters may be called from any thread. OpenSSL forbids concurrent use
// of one SSL object, so every OpenSSL call is made under mu_, and the waits for the socket
// happen outside it; a side whose wait may have been made stale by the other side's OpenSSL
// call (which can consume socket bytes it was waiting for) is woken to retry. The stream
// must outlive any Abort call made on it from another thread.
class TlsStream : public ByteStream {
 public:
  // The server side of a handshake over `fd` with `ctx` (CertAuthority::ServerContext;
  // borrowed, the session keeps its own reference). kDeadlineExceeded when `deadline`
  // passes first; kUnavailable naming the reason for any other failure.
  static Result<std::unique_ptr<TlsStream>> Accept(UniqueFd fd, SSL_CTX* ctx,
                                                   std::chrono::steady_clock::time_point deadline);
  static Result<std::unique_ptr<TlsStream>> Accept(UniqueFd fd, const std::shared_ptr<SSL_CTX>& ctx,
                                                   std::chrono::steady_clock::time_point deadline) {
    return Accept(std::move(fd), ctx.get(), deadline);
  }
  ~TlsStream() override;
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;

  // At most one TLS record (16 KiB) per call. "" at the peer's close_notify, and also at a
  // TCP end without one (see truncated()).
  // After such a truncated end the session is failed: Write and CloseWrite report errors.
  Result<std::string> Read(size_t max,
                           std::optional<std::chrono::steady_clock::time_point> deadline) override;
  Status Write(std::string_view data) override;
  // Sends close_notify (once; not waiting for the peer's), then shutdown(SHUT_WR).
  Status CloseWrite() override;
  // shutdown(SHUT_RDWR) and wakes a blocked Read or Write, which return kUnavailable, as
  // does every later call.
  void Abort() override;

  // The protocol ALPN settled on in the handshake, or "".
  const std::string& alpn() const { return alpn_; }
  // True once Read has returned "" for a TCP end that came without close_notify: the peer
  // (or someone on the path) cut the stream, and the audit may want to say so.
  bool truncated() const { return truncated_.load(); }

 private:
  friend class UpstreamTls;
  enum Side { kReader = 0, kWriter = 1 };

  TlsStream(UniqueFd fd, UniqueFd abort_fd, UniqueFd reader_wake, UniqueFd writer_wake, SSL* ssl);
  // Wraps `fd` in a session of `ctx` (`host`: the client's SNI and the name to verify; empty
  // for a server) and runs the handshake.
  static Result<std::unique_ptr<TlsStream>> Start(UniqueFd fd, SSL_CTX* ctx,
                                                  const std::string& host,
                                                  std::chrono::steady_clock::time_point deadline);
  Status Handshake(const std::string& host, std::chrono::steady_clock::time_point deadline)
      EXCLUDES(mu_);

  // The start of each OpenSSL call by `side`: clears its stale wake-up.
  void BeginCall(Side side) REQUIRES(mu_);
  // The end of each: marks `side` as about to wait (when `will_wait`) and wakes the other
  // side if it is waiting, since this call may have changed what it waits for.
  void EndCall(Side side, bool will_wait) REQUIRES(mu_);
  // Polls the socket for `events` (POLLIN or POLLOUT) until ready, woken, aborted
  // (kUnavailable) or past `deadline` (kDeadlineExceeded).
  Status Wait(Side side, short events,
              std::optional<std::chrono::steady_clock::time_point> deadline) const;

  const UniqueFd fd_;
  // Readable once Abort has run; never drained.
  const UniqueFd abort_fd_;
  // Per side: an eventfd the other side signals when waiting_[side] is set.
  const UniqueFd wake_fd_[2];
  std::atomic<bool> aborted_{false};
  std::atomic<bool> truncated_{false};
  std::string alpn_;  // set once, before the stream is handed out

  Mutex mu_;
  SSL* ssl_ GUARDED_BY(mu_);
  bool waiting_[2] GUARDED_BY(mu_) = {false, false};
  // wake_fd_[side] has been written since that side last drained it.
  bool signaled_[2] GUARDED_BY(mu_) = {false, false};
  // A fatal error ended the session: OpenSSL must not be asked to write or shut down.
  bool failed_ GUARDED_BY(mu_) = false;
  bool close_notify_sent_ GUARDED_BY(mu_) = false;
};

}  // namespace trybox::egress
