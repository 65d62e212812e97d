// The cost of taking secret values out of responses (issue 41.2, egress/scrub.h). Prints
// figures; asserts nothing.
//
//   scan        Scrubber over --mib MiB in memory, three kinds of text (random bytes, JSON-like
//               text, base64), with 1 and with 8 secrets: MB/s
//   relay       RelayHttp between two socketpairs (no TLS, no VM: the relay's own share), a
//               GET answered with --mib MiB of JSON-like text, Content-Length and chunked, and
//               gzip (decoded by the relay, so only when scrubbing): MB/s with the host bound
//               to the secret (scrubbed) and, in alternating rounds in the same process, to
//               none (the baseline: the relay passes bodies as before, nothing to scrub)
//
// Usage: scrub_bench [--mib N] [--rounds N]
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "egress/intercept.h"
#include "egress/scrub.h"
#include "egress/secrets.h"
#include "util/fd.h"
#include "util/utf8.h"

using namespace trybox;
using trybox::bench::Clock;
using trybox::bench::Die;
using trybox::bench::Ms;
using trybox::bench::Pct;

namespace {

constexpr char kHost[] = "api.test";

// CPU seconds of `clock`: the figures are taken from CPU time as well as from the wall clock,
// since a loaded machine (other builds, VMs) stretches the wall clock alone.
double Cpu(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

std::shared_ptr<const egress::SecretSet> Secrets(int n, const std::string& host) {
  std::vector<egress::SecretInput> in;
  for (int i = 0; i < n; ++i) {
    egress::SecretInput s;
    s.name = "TOKEN" + std::to_string(i);
    s.value = "sk-live-" + std::to_string(i) + "-0f3c9a7e51d24b6b8a1e2d3c4b5a69";
    s.hosts = {host};
    in.push_back(std::move(s));
  }
  auto set = egress::SecretSet::Make(std::move(in));
  if (!set.ok()) Die("secrets", set.status());
  return *set;
}

std::string Text(const std::string& kind, size_t n) {
  std::mt19937_64 rng(42);
  std::string out;
  out.reserve(n + 64);
  if (kind == "random") {
    while (out.size() < n) {
      uint64_t v = rng();
      out.append(reinterpret_cast<const char*>(&v), 8);
    }
  } else if (kind == "json") {
    static const char* words[] = {"\"id\": ",
                                  "12345",
                                  ", \"name\": \"",
                                  "repo-name",
                                  "\", ",
                                  "\"url\": ",
                                  "\"https:\\/\\/api.test\\/x\"",
                                  "%2F",
                                  "&amp;",
                                  "\\u00e9",
                                  "\n"};
    while (out.size() < n) out += words[rng() % 11];
  } else {
    std::string raw;
    while (raw.size() < n * 3 / 4 + 3) {
      uint64_t v = rng();
      raw.append(reinterpret_cast<const char*>(&v), 8);
    }
    out = Base64Encode(raw);
  }
  out.resize(n);
  return out;
}

egress::Scrubber For(const egress::SecretSet& set) {
  std::vector<const egress::Secret*> s;
  for (const auto& x : set.secrets()) s.push_back(&x);
  return egress::Scrubber(std::move(s));
}

std::string Gzip(const std::string& text) {
  z_stream z{};
  ::deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(::deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  ::deflate(&z, Z_FINISH);
  out.resize(out.size() - z.avail_out);
  ::deflateEnd(&z);
  return out;
}

// One GET through RelayHttp answered with `response`; the guest reads until the end of the
// connection. Milliseconds from the request to the last byte the guest read.
double RelayOnce(const egress::SecretSet& secrets, const std::string& response, size_t* received,
                 double* cpu_ms) {
  const double c0 = Cpu(CLOCK_PROCESS_CPUTIME_ID);
  int g[2], u[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, g) != 0 ||
      ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, u) != 0) {
    Die("socketpair", ErrnoError("socketpair"));
  }
  UniqueFd guest(g[0]), relay_guest(g[1]), upstream(u[0]), relay_upstream(u[1]);
  egress::FdStream gs(g[1]), us(u[1]);
  std::thread relay([&] { egress::RelayHttp(gs, us, secrets, kHost); });
  std::thread origin([&] {
    std::string head;
    char buf[4096];
    while (head.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::read(upstream.get(), buf, sizeof buf);
      if (n <= 0) return;
      head.append(buf, static_cast<size_t>(n));
    }
    (void)WriteFull(upstream.get(), response);
    ::shutdown(upstream.get(), SHUT_WR);
  });
  auto t0 = Clock::now();
  (void)WriteFull(guest.get(), "GET /x HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n");
  std::vector<char> buf(1 << 20);
  size_t total = 0;
  for (;;) {
    ssize_t n = ::read(guest.get(), buf.data(), buf.size());
    if (n <= 0) break;
    total += static_cast<size_t>(n);
  }
  auto t1 = Clock::now();
  ::shutdown(guest.get(), SHUT_RDWR);
  origin.join();
  relay.join();
  *received = total;
  *cpu_ms = (Cpu(CLOCK_PROCESS_CPUTIME_ID) - c0) * 1e3;
  return Ms(t0, t1);
}

}  // namespace

int main(int argc, char** argv) {
  int mib = 32, rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (a == "--mib") mib = v;
    if (a == "--rounds") rounds = v;
  }
  ::signal(SIGPIPE, SIG_IGN);
  const size_t bytes = static_cast<size_t>(mib) << 20;

  std::printf("scan (Scrubber in memory, %d MiB, best of %d)\n", mib, rounds);
  for (int n : {1, 8}) {
    auto set = Secrets(n, kHost);
    egress::Scrubber s = For(*set);
    for (const std::string kind : {"random", "json", "base64"}) {
      std::string text = Text(kind, bytes);
      double best = 1e18, best_cpu = 1e18;
      for (int r = 0; r < rounds; ++r) {
        std::string out;
        out.reserve(text.size());
        egress::ScrubStream st(s, true);
        double c0 = Cpu(CLOCK_THREAD_CPUTIME_ID);
        auto t0 = Clock::now();
        for (size_t at = 0; at < text.size(); at += 256 << 10) {
          st.Feed(std::string_view(text).substr(at, 256 << 10), &out);
        }
        st.Finish(&out);
        best = std::min(best, Ms(t0, Clock::now()));
        best_cpu = std::min(best_cpu, (Cpu(CLOCK_THREAD_CPUTIME_ID) - c0) * 1e3);
        if (out.size() != text.size()) Die("scan", Internal("length changed"));
      }
      std::printf("  %d secret(s), %-7s %8.1f MB/s wall  %8.1f MB/s of CPU\n", n, kind.c_str(),
                  bytes / 1e3 / best, bytes / 1e3 / best_cpu);
    }
  }

  std::printf("relay (RelayHttp over socketpairs, %d MiB of JSON-like text, median of %d)\n", mib,
              rounds);
  auto bound = Secrets(1, kHost);
  auto elsewhere = Secrets(1, "elsewhere.test");
  const std::string body = Text("json", bytes);
  std::string chunked;
  for (size_t at = 0; at < body.size(); at += 64 << 10) {
    size_t n = std::min<size_t>(64 << 10, body.size() - at);
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", n);
    chunked += size + body.substr(at, n) + "\r\n";
  }
  chunked += "0\r\n\r\n";
  const std::string gz = Gzip(body);
  struct Case {
    const char* name;
    std::string response;
  };
  std::vector<Case> cases = {
      {"content-length",
       "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body},
      {"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked},
      {"gzip", "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: " +
                   std::to_string(gz.size()) + "\r\n\r\n" + gz},
  };
  for (const Case& c : cases) {
    std::vector<double> scrubbed, baseline, scrubbed_cpu, baseline_cpu;
    size_t got_s = 0, got_b = 0;
    for (int r = 0; r < rounds; ++r) {
      double cpu = 0;
      baseline.push_back(RelayOnce(*elsewhere, c.response, &got_b, &cpu));
      baseline_cpu.push_back(cpu);
      scrubbed.push_back(RelayOnce(*bound, c.response, &got_s, &cpu));
      scrubbed_cpu.push_back(cpu);
    }
    double s = Pct(scrubbed, 50), b = Pct(baseline, 50);
    double sc = Pct(scrubbed_cpu, 50), bc = Pct(baseline_cpu, 50);
    // Payload MB/s: the decoded body for gzip (what the guest gets when scrubbed).
    std::printf(
        "  %-15s scrubbed %8.1f MB/s   baseline %8.1f MB/s   ratio %.2f   (%zu / %zu bytes);"
        " CPU: scrubbed %8.1f MB/s   baseline %8.1f MB/s\n",
        c.name, bytes / 1e3 / s, bytes / 1e3 / b, s / b, got_s, got_b,
        sc > 0 ? bytes / 1e3 / sc : 0.0, bc > 0 ? bytes / 1e3 / bc : 0.0);
  }
  return 0;
}
