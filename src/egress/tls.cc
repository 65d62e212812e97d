#include "egress/tls.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "egress/hostname.h"

namespace trybox::egress {

namespace tls_internal {
void OpenSslFree::operator()(X509* p) const { X509_free(p); }
void OpenSslFree::operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
void OpenSslFree::operator()(SSL_CTX* p) const { SSL_CTX_free(p); }
void OpenSslFree::operator()(SSL* p) const { SSL_free(p); }
}  // namespace tls_internal

namespace {

using Clock = std::chrono::steady_clock;
template <typename T>
using Owned = std::unique_ptr<T, tls_internal::OpenSslFree>;

constexpr std::time_t kDay = 24 * 3600;
// Backdated so that a guest whose clock lags the host's still accepts a fresh certificate.
constexpr std::time_t kBackdate = 3600;
constexpr std::time_t kCaLifetime = 365 * kDay;
constexpr std::time_t kLeafLifetime = 90 * kDay;
constexpr size_t kMaxCommonName = 64;  // RFC 5280's ub-common-name
// SSL_read returns at most one record's plaintext, so a larger buffer would only be zeroed.
constexpr size_t kMaxReadChunk = SSL3_RT_MAX_PLAIN_LENGTH;

// The first error on this thread's OpenSSL queue, which is then cleared. The texts are
// OpenSSL's own and carry no application data.
std::string OpenSslReason() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown OpenSSL error";
  if (const char* reason = ERR_reason_error_string(e)) return reason;
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

Status OpenSslError(const std::string& what) { return Internal(what + ": " + OpenSslReason()); }

Status AddExtension(X509* cert, X509V3_CTX* v3, int nid, const std::string& value) {
  X509_EXTENSION* ext = X509V3_EXT_nconf_nid(nullptr, v3, nid, value.c_str());
  if (ext == nullptr) return OpenSslError(std::string("certificate extension ") + OBJ_nid2sn(nid));
  int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (added != 1) return OpenSslError("X509_add_ext");
  return Status::Ok();
}

// A v3 certificate for `key` with subject CN=`cn` (no CN when empty), a random 128-bit
// serial and validity from an hour ago to `not_after`, issued by `issuer` (by itself when
// null). Extensions and the signature are the caller's.
Result<Owned<X509>> NewCertificate(EVP_PKEY* key, const std::string& cn, X509* issuer,
                                   std::time_t not_after) {
  Owned<X509> cert(X509_new());
  if (!cert) return OpenSslError("X509_new");
  unsigned char serial[16];
  std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(nullptr, BN_free);
  do {
    if (RAND_bytes(serial, sizeof serial) != 1) return OpenSslError("RAND_bytes");
    bn.reset(BN_bin2bn(serial, sizeof serial, nullptr));
    if (!bn) return OpenSslError("BN_bin2bn");
  } while (BN_is_zero(bn.get()));  // serials must be positive
  std::time_t now = std::time(nullptr);
  if (BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get())) == nullptr ||
      X509_set_version(cert.get(), X509_VERSION_3) != 1 ||
      ASN1_TIME_set(X509_getm_notBefore(cert.get()), now - kBackdate) == nullptr ||
      ASN1_TIME_set(X509_getm_notAfter(cert.get()), not_after) == nullptr ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return OpenSslError("certificate fields");
  }
  X509_NAME* subject = X509_get_subject_name(cert.get());
  if (!cn.empty() && X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_UTF8,
                                                reinterpret_cast<const unsigned char*>(cn.data()),
                                                static_cast<int>(cn.size()), -1, 0) != 1) {
    return OpenSslError("certificate common name");
  }
  X509_NAME* issuer_name = issuer != nullptr ? X509_get_subject_name(issuer) : subject;
  if (X509_set_issuer_name(cert.get(), issuer_name) != 1) return OpenSslError("certificate issuer");
  return cert;
}

// The guest's protocol: h2 when it offers it (the relay serves HTTP/2 itself, intercept_h2.h),
// else http/1.1, else none. Walks the client's list itself: SSL_select_next_proto answers the
// client's first protocol when nothing matches, and has mishandled empty lists
// (CVE-2024-5535).
int SelectProtocol(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
                   unsigned int inlen, void*) {
  for (std::string_view want : {std::string_view("h2"), std::string_view("http/1.1")}) {
    for (unsigned int i = 0; i < inlen;) {
      unsigned int len = in[i];
      if (len > inlen - i - 1) break;
      if (len == want.size() && std::memcmp(in + i + 1, want.data(), len) == 0) {
        *out = in + i + 1;
        *outlen = static_cast<unsigned char>(len);
        return SSL_TLSEXT_ERR_OK;
      }
      i += 1 + len;
    }
  }
  return SSL_TLSEXT_ERR_NOACK;
}

Status CheckCanonical(const std::string& host) {
  auto canonical = CanonicalHostname(host);
  if (!canonical.ok() || *canonical != host) {
    return InvalidArgument("TLS server name is not a canonical hostname");
  }
  return Status::Ok();
}

Result<UniqueFd> NewEventFd() {
  UniqueFd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!fd.valid()) return ErrnoError("eventfd");
  return fd;
}

int PollMs(std::optional<Clock::time_point> deadline) {
  if (!deadline) return -1;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

// The socket readiness an SSL_get_error answer asks for; 0 when it is not a retry.
short WantEvents(int err) {
  if (err == SSL_ERROR_WANT_READ) return POLLIN;
  if (err == SSL_ERROR_WANT_WRITE) return POLLOUT;
  return 0;
}

// Why a failed call failed; `saved_errno` is errno right after the call.
std::string Describe(int err, int saved_errno) {
  if (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
    return saved_errno != 0 ? std::strerror(saved_errno) : "connection closed";
  }
  if (err == SSL_ERROR_SSL || err == SSL_ERROR_SYSCALL) return OpenSslReason();
  ERR_clear_error();
  return "SSL_get_error " + std::to_string(err);
}

// A TCP end without close_notify: OpenSSL 3 reports SSL_R_UNEXPECTED_EOF_WHILE_READING,
// earlier versions SSL_ERROR_SYSCALL with nothing queued and errno 0.
bool IsUnexpectedEof(int err, int saved_errno) {
  if (err == SSL_ERROR_SSL) {
    return ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING;
  }
  return err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && saved_errno == 0;
}

Status Aborted() { return Unavailable("TLS stream aborted"); }

}  // namespace

// ---------------------------------------------------------------------------------------
// CertAuthority

Result<std::unique_ptr<CertAuthority>> CertAuthority::Create(const std::string& common_name) {
  if (common_name.empty() || common_name.size() > kMaxCommonName) {
    return InvalidArgument("CA common name must be 1 to 64 bytes");
  }
  ERR_clear_error();
  std::unique_ptr<CertAuthority> ca(new CertAuthority());
  ca->ca_key_.reset(EVP_EC_gen("P-256"));
  ca->leaf_key_.reset(EVP_EC_gen("P-256"));
  if (!ca->ca_key_ || !ca->leaf_key_) return OpenSslError("EVP_EC_gen(P-256)");
  ca->ca_not_after_ = std::time(nullptr) + kCaLifetime;
  ASSIGN_OR_RETURN(ca->ca_cert_,
                   NewCertificate(ca->ca_key_.get(), common_name, nullptr, ca->ca_not_after_));
  X509* cert = ca->ca_cert_.get();
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, cert, cert, nullptr, nullptr, 0);
  RETURN_IF_ERROR(AddExtension(cert, &v3, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
  RETURN_IF_ERROR(AddExtension(cert, &v3, NID_key_usage, "critical,keyCertSign,cRLSign"));
  RETURN_IF_ERROR(AddExtension(cert, &v3, NID_subject_key_identifier, "hash"));
  if (X509_sign(cert, ca->ca_key_.get(), EVP_sha256()) == 0) return OpenSslError("X509_sign(CA)");

  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) return OpenSslError("PEM_write_bio_X509");
  char* data = nullptr;
  long len = BIO_get_mem_data(bio.get(), &data);
  ca->cert_pem_.assign(data, static_cast<size_t>(len));
  return ca;
}

CertAuthority::~CertAuthority() = default;

Result<std::shared_ptr<SSL_CTX>> CertAuthority::ServerContext(const std::string& host) {
  RETURN_IF_ERROR(CheckCanonical(host));
  // Minting under the lock serialises it (well under a millisecond each); the cache is
  // checked and filled in one step.
  MutexLock lock(mu_);
  auto it = contexts_.find(host);
  if (it != contexts_.end()) return it->second;
  ASSIGN_OR_RETURN(std::shared_ptr<SSL_CTX> ctx, MintContext(host));
  if (contexts_.size() < kMaxCachedHosts) contexts_.emplace(host, ctx);
  return ctx;
}

Result<std::shared_ptr<SSL_CTX>> CertAuthority::MintContext(const std::string& host) const {
  ERR_clear_error();
  std::time_t not_after = std::min(std::time(nullptr) + kLeafLifetime, ca_not_after_);
  // A name too long for a CN is carried by the SAN alone, which is what clients check.
  const std::string cn = host.size() <= kMaxCommonName ? host : "";
  ASSIGN_OR_RETURN(Owned<X509> leaf,
                   NewCertificate(leaf_key_.get(), cn, ca_cert_.get(), not_after));
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, ca_cert_.get(), leaf.get(), nullptr, nullptr, 0);
  // `host` is canonical (letters, digits, '-', '.'), so it cannot inject into the config
  // syntax of the SAN value.
  RETURN_IF_ERROR(AddExtension(leaf.get(), &v3, NID_basic_constraints, "critical,CA:FALSE"));
  RETURN_IF_ERROR(AddExtension(leaf.get(), &v3, NID_key_usage, "critical,digitalSignature"));
  RETURN_IF_ERROR(AddExtension(leaf.get(), &v3, NID_ext_key_usage, "serverAuth"));
  RETURN_IF_ERROR(AddExtension(leaf.get(), &v3, NID_subject_alt_name, "DNS:" + host));
  RETURN_IF_ERROR(AddExtension(leaf.get(), &v3, NID_subject_key_identifier, "hash"));
  RETURN_IF_ERROR(AddExtension(leaf.get(), &v3, NID_authority_key_identifier, "keyid:always"));
  if (X509_sign(leaf.get(), ca_key_.get(), EVP_sha256()) == 0) {
    return OpenSslError("X509_sign(leaf)");
  }

  Owned<SSL_CTX> ctx(SSL_CTX_new(TLS_server_method()));
  if (!ctx) return OpenSslError("SSL_CTX_new");
  if (SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION) != 1 ||
      SSL_CTX_use_certificate(ctx.get(), leaf.get()) != 1 ||
      SSL_CTX_use_PrivateKey(ctx.get(), leaf_key_.get()) != 1) {
    return OpenSslError("TLS server context for " + host);
  }
  // Renegotiation would let a guest make the proxy run handshakes at will, and no client
  // of an HTTP/1.1 API needs it.
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_alpn_select_cb(ctx.get(), SelectProtocol, nullptr);
  return std::shared_ptr<SSL_CTX>(ctx.release(), tls_internal::OpenSslFree());
}

// ---------------------------------------------------------------------------------------
// UpstreamTls

Result<std::unique_ptr<UpstreamTls>> UpstreamTls::Create(const std::optional<std::string>& ca_file,
                                                         const std::vector<std::string>& alpn) {
  ERR_clear_error();
  std::unique_ptr<UpstreamTls> tls(new UpstreamTls());
  tls->ctx_.reset(SSL_CTX_new(TLS_client_method()));
  SSL_CTX* ctx = tls->ctx_.get();
  if (ctx == nullptr) return OpenSslError("SSL_CTX_new");
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
    return OpenSslError("SSL_CTX_set_min_proto_version");
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (ca_file) {
    // OpenSSL's own message for a missing file does not say which file.
    struct stat st;
    if (::stat(ca_file->c_str(), &st) != 0) return ErrnoError("upstream CA file " + *ca_file);
    if (SSL_CTX_load_verify_file(ctx, ca_file->c_str()) != 1) {
      return InvalidArgument("upstream CA file " + *ca_file + ": " + OpenSslReason());
    }
  } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
    return OpenSslError("system trust store");
  }
  X509_VERIFY_PARAM_set_hostflags(SSL_CTX_get0_param(ctx), X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  // Inverted convention: 0 is success.
  std::string wire;
  for (const auto& p : alpn) {
    if (p.empty() || p.size() > 255) return InvalidArgument("ALPN protocol name length");
    wire += static_cast<char>(p.size());
    wire += p;
  }
  if (SSL_CTX_set_alpn_protos(ctx, reinterpret_cast<const unsigned char*>(wire.data()),
                              static_cast<unsigned int>(wire.size())) != 0) {
    return OpenSslError("SSL_CTX_set_alpn_protos");
  }
  return tls;
}

UpstreamTls::~UpstreamTls() = default;

Result<std::unique_ptr<TlsStream>> UpstreamTls::Connect(UniqueFd fd, const std::string& host,
                                                        Clock::time_point deadline) {
  RETURN_IF_ERROR(CheckCanonical(host));
  return TlsStream::Start(std::move(fd), ctx_.get(), host, deadline);
}

// ---------------------------------------------------------------------------------------
// TlsStream

TlsStream::TlsStream(UniqueFd fd, UniqueFd abort_fd, UniqueFd reader_wake, UniqueFd writer_wake,
                     SSL* ssl)
    : fd_(std::move(fd)),
      abort_fd_(std::move(abort_fd)),
      wake_fd_{std::move(reader_wake), std::move(writer_wake)},
      ssl_(ssl) {}

TlsStream::~TlsStream() { SSL_free(ssl_); }

Result<std::unique_ptr<TlsStream>> TlsStream::Accept(UniqueFd fd, SSL_CTX* ctx,
                                                     Clock::time_point deadline) {
  return Start(std::move(fd), ctx, "", deadline);
}

Result<std::unique_ptr<TlsStream>> TlsStream::Start(UniqueFd fd, SSL_CTX* ctx,
                                                    const std::string& host,
                                                    Clock::time_point deadline) {
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return ErrnoError("fcntl(O_NONBLOCK)");
  }
  ASSIGN_OR_RETURN(UniqueFd abort_fd, NewEventFd());
  ASSIGN_OR_RETURN(UniqueFd reader_wake, NewEventFd());
  ASSIGN_OR_RETURN(UniqueFd writer_wake, NewEventFd());
  ERR_clear_error();
  Owned<SSL> ssl(SSL_new(ctx));
  if (!ssl) return OpenSslError("SSL_new");
  if (SSL_set_fd(ssl.get(), fd.get()) != 1) return OpenSslError("SSL_set_fd");
  // Write returns after each record, so the lock is released between records.
  SSL_set_mode(ssl.get(), SSL_MODE_ENABLE_PARTIAL_WRITE);
  if (host.empty()) {
    SSL_set_accept_state(ssl.get());
  } else {
    SSL_set_connect_state(ssl.get());
    if (SSL_set_tlsext_host_name(ssl.get(), host.c_str()) != 1 ||
        SSL_set1_host(ssl.get(), host.c_str()) != 1) {
      return OpenSslError("TLS server name " + host);
    }
  }
  std::unique_ptr<TlsStream> stream(new TlsStream(std::move(fd), std::move(abort_fd),
                                                  std::move(reader_wake), std::move(writer_wake),
                                                  ssl.release()));
  RETURN_IF_ERROR(stream->Handshake(host, deadline));
  return stream;
}

Status TlsStream::Handshake(const std::string& host, Clock::time_point deadline) {
  const std::string what = host.empty() ? "TLS handshake" : "TLS handshake with " + host;
  for (;;) {
    short events;
    {
      MutexLock lock(mu_);
      BeginCall(kWriter);
      ERR_clear_error();
      int r = SSL_do_handshake(ssl_);
      int saved_errno = errno;
      int err = r == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_, r);
      events = WantEvents(err);
      EndCall(kWriter, events != 0);
      if (err == SSL_ERROR_NONE) {
        const unsigned char* proto = nullptr;
        unsigned int len = 0;
        SSL_get0_alpn_selected(ssl_, &proto, &len);
        if (len > 0) alpn_.assign(reinterpret_cast<const char*>(proto), len);
        return Status::Ok();
      }
      if (events == 0) {
        failed_ = true;
        long verify = SSL_get_verify_result(ssl_);
        if (!host.empty() && verify != X509_V_OK) {
          ERR_clear_error();
          return PermissionDenied("upstream certificate for " + host +
                                  " not trusted: " + X509_verify_cert_error_string(verify));
        }
        return Unavailable(what + ": " + Describe(err, saved_errno));
      }
    }
    Status waited = Wait(kWriter, events, deadline);
    if (waited.code() == Code::kDeadlineExceeded) return DeadlineExceeded(what + ": timed out");
    RETURN_IF_ERROR(waited);
  }
}

void TlsStream::BeginCall(Side side) {
  waiting_[side] = false;
  if (signaled_[side]) {
    signaled_[side] = false;
    uint64_t count;
    ssize_t n = ::read(wake_fd_[side].get(), &count, sizeof count);
    (void)n;  // EAGAIN: already drained; nothing else can fail on an eventfd
  }
}

void TlsStream::EndCall(Side side, bool will_wait) {
  waiting_[side] = will_wait;
  Side other = side == kReader ? kWriter : kReader;
  if (waiting_[other]) {
    waiting_[other] = false;
    signaled_[other] = true;
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd_[other].get(), &one, sizeof one);
    (void)n;  // cannot fail short of 2^64 unread signals
  }
}

Status TlsStream::Wait(Side side, short events, std::optional<Clock::time_point> deadline) const {
  pollfd fds[3] = {
      {fd_.get(), events, 0}, {abort_fd_.get(), POLLIN, 0}, {wake_fd_[side].get(), POLLIN, 0}};
  for (;;) {
    int n = ::poll(fds, 3, PollMs(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("poll");
    if (fds[1].revents != 0 || aborted_.load()) return Aborted();
    if (n == 0) return DeadlineExceeded("no TLS progress in time");
    return Status::Ok();
  }
}

Result<std::string> TlsStream::Read(size_t max, std::optional<Clock::time_point> deadline) {
  if (max == 0) return InvalidArgument("TLS read of 0 bytes");
  const size_t want = std::min(max, kMaxReadChunk);
  std::string buf(want, '\0');
  for (;;) {
    if (aborted_.load()) return Aborted();
    short events;
    {
      MutexLock lock(mu_);
      if (failed_) {
        if (truncated_.load()) return std::string();
        return Unavailable("TLS session already failed");
      }
      BeginCall(kReader);
      ERR_clear_error();
      size_t got = 0;
      int r = SSL_read_ex(ssl_, buf.data(), want, &got);
      int saved_errno = errno;
      int err = r == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_, r);
      events = WantEvents(err);
      EndCall(kReader, events != 0);
      if (err == SSL_ERROR_NONE) {
        buf.resize(got);
        return buf;
      }
      if (err == SSL_ERROR_ZERO_RETURN) return std::string();
      if (events == 0) {
        failed_ = true;
        // Abort's shutdown reads as an EOF here; it is an abort all the same.
        if (aborted_.load()) {
          ERR_clear_error();
          return Aborted();
        }
        if (IsUnexpectedEof(err, saved_errno)) {
          ERR_clear_error();
          truncated_ = true;
          return std::string();
        }
        return Unavailable("TLS read: " + Describe(err, saved_errno));
      }
    }
    RETURN_IF_ERROR(Wait(kReader, events, deadline));
  }
}

Status TlsStream::Write(std::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    if (aborted_.load()) return Aborted();
    short events;
    {
      MutexLock lock(mu_);
      if (failed_) return Unavailable("TLS session already failed");
      if (close_notify_sent_) return FailedPrecondition("TLS write after CloseWrite");
      BeginCall(kWriter);
      ERR_clear_error();
      size_t wrote = 0;
      int r = SSL_write_ex(ssl_, data.data() + done, data.size() - done, &wrote);
      int saved_errno = errno;
      int err = r == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_, r);
      events = WantEvents(err);
      EndCall(kWriter, events != 0);
      if (err == SSL_ERROR_NONE) {
        done += wrote;
        continue;
      }
      if (events == 0) {
        failed_ = true;
        if (aborted_.load()) {
          ERR_clear_error();
          return Aborted();
        }
        return Unavailable("TLS write: " + Describe(err, saved_errno));
      }
    }
    // WANT_READ here: a renegotiation the (TLS 1.2) server started needs its bytes first.
    RETURN_IF_ERROR(Wait(kWriter, events, std::nullopt));
  }
  return Status::Ok();
}

Status TlsStream::CloseWrite() {
  for (;;) {
    if (aborted_.load()) return Aborted();
    short events;
    {
      MutexLock lock(mu_);
      if (close_notify_sent_) break;
      if (failed_) {
        // OpenSSL must not send anything after a fatal error; the TCP end is still owed.
        ::shutdown(fd_.get(), SHUT_WR);
        return Unavailable("TLS session already failed; no close_notify sent");
      }
      BeginCall(kWriter);
      ERR_clear_error();
      // Called once (again only to flush it): a second call would wait for the peer's.
      int r = SSL_shutdown(ssl_);
      int saved_errno = errno;
      int err = r >= 0 ? SSL_ERROR_NONE : SSL_get_error(ssl_, r);
      events = WantEvents(err);
      EndCall(kWriter, events != 0);
      if (err == SSL_ERROR_NONE) {
        close_notify_sent_ = true;
        break;
      }
      if (events == 0) {
        failed_ = true;
        return Unavailable("TLS close_notify: " + Describe(err, saved_errno));
      }
    }
    RETURN_IF_ERROR(Wait(kWriter, events, std::nullopt));
  }
  if (::shutdown(fd_.get(), SHUT_WR) != 0) return Unavailable(ErrnoError("shutdown").message());
  return Status::Ok();
}

void TlsStream::Abort() {
  // The flag first: a Read that then sees the shutdown's EOF reports an abort, not an end.
  aborted_ = true;
  ::shutdown(fd_.get(), SHUT_RDWR);
  uint64_t one = 1;
  ssize_t n = ::write(abort_fd_.get(), &one, sizeof one);
  (void)n;
}

}  // namespace trybox::egress
