// The per-VM CA's certificates, checked with OpenSSL's own verifier, and TlsStreams over
// real loopback TCP connections: a server end from CertAuthority, a client end from
// UpstreamTls trusting the CA through a PEM file, as the egress proxy will use them.
#include "egress/tls.h"

#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <csignal>
#include <future>
#include <random>
#include <thread>

#include "util/fd.h"
#include "util/tcp.h"

namespace trybox::egress {
namespace {

using Clock = std::chrono::steady_clock;
using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;

// A deadline no healthy run comes near; it only bounds a broken one.
Clock::time_point Generous() { return Clock::now() + std::chrono::seconds(30); }

X509Ptr ParsePem(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), X509_free);
}

// X509_V_OK, or why `leaf` does not verify as a TLS server certificate for `host` with
// `ca` as the only trust anchor.
int VerifyLeaf(X509* ca, X509* leaf, const std::string& host) {
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), X509_STORE_free);
  X509_STORE_add_cert(store.get(), ca);
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(X509_STORE_CTX_new(),
                                                                      X509_STORE_CTX_free);
  X509_STORE_CTX_init(ctx.get(), store.get(), leaf, nullptr);
  X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_SERVER);
  X509_VERIFY_PARAM_set1_host(X509_STORE_CTX_get0_param(ctx.get()), host.c_str(), 0);
  int ok = X509_verify_cert(ctx.get());
  return ok == 1 ? X509_V_OK : X509_STORE_CTX_get_error(ctx.get());
}

bool ExtensionIsCritical(X509* cert, int nid) {
  int at = X509_get_ext_by_NID(cert, nid, -1);
  return at >= 0 && X509_EXTENSION_get_critical(X509_get_ext(cert, at)) == 1;
}

// Whole seconds from notBefore to notAfter.
long ValiditySeconds(X509* cert) {
  int days = 0, secs = 0;
  ASN1_TIME_diff(&days, &secs, X509_get0_notBefore(cert), X509_get0_notAfter(cert));
  return days * 86400L + secs;
}

struct TcpPair {
  UniqueFd client;
  UniqueFd server;
};

TcpPair Connected() {
  auto listener = ListenTcpLoopback(0);
  EXPECT_TRUE(listener.ok()) << listener.status().ToString();
  auto client = ConnectTcpLoopback(listener->port);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  auto server = AcceptTcp(listener->fd.get());
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return {std::move(client).value(), std::move(server).value()};
}

// Reads until the peer's end of its direction.
std::string ReadToEnd(TlsStream& s) {
  std::string out;
  for (;;) {
    auto got = s.Read(256 * 1024, Generous());
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (!got.ok() || got->empty()) return out;
    out += *got;
  }
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

// A blocking OpenSSL client that verifies nothing, offering `alpn` (wire format), for
// what UpstreamTls cannot do: offer h2, or start a key update.
struct RawClient {
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx{nullptr, SSL_CTX_free};
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl{nullptr, SSL_free};
  UniqueFd fd;
  bool connected = false;
  std::string alpn;
};

std::unique_ptr<RawClient> RawConnect(UniqueFd fd, std::string_view alpn) {
  auto c = std::make_unique<RawClient>();
  c->fd = std::move(fd);
  c->ctx.reset(SSL_CTX_new(TLS_client_method()));
  SSL_CTX_set_alpn_protos(c->ctx.get(), reinterpret_cast<const unsigned char*>(alpn.data()),
                          static_cast<unsigned int>(alpn.size()));
  c->ssl.reset(SSL_new(c->ctx.get()));
  SSL_set_fd(c->ssl.get(), c->fd.get());
  SSL_set_tlsext_host_name(c->ssl.get(), "upstream.test");
  c->connected = SSL_connect(c->ssl.get()) == 1;
  const unsigned char* proto = nullptr;
  unsigned int len = 0;
  SSL_get0_alpn_selected(c->ssl.get(), &proto, &len);
  if (len > 0) c->alpn.assign(reinterpret_cast<const char*>(proto), len);
  return c;
}

class TlsTest : public ::testing::Test {
 protected:
  // As in tryboxd: a peer gone mid-write must be an error, not the end of the process.
  static void SetUpTestSuite() { ::signal(SIGPIPE, SIG_IGN); }

  void SetUp() override {
    auto ca = CertAuthority::Create("trybox test CA");
    ASSERT_TRUE(ca.ok()) << ca.status().ToString();
    ca_ = std::move(ca).value();
    auto dir = TempDir::Make("/tmp", "tbx-tls-test-");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    dir_.emplace(std::move(dir).value());
    ca_file_ = dir_->path() + "/ca.pem";
    ASSERT_TRUE(WriteFileAtomic(ca_file_, ca_->cert_pem()).ok());
    auto upstream = UpstreamTls::Create(ca_file_);
    ASSERT_TRUE(upstream.ok()) << upstream.status().ToString();
    upstream_ = std::move(upstream).value();
  }

  struct Session {
    Result<std::unique_ptr<TlsStream>> server = Internal("not run");
    Result<std::unique_ptr<TlsStream>> client = Internal("not run");
  };

  // A server end presenting `minter`'s certificate for `served`, and an UpstreamTls client
  // end (trusting `upstream`'s roots) dialling `dialled`, over one loopback connection.
  Session Handshake(CertAuthority& minter, const std::string& served, UpstreamTls& upstream,
                    const std::string& dialled) {
    TcpPair pair = Connected();
    auto ctx = minter.ServerContext(served);
    EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
    Session s;
    std::thread server(
        [&] { s.server = TlsStream::Accept(std::move(pair.server), ctx->get(), Generous()); });
    s.client = upstream.Connect(std::move(pair.client), dialled, Generous());
    server.join();
    return s;
  }

  Session Handshake() { return Handshake(*ca_, "upstream.test", *upstream_, "upstream.test"); }

  std::unique_ptr<CertAuthority> ca_;
  std::optional<TempDir> dir_;
  std::string ca_file_;
  std::unique_ptr<UpstreamTls> upstream_;
};

TEST_F(TlsTest, ALeafMintedForAHostVerifiesAgainstTheCaWithThatHostnameOnly) {
  auto ctx = ca_->ServerContext("upstream.test");
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  X509* leaf = SSL_CTX_get0_certificate(ctx->get());
  ASSERT_NE(leaf, nullptr);
  X509Ptr ca_cert = ParsePem(ca_->cert_pem());
  ASSERT_NE(ca_cert, nullptr);

  EXPECT_EQ(VerifyLeaf(ca_cert.get(), leaf, "upstream.test"), X509_V_OK);
  EXPECT_EQ(VerifyLeaf(ca_cert.get(), leaf, "other.test"), X509_V_ERR_HOSTNAME_MISMATCH);
  EXPECT_EQ(VerifyLeaf(ca_cert.get(), leaf, "sub.upstream.test"), X509_V_ERR_HOSTNAME_MISMATCH);

  auto other = CertAuthority::Create("another VM's CA");
  ASSERT_TRUE(other.ok());
  X509Ptr other_cert = ParsePem((*other)->cert_pem());
  EXPECT_EQ(VerifyLeaf(other_cert.get(), leaf, "upstream.test"),
            X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY);
}

TEST_F(TlsTest, TheCaCertificateIsAPathLenZeroCaWithARandomPositiveSerial) {
  X509Ptr cert = ParsePem(ca_->cert_pem());
  ASSERT_NE(cert, nullptr);
  EXPECT_EQ(ca_->cert_pem().find("PRIVATE KEY"), std::string::npos);
  EXPECT_EQ(X509_get_version(cert.get()), X509_VERSION_3);
  EXPECT_EQ(X509_check_ca(cert.get()), 1);
  EXPECT_EQ(X509_get_pathlen(cert.get()), 0);
  EXPECT_TRUE(ExtensionIsCritical(cert.get(), NID_basic_constraints));
  EXPECT_TRUE(ExtensionIsCritical(cert.get(), NID_key_usage));
  EXPECT_EQ(X509_get_key_usage(cert.get()), static_cast<uint32_t>(KU_KEY_CERT_SIGN | KU_CRL_SIGN));
  EXPECT_NE(X509_get0_subject_key_id(cert.get()), nullptr);
  EXPECT_EQ(X509_check_issued(cert.get(), cert.get()), X509_V_OK);  // self-signed
  EXPECT_EQ(X509_get_signature_nid(cert.get()), NID_ecdsa_with_SHA256);

  EVP_PKEY* key = X509_get0_pubkey(cert.get());
  EXPECT_EQ(EVP_PKEY_get_base_id(key), EVP_PKEY_EC);
  EXPECT_EQ(EVP_PKEY_get_bits(key), 256);
  // An hour back for lagging guest clocks, then a year.
  EXPECT_EQ(ValiditySeconds(cert.get()), 365 * 86400L + 3600);

  auto serial = [](X509* c) {
    std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(
        ASN1_INTEGER_to_BN(X509_get0_serialNumber(c), nullptr), BN_free);
    return bn;
  };
  auto mine = serial(cert.get());
  EXPECT_FALSE(BN_is_negative(mine.get()));
  EXPECT_FALSE(BN_is_zero(mine.get()));
  EXPECT_LE(BN_num_bits(mine.get()), 128);
  auto other = CertAuthority::Create("trybox test CA");
  ASSERT_TRUE(other.ok());
  X509Ptr other_cert = ParsePem((*other)->cert_pem());
  EXPECT_NE(BN_cmp(mine.get(), serial(other_cert.get()).get()), 0);
}

TEST_F(TlsTest, ALeafIsAServerCertificateNamingOnlyItsHostAndNeverOutlivingTheCa) {
  auto ctx = ca_->ServerContext("api.upstream.test");
  ASSERT_TRUE(ctx.ok());
  X509* leaf = SSL_CTX_get0_certificate(ctx->get());
  X509Ptr ca_cert = ParsePem(ca_->cert_pem());

  auto* sans =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(leaf, NID_subject_alt_name, nullptr, nullptr));
  ASSERT_NE(sans, nullptr);
  ASSERT_EQ(sk_GENERAL_NAME_num(sans), 1);
  const GENERAL_NAME* san = sk_GENERAL_NAME_value(sans, 0);
  ASSERT_EQ(san->type, GEN_DNS);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(san->d.dNSName)),
                        ASN1_STRING_length(san->d.dNSName)),
            "api.upstream.test");
  GENERAL_NAMES_free(sans);

  char cn[256] = "";
  X509_NAME_get_text_by_NID(X509_get_subject_name(leaf), NID_commonName, cn, sizeof cn);
  EXPECT_STREQ(cn, "api.upstream.test");
  EXPECT_EQ(X509_check_ca(leaf), 0);
  EXPECT_EQ(X509_get_extended_key_usage(leaf), static_cast<uint32_t>(XKU_SSL_SERVER));
  EXPECT_EQ(X509_get_key_usage(leaf), static_cast<uint32_t>(KU_DIGITAL_SIGNATURE));
  ASSERT_NE(X509_get0_authority_key_id(leaf), nullptr);
  EXPECT_EQ(ASN1_OCTET_STRING_cmp(X509_get0_authority_key_id(leaf),
                                  X509_get0_subject_key_id(ca_cert.get())),
            0);
  EXPECT_EQ(X509_get_signature_nid(leaf), NID_ecdsa_with_SHA256);
  EXPECT_EQ(ValiditySeconds(leaf), 90 * 86400L + 3600);
  EXPECT_LE(ASN1_TIME_compare(X509_get0_notAfter(leaf), X509_get0_notAfter(ca_cert.get())), 0);
}

TEST_F(TlsTest, AServerContextIsMintedOncePerHostAndOnlyForCanonicalNames) {
  auto a = ca_->ServerContext("upstream.test");
  auto again = ca_->ServerContext("upstream.test");
  auto b = ca_->ServerContext("other.test");
  ASSERT_TRUE(a.ok() && again.ok() && b.ok());
  EXPECT_EQ(a->get(), again->get());
  EXPECT_NE(a->get(), b->get());

  for (const char* bad : {"Upstream.test", "1.2.3.4", "", "a,DNS:evil.test", "upstream.test."}) {
    auto r = ca_->ServerContext(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST_F(TlsTest, TheContextStaysUsableAfterTheCaIsGone) {
  auto ctx = ca_->ServerContext("upstream.test");
  ASSERT_TRUE(ctx.ok());
  std::shared_ptr<SSL_CTX> kept = *ctx;
  ca_.reset();
  TcpPair pair = Connected();
  Result<std::unique_ptr<TlsStream>> server = Internal("not run");
  std::thread t([&] { server = TlsStream::Accept(std::move(pair.server), kept, Generous()); });
  auto client = upstream_->Connect(std::move(pair.client), "upstream.test", Generous());
  t.join();
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_TRUE(client.ok()) << client.status().ToString();
}

TEST_F(TlsTest, AMebibyteFlowsEachWayConcurrentlyAndCloseWriteEndsEachDirection) {
  Session s = Handshake();
  ASSERT_TRUE(s.server.ok()) << s.server.status().ToString();
  ASSERT_TRUE(s.client.ok()) << s.client.status().ToString();
  TlsStream& server = **s.server;
  TlsStream& client = **s.client;
  EXPECT_EQ(server.alpn(), "http/1.1");
  EXPECT_EQ(client.alpn(), "http/1.1");

  const std::string up = RandomBytes(1 << 20, 1);
  const std::string down = RandomBytes(1 << 20, 2);
  auto send = [](TlsStream& to, const std::string& data) {
    for (size_t at = 0; at < data.size(); at += 64 * 1024) {
      Status st = to.Write(std::string_view(data).substr(at, 64 * 1024));
      if (!st.ok()) return st;
    }
    return to.CloseWrite();
  };
  // Each stream is written by one thread while another reads it, as in the relay. Neither
  // side reads before it has written everything, so without concurrent Read and Write both
  // would stall on full socket buffers.
  auto client_sent = std::async(std::launch::async, [&] { return send(client, up); });
  auto server_sent = std::async(std::launch::async, [&] { return send(server, down); });
  auto client_got = std::async(std::launch::async, [&] { return ReadToEnd(client); });
  std::string server_got = ReadToEnd(server);

  EXPECT_TRUE(client_sent.get().ok());
  EXPECT_TRUE(server_sent.get().ok());
  EXPECT_TRUE(server_got == up) << "server got " << server_got.size() << " bytes";
  std::string got = client_got.get();
  EXPECT_TRUE(got == down) << "client got " << got.size() << " bytes";
  EXPECT_FALSE(server.truncated());
  EXPECT_FALSE(client.truncated());
}

TEST_F(TlsTest, AfterCloseWriteThePeerReadsTheEndAndCanStillAnswer) {
  Session s = Handshake();
  ASSERT_TRUE(s.server.ok() && s.client.ok());
  TlsStream& server = **s.server;
  TlsStream& client = **s.client;

  ASSERT_TRUE(client.Write("GET / HTTP/1.1\r\n\r\n").ok());
  ASSERT_TRUE(client.CloseWrite().ok());
  EXPECT_EQ(ReadToEnd(server), "GET / HTTP/1.1\r\n\r\n");
  EXPECT_EQ(client.Write("more").code(), Code::kFailedPrecondition);

  ASSERT_TRUE(server.Write("HTTP/1.1 200 OK\r\n\r\n").ok());
  ASSERT_TRUE(server.CloseWrite().ok());
  EXPECT_EQ(ReadToEnd(client), "HTTP/1.1 200 OK\r\n\r\n");
  EXPECT_FALSE(client.truncated());
  EXPECT_FALSE(server.truncated());
}

TEST_F(TlsTest, ATcpEndWithoutCloseNotifyReadsAsATruncatedEnd) {
  Session s = Handshake();
  ASSERT_TRUE(s.server.ok() && s.client.ok());
  ASSERT_TRUE((*s.server)->Write("partial").ok());
  (*s.server)->Abort();  // shutdown(SHUT_RDWR): a FIN, no close_notify
  TlsStream& client = **s.client;
  EXPECT_EQ(ReadToEnd(client), "partial");
  EXPECT_TRUE(client.truncated());
}

TEST_F(TlsTest, AServerCertificateFromAnotherCaIsNotTrusted) {
  auto other = CertAuthority::Create("another VM's CA");
  ASSERT_TRUE(other.ok());
  Session s = Handshake(**other, "upstream.test", *upstream_, "upstream.test");
  ASSERT_FALSE(s.client.ok());
  EXPECT_EQ(s.client.status().code(), Code::kPermissionDenied);
  EXPECT_EQ(s.client.status().message(),
            "upstream certificate for upstream.test not trusted: unable to get local issuer "
            "certificate");
  // The client's alert ends the server's handshake too.
  EXPECT_EQ(s.server.status().code(), Code::kUnavailable) << s.server.status().ToString();
}

TEST_F(TlsTest, ACertificateForAnotherHostIsAHostnameMismatch) {
  Session s = Handshake(*ca_, "other.test", *upstream_, "upstream.test");
  ASSERT_FALSE(s.client.ok());
  EXPECT_EQ(s.client.status().code(), Code::kPermissionDenied);
  EXPECT_EQ(s.client.status().message(),
            "upstream certificate for upstream.test not trusted: hostname mismatch");
}

TEST_F(TlsTest, TheSystemTrustStoreDoesNotTrustAVmCa) {
  auto system = UpstreamTls::Create(std::nullopt);
  ASSERT_TRUE(system.ok()) << system.status().ToString();
  Session s = Handshake(*ca_, "upstream.test", **system, "upstream.test");
  EXPECT_EQ(s.client.status().code(), Code::kPermissionDenied) << s.client.status().ToString();
}

// The guest is served HTTP/2 when it offers it (intercept_h2.h), HTTP/1.1 when that is all it
// offers, and no protocol when it offers neither.
void ExpectAlpn(CertAuthority& ca, std::string_view offer, const std::string& chosen) {
  TcpPair pair = Connected();
  auto ctx = ca.ServerContext("upstream.test");
  ASSERT_TRUE(ctx.ok());
  auto raw = std::async(std::launch::async, [fd = std::move(pair.client), offer]() mutable {
    return RawConnect(std::move(fd), offer);
  });
  auto server = TlsStream::Accept(std::move(pair.server), ctx->get(), Generous());
  auto client = raw.get();
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_TRUE(client->connected);
  EXPECT_EQ((*server)->alpn(), chosen);
  EXPECT_EQ(client->alpn, chosen);
}

TEST_F(TlsTest, AClientOfferingHttp11AndH2GetsH2) {
  ExpectAlpn(*ca_, std::string_view("\x08http/1.1\x02h2", 12), "h2");
}

TEST_F(TlsTest, AClientOfferingOnlyHttp11GetsHttp11) {
  ExpectAlpn(*ca_, std::string_view("\x08http/1.1", 9), "http/1.1");
}

TEST_F(TlsTest, AClientOfferingNeitherNegotiatesNoAlpn) {
  ExpectAlpn(*ca_, std::string_view("\x08spdy/3.1\x03h2c", 13), "");
}

TEST_F(TlsTest, ASessionSurvivesAKeyUpdateThePeerRequests) {
  TcpPair pair = Connected();
  auto ctx = ca_->ServerContext("upstream.test");
  ASSERT_TRUE(ctx.ok());
  auto raw = std::async(std::launch::async, [fd = std::move(pair.client)]() mutable {
    return RawConnect(std::move(fd), std::string_view("\x08http/1.1", 9));
  });
  auto server = TlsStream::Accept(std::move(pair.server), ctx->get(), Generous());
  auto client = raw.get();
  ASSERT_TRUE(server.ok() && client->connected);
  ASSERT_EQ(SSL_version(client->ssl.get()), TLS1_3_VERSION);

  // The server must answer the requested update with its own before its next record.
  ASSERT_EQ(SSL_key_update(client->ssl.get(), SSL_KEY_UPDATE_REQUESTED), 1);
  ASSERT_EQ(SSL_write(client->ssl.get(), "ping", 4), 4);
  auto got = (*server)->Read(100, Generous());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "ping");
  ASSERT_TRUE((*server)->Write("pong").ok());
  char buf[16];
  int n = SSL_read(client->ssl.get(), buf, sizeof buf);
  ASSERT_EQ(n, 4);
  EXPECT_EQ(std::string(buf, 4), "pong");
}

TEST_F(TlsTest, AbortFromAnotherThreadUnblocksABlockedRead) {
  Session s = Handshake();
  ASSERT_TRUE(s.server.ok() && s.client.ok());
  TlsStream& server = **s.server;
  // No deadline and a silent peer: only Abort can end this Read.
  auto read = std::async(std::launch::async, [&] { return server.Read(1024, std::nullopt); });
  server.Abort();
  ASSERT_EQ(read.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(read.get().status().code(), Code::kUnavailable);
  EXPECT_EQ(server.Write("x").code(), Code::kUnavailable);
  EXPECT_EQ(server.Read(10, std::nullopt).status().code(), Code::kUnavailable);
}

TEST_F(TlsTest, AbortFromAnotherThreadUnblocksAWriteToAPeerThatDoesNotRead) {
  Session s = Handshake();
  ASSERT_TRUE(s.server.ok() && s.client.ok());
  TlsStream& server = **s.server;
  // Far more than the socket buffers hold, so the Write blocks until aborted.
  const std::string big(64 << 20, 'x');
  auto write = std::async(std::launch::async, [&] { return server.Write(big); });
  server.Abort();
  ASSERT_EQ(write.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(write.get().code(), Code::kUnavailable);
}

TEST_F(TlsTest, AReadPastItsDeadlineFailsAndTheStreamStaysUsable) {
  Session s = Handshake();
  ASSERT_TRUE(s.server.ok() && s.client.ok());
  auto got = (*s.client)->Read(100, Clock::now() + std::chrono::milliseconds(50));
  EXPECT_EQ(got.status().code(), Code::kDeadlineExceeded);
  ASSERT_TRUE((*s.server)->Write("late").ok());
  got = (*s.client)->Read(100, Generous());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "late");
}

TEST_F(TlsTest, AHandshakeWithAPeerThatSendsNothingMissesItsDeadline) {
  TcpPair to_server = Connected();  // its server end stays open and silent
  auto client = upstream_->Connect(std::move(to_server.client), "upstream.test",
                                   Clock::now() + std::chrono::milliseconds(100));
  EXPECT_EQ(client.status().code(), Code::kDeadlineExceeded);
  EXPECT_EQ(client.status().message(), "TLS handshake with upstream.test: timed out");

  TcpPair from_client = Connected();  // its client end stays open and silent
  auto ctx = ca_->ServerContext("upstream.test");
  ASSERT_TRUE(ctx.ok());
  auto server = TlsStream::Accept(std::move(from_client.server), ctx->get(),
                                  Clock::now() + std::chrono::milliseconds(100));
  EXPECT_EQ(server.status().code(), Code::kDeadlineExceeded);
  EXPECT_EQ(server.status().message(), "TLS handshake: timed out");
}

TEST_F(TlsTest, AHandshakeWithAPeerThatHangsUpIsUnavailable) {
  TcpPair pair = Connected();
  pair.server.Reset();
  auto client = upstream_->Connect(std::move(pair.client), "upstream.test", Generous());
  EXPECT_EQ(client.status().code(), Code::kUnavailable) << client.status().ToString();
  EXPECT_NE(client.status().message().find("TLS handshake with upstream.test: "),
            std::string::npos);
}

TEST_F(TlsTest, ACaFileThatDoesNotExistIsAnErrorNamingIt) {
  const std::string missing = dir_->path() + "/no-such-ca.pem";
  auto r = UpstreamTls::Create(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos) << r.status().message();
}

TEST_F(TlsTest, ACaFileWithoutCertificatesIsAnErrorNamingIt) {
  const std::string junk = dir_->path() + "/junk.pem";
  ASSERT_TRUE(WriteFileAtomic(junk, "not a certificate\n").ok());
  auto r = UpstreamTls::Create(junk);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find(junk), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace trybox::egress
