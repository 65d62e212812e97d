// Interception's cost (issue 13, docs/secrets.md). Prints figures; asserts nothing.
//
// The egress proxy (egress::ServeConnection, as tryboxd runs it for one VM) serves a client
// on the host's loopback; a TLS origin on loopback answers GET /bytes/N. The same requests go
// once through an opaque tunnel (the origin's name bound to no secret) and once through an
// intercepted one (bound to a secret whose placeholder is in the request), in alternating
// rounds in one process, so the ratios compare like with like:
//
//   request latency   a new connection per request: CONNECT, TLS, GET of 1 KiB, the reply;
//                     p50/p99 and the ratio intercepted/opaque
//   throughput        GET of --mib MiB through one connection, MB/s and the ratio
//   handshakes/s      connections per second through the interception, one after another
//                     (each is two TLS handshakes: the guest's and the upstream's)
//   HTTP rules        the same intercepted requests on a proxy whose VM also has 20 HTTP
//                     rules for the host, the allowing one last (each request walks them
//                     all): latency p50 and its ratio to the intercepted proxy without rules
//   HTTP/2            the client offers h2 (as curl does) on the intercepted proxy: one
//                     connection per round, --requests GETs of 1 KiB one after another on
//                     it (p50/p99; the relay's lane to the origin is reused), then --mib MiB
//                     on one stream (MB/s and the ratio to HTTP/1.1 intercepted)
//
// No VM is involved: this is the host's share (the guest channel adds the same to both).
// Usage: intercept_bench [--requests N] [--mib N] [--rounds N]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "egress/http_rules.h"
#include "egress/proxy.h"
#include "egress/secrets.h"
#include "egress/tls.h"
#include "tests/h2/h2_client.h"
#include "util/ascii.h"
#include "util/fd.h"
#include "util/tcp.h"

using namespace trybox;
using trybox::bench::Clock;
using trybox::bench::Die;
using trybox::bench::Ms;
using trybox::bench::Pct;

namespace {

constexpr char kHost[] = "origin.test";

// Loopback with Nagle on turns a TLS handshake's small writes into 40 ms delayed-ACK waits;
// the daemon's own sockets set TCP_NODELAY, so the bench's do too.
int NoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// GET /bytes/N -> N bytes, one request per connection.
class Origin {
 public:
  explicit Origin(egress::CertAuthority& ca) {
    auto ctx = ca.ServerContext(kHost);
    if (!ctx.ok()) Die("origin context", ctx.status());
    ctx_ = *ctx;
    auto l = ListenTcpLoopback(0, 256);
    if (!l.ok()) Die("listen", l.status());
    l_ = std::move(*l);
    accept_ = std::thread([this] {
      for (;;) {
        auto c = AcceptTcp(l_.fd.get());
        if (!c.ok()) return;
        NoDelay(c->get());
        std::thread([this, fd = std::move(*c)]() mutable { Serve(std::move(fd)); }).detach();
      }
    });
  }
  ~Origin() {
    ::shutdown(l_.fd.get(), SHUT_RDWR);
    accept_.join();
  }
  uint16_t port() const { return l_.port; }

 private:
  // Requests one after another on the connection until one asks to close it (HTTP/1.1
  // keep-alive, so that the HTTP/2 relay's lanes are reused as with a real server).
  void Serve(UniqueFd fd) {
    auto tls =
        egress::TlsStream::Accept(std::move(fd), ctx_, Clock::now() + std::chrono::seconds(10));
    if (!tls.ok()) return;
    std::string buf;
    for (;;) {
      while (buf.find("\r\n\r\n") == std::string::npos) {
        auto more = (*tls)->Read(16384, Clock::now() + std::chrono::seconds(60));
        if (!more.ok() || more->empty()) return;
        buf += *more;
      }
      std::string head = buf.substr(0, buf.find("\r\n\r\n") + 4);
      buf.erase(0, head.size());
      bool close = AsciiLower(head).find("connection: close") != std::string::npos;
      size_t n = std::stoul(head.substr(head.find("/bytes/") + 7));
      if (!(*tls)
               ->Write("HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(n) +
                       (close ? "\r\nConnection: close" : "") + "\r\n\r\n")
               .ok()) {
        return;
      }
      std::string chunk(256 * 1024, 'x');
      while (n > 0) {
        size_t k = std::min(n, chunk.size());
        if (!(*tls)->Write(std::string_view(chunk.data(), k)).ok()) return;
        n -= k;
      }
      if (close) {
        (void)(*tls)->CloseWrite();
        return;
      }
    }
  }

  std::shared_ptr<SSL_CTX> ctx_;
  TcpListener l_;
  std::thread accept_;
};

// One VM's proxy on loopback: each accepted connection is served by ServeConnection.
class Proxy {
 public:
  Proxy(egress::ProxyContext ctx) : ctx_(std::move(ctx)) {
    auto l = ListenTcpLoopback(0, 256);
    if (!l.ok()) Die("listen", l.status());
    l_ = std::move(*l);
    accept_ = std::thread([this] {
      for (;;) {
        auto c = AcceptTcp(l_.fd.get());
        if (!c.ok()) return;
        NoDelay(c->get());
        std::thread([this, fd = std::move(*c)] {
          egress::FdClient client(fd.get());
          (void)egress::ServeConnection(client, ctx_);
        }).detach();
      }
    });
  }
  ~Proxy() {
    ::shutdown(l_.fd.get(), SHUT_RDWR);
    accept_.join();
  }
  uint16_t port() const { return l_.port; }

 private:
  egress::ProxyContext ctx_;
  TcpListener l_;
  std::thread accept_;
};

// A connection through `proxy`'s CONNECT tunnel to the origin, with TLS to its name over
// `tls` (whose ALPN says which HTTP the relay speaks).
std::unique_ptr<egress::TlsStream> Tunnel(uint16_t proxy, uint16_t origin,
                                          egress::UpstreamTls& tls) {
  auto fd = ConnectTcpLoopback(proxy);
  if (!fd.ok()) Die("connect proxy", fd.status());
  NoDelay(fd->get());
  std::string connect = "CONNECT " + std::string(kHost) + ":" + std::to_string(origin) +
                        " HTTP/1.1\r\nHost: " + kHost + "\r\n\r\n";
  if (!WriteFull(fd->get(), connect).ok()) Die("write CONNECT", Internal("short write"));
  std::string reply;
  char c;
  while (reply.find("\r\n\r\n") == std::string::npos) {
    auto got = ReadSome(fd->get(), &c, 1);
    if (!got.ok() || *got == 0) Die("CONNECT reply", Unavailable("closed"));
    reply += c;
  }
  if (reply.rfind("HTTP/1.1 200", 0) != 0) Die("CONNECT", Unavailable(reply.substr(0, 200)));
  auto s = tls.Connect(std::move(*fd), kHost, Clock::now() + std::chrono::seconds(10));
  if (!s.ok()) Die("TLS through the proxy", s.status());
  return std::move(*s);
}

// CONNECT through `proxy`, TLS to the origin's name, GET /bytes/n with `auth`; the body
// bytes read.
size_t Fetch(uint16_t proxy, uint16_t origin, egress::UpstreamTls& tls, size_t n,
             const std::string& auth) {
  auto s = Tunnel(proxy, origin, tls);
  std::string get = "GET /bytes/" + std::to_string(n) + " HTTP/1.1\r\nHost: " + kHost +
                    "\r\nAuthorization: Bearer " + auth + "\r\nConnection: close\r\n\r\n";
  if (!s->Write(get).ok()) Die("GET", Unavailable("write"));
  size_t total = 0;
  std::string head;
  bool in_body = false;
  for (;;) {
    auto more = s->Read(256 * 1024, Clock::now() + std::chrono::seconds(60));
    if (!more.ok()) Die("read reply", more.status());
    if (more->empty()) break;
    if (in_body) {
      total += more->size();
      continue;
    }
    head += *more;
    size_t end = head.find("\r\n\r\n");
    if (end != std::string::npos) {
      in_body = true;
      total += head.size() - end - 4;
    }
  }
  if (total != n)
    Die("reply", Internal("got " + std::to_string(total) + " of " + std::to_string(n)));
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  int requests = 100, mib = 64, rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (a == "--requests") requests = v;
    if (a == "--mib") mib = v;
    if (a == "--rounds") rounds = v;
  }
  ::signal(SIGPIPE, SIG_IGN);
  auto origin_ca = egress::CertAuthority::Create("bench origin CA");
  auto vm_ca = egress::CertAuthority::Create("bench VM CA");
  if (!origin_ca.ok() || !vm_ca.ok())
    Die("CA", origin_ca.ok() ? vm_ca.status() : origin_ca.status());
  auto dir = TempDir::Make("/tmp", "tbx-intercept-bench-");
  if (!dir.ok()) Die("temp dir", dir.status());
  // The proxy trusts the origin's CA; the client trusts both (it meets the origin's own
  // certificate through an opaque tunnel and the VM CA's through an intercepted one).
  std::string origin_pem = dir->path() + "/origin.pem", both_pem = dir->path() + "/both.pem";
  if (!WriteFileAtomic(origin_pem, (*origin_ca)->cert_pem()).ok() ||
      !WriteFileAtomic(both_pem, (*origin_ca)->cert_pem() + (*vm_ca)->cert_pem()).ok()) {
    Die("write CA files", Internal("write"));
  }
  auto upstream_tls = egress::UpstreamTls::Create(origin_pem);
  auto client_tls = egress::UpstreamTls::Create(both_pem);
  if (!upstream_tls.ok() || !client_tls.ok()) Die("TLS contexts", upstream_tls.status());
  egress::SecretInput in;
  in.name = "TOKEN";
  in.value = "the-real-value-0123456789abcdef";
  in.hosts = {kHost};
  auto secrets = egress::SecretSet::Make({in});
  if (!secrets.ok()) Die("secrets", secrets.status());
  const std::string placeholder = (*secrets)->secrets()[0].placeholder;
  auto unrelated = egress::SecretSet::Make({[] {
    egress::SecretInput u;
    u.name = "OTHER";
    u.value = "unrelated-value-0123456789";
    u.hosts = {"elsewhere.test"};
    return u;
  }()});
  if (!unrelated.ok()) Die("secrets", unrelated.status());

  Origin origin(**origin_ca);
  egress::Policy policy;
  policy.reach.allow =
      egress::AllowList::Parse({std::string(kHost) + ":" + std::to_string(origin.port())}).value();
  policy.overrides.push_back(
      egress::AddressOverride::Parse("127.0.0.1:" + std::to_string(origin.port())).value());
  auto resolver = egress::MapResolver::FromJson({{kHost, {"127.0.0.1"}}});
  if (!resolver.ok()) Die("resolver", resolver.status());
  egress::TunnelSlots slots_a(256), slots_b(256), slots_c(256);
  std::vector<std::string> rule_texts;
  for (int i = 0; i < 19; ++i) {
    rule_texts.push_back("deny * " + std::string(kHost) + "/repos/owner" + std::to_string(i));
  }
  rule_texts.push_back("allow GET " + std::string(kHost) + "/bytes");
  auto rules = egress::HttpRules::Make(rule_texts);
  if (!rules.ok()) Die("HTTP rules", rules.status());
  // Same code path for both; only whether the host is bound to one of the VM's secrets differs.
  Proxy opaque({&policy, resolver->get(), &slots_a, nullptr, "bench", unrelated->get(),
                vm_ca->get(), upstream_tls->get()});
  Proxy intercepted({&policy, resolver->get(), &slots_b, nullptr, "bench", secrets->get(),
                     vm_ca->get(), upstream_tls->get()});
  Proxy ruled({&policy, resolver->get(), &slots_c, nullptr, "bench", secrets->get(), vm_ca->get(),
               upstream_tls->get(), &*rules});

  std::printf("interception on the host's loopback (no VM), %d rounds alternated\n", rounds);
  std::vector<double> lat_o, lat_i, mbs_o, mbs_i, hs, lat_r;
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      bool icpt = (k + r) % 2 == 1;
      Proxy& p = icpt ? intercepted : opaque;
      auto& lat = icpt ? lat_i : lat_o;
      for (int i = 0; i < requests; ++i) {
        auto t0 = Clock::now();
        Fetch(p.port(), origin.port(), **client_tls, 1024, placeholder);
        lat.push_back(Ms(t0, Clock::now()));
      }
      size_t bytes = static_cast<size_t>(mib) << 20;
      auto t0 = Clock::now();
      Fetch(p.port(), origin.port(), **client_tls, bytes, placeholder);
      double s = Ms(t0, Clock::now()) / 1000;
      (icpt ? mbs_i : mbs_o).push_back(static_cast<double>(bytes) / 1e6 / s);
      if (icpt)
        hs.push_back(requests / (std::accumulate(lat.end() - requests, lat.end(), 0.0) / 1000));
    }
    for (int i = 0; i < requests; ++i) {
      auto t0 = Clock::now();
      Fetch(ruled.port(), origin.port(), **client_tls, 1024, placeholder);
      lat_r.push_back(Ms(t0, Clock::now()));
    }
  }
  // HTTP/2 from the client, intercepted.
  auto h2_tls = egress::UpstreamTls::Create(both_pem, {"h2"});
  if (!h2_tls.ok()) Die("TLS context", h2_tls.status());
  std::vector<double> lat_h2, mbs_h2;
  auto h2_get = [&](h2test::H2Client& c, size_t n) {
    auto id = c.Submit("GET", "/bytes/" + std::to_string(n),
                       {{"authorization", "Bearer " + placeholder}}, std::nullopt, kHost);
    if (!id.ok()) Die("HTTP/2 request", id.status());
    auto r = c.Wait(*id);
    if (!r.ok()) Die("HTTP/2 response", r.status());
    if (r->status != 200 || r->body.size() != n) {
      Die("HTTP/2 response", Internal("status " + std::to_string(r->status) + ", " +
                                      std::to_string(r->body.size()) + " bytes"));
    }
  };
  for (int r = 0; r < rounds; ++r) {
    auto s = Tunnel(intercepted.port(), origin.port(), **h2_tls);
    if (s->alpn() != "h2") Die("ALPN", Internal("the relay chose '" + s->alpn() + "'"));
    h2test::H2Client c(*s, std::chrono::seconds(60));
    for (int i = 0; i < requests; ++i) {
      auto t0 = Clock::now();
      h2_get(c, 1024);
      lat_h2.push_back(Ms(t0, Clock::now()));
    }
    size_t bytes = static_cast<size_t>(mib) << 20;
    auto t0 = Clock::now();
    h2_get(c, bytes);
    mbs_h2.push_back(static_cast<double>(bytes) / 1e6 / (Ms(t0, Clock::now()) / 1000));
  }

  std::printf(
      "request latency (new connection, 1 KiB): opaque p50 %.2f ms p99 %.2f ms | "
      "intercepted p50 %.2f ms p99 %.2f ms | ratio p50 %.2fx\n",
      Pct(lat_o, 50), Pct(lat_o, 99), Pct(lat_i, 50), Pct(lat_i, 99),
      Pct(lat_i, 50) / Pct(lat_o, 50));
  std::printf(
      "throughput (%d MiB, one connection): opaque p50 %.0f MB/s | intercepted p50 "
      "%.0f MB/s | ratio %.2f\n",
      mib, Pct(mbs_o, 50), Pct(mbs_i, 50), Pct(mbs_i, 50) / Pct(mbs_o, 50));
  std::printf(
      "intercepted connections per second, one at a time (2 TLS handshakes each): "
      "p50 %.0f/s\n",
      Pct(hs, 50));
  std::printf(
      "with 20 HTTP rules (the allowing one last): intercepted p50 %.2f ms p99 %.2f ms | ratio "
      "to no rules p50 %.2fx\n",
      Pct(lat_r, 50), Pct(lat_r, 99), Pct(lat_r, 50) / Pct(lat_i, 50));
  std::printf(
      "HTTP/2 intercepted, one connection: request (1 KiB) p50 %.2f ms p99 %.2f ms | "
      "%d MiB on one stream p50 %.0f MB/s, ratio to HTTP/1.1 intercepted %.2f\n",
      Pct(lat_h2, 50), Pct(lat_h2, 99), mib, Pct(mbs_h2, 50), Pct(mbs_h2, 50) / Pct(mbs_i, 50));
  return 0;
}
