// Egress benchmarks (issue 4). Prints figures; asserts nothing.
//
//   tunnel throughput      guest curl through trybox-init's relay and tryboxd's proxy, MB/s,
//                          beside a direct host loopback connection of the same bytes, the
//                          proxy alone on the host, and the guest channel's own ceiling
//   tunnel setup           p50/p99 of CONNECT sent -> "200 Connection established" in the guest
//   concurrent tunnels     N tunnels from one VM open at once (the upstream holds every
//                          request until all N are in), each echoing a random body; bytes lost
//   internet mode          the same burst of N small requests from a VM in allow-list mode and
//                          from one in internet mode (issue 12), alternated; the ratio
//
// Usage: egress_bench [--mib N] [--setups N] [--tunnels N]
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "egress/proxy.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/upstream.h"
#include "util/tcp.h"

using trybox::Status;
using trybox::UniqueFd;
using trybox::e2e::CliResult;
using trybox::e2e::Harness;
using trybox::e2e::HttpUpstream;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

[[noreturn]] void Die(const std::string& what, const std::string& why) {
  std::fprintf(stderr, "bench: %s: %s\n", what.c_str(), why.c_str());
  std::exit(1);
}

double Seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

// Reads an HTTP response to EOF; returns body bytes (after the head).
size_t ReadResponseBody(int fd) {
  std::string buf(1 << 20, '\0');
  size_t total = 0, head_end = std::string::npos;
  std::string head;
  for (;;) {
    auto n = trybox::ReadSome(fd, buf.data(), buf.size());
    if (!n.ok() || *n == 0) break;
    if (head_end == std::string::npos) {
      head.append(buf.data(), *n);
      head_end = head.find("\r\n\r\n");
      if (head_end != std::string::npos) total = head.size() - head_end - 4;
    } else {
      total += *n;
    }
  }
  return total;
}

// GET /bytes/N straight from the upstream over host loopback.
double DirectMBps(uint16_t port, size_t bytes) {
  auto start = Clock::now();
  UniqueFd c = trybox::ConnectTcpLoopback(port).value();
  (void)trybox::WriteFull(c.get(), "GET /bytes/" + std::to_string(bytes) + " HTTP/1.1\r\n\r\n");
  size_t got = ReadResponseBody(c.get());
  if (got != bytes) Die("direct", "short body");
  return static_cast<double>(bytes) / 1e6 / Seconds(start);
}

// The same through the egress proxy library on the host (no guest, no channel): a CONNECT
// over loopback to ServeConnection, as the daemon runs it.
double ProxyOnlyMBps(uint16_t port, size_t bytes) {
  trybox::egress::Policy policy;
  policy.reach.allow =
      trybox::egress::AllowList::Parse({"upstream.test:" + std::to_string(port)}).value();
  policy.overrides = {
      trybox::egress::AddressOverride::Parse("127.0.0.1:" + std::to_string(port)).value()};
  auto resolver = trybox::egress::MapResolver::FromJson({{"upstream.test", {"127.0.0.1"}}}).value();
  trybox::egress::TunnelSlots slots(4);
  trybox::TcpListener l = trybox::ListenTcpLoopback(0).value();
  std::thread server([&] {
    auto c = trybox::AcceptTcp(l.fd.get()).value();
    trybox::egress::FdClient client(c.get());
    trybox::egress::ServeConnection(client, {&policy, resolver.get(), &slots, nullptr, "bench"});
  });
  auto start = Clock::now();
  UniqueFd c = trybox::ConnectTcpLoopback(l.port).value();
  std::string target = "upstream.test:" + std::to_string(port);
  (void)trybox::WriteFull(c.get(), "CONNECT " + target + " HTTP/1.1\r\n\r\nGET /bytes/" +
                                       std::to_string(bytes) + " HTTP/1.1\r\n\r\n");
  // The 200 Connection established head comes first, then the upstream's response.
  std::string head;
  char ch;
  while (head.find("\r\n\r\n") == std::string::npos) {
    if (!trybox::ReadSome(c.get(), &ch, 1).ok()) break;
    head += ch;
  }
  size_t got = ReadResponseBody(c.get());
  double mbps = static_cast<double>(bytes) / 1e6 / Seconds(start);
  ::shutdown(c.get(), SHUT_WR);
  server.join();
  if (got != bytes) Die("proxy only", "short body");
  return mbps;
}

std::vector<double> Numbers(const std::string& s) {
  std::vector<double> v;
  std::istringstream in(s);
  double x;
  while (in >> x) v.push_back(x);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int mib = 64, setups = 50, tunnels = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (a == "--mib") mib = v;
    if (a == "--setups") setups = v;
    if (a == "--tunnels") tunnels = v;
  }
  const size_t bytes = static_cast<size_t>(mib) << 20;
  HttpUpstream up;
  const std::string port = std::to_string(up.port());
  const std::string base = "http://upstream.test:" + port;

  auto h = Harness::Start();
  if (!h.ok()) Die("harness", h.status().ToString());
  Status st = (*h)->StopDaemon();
  (void)trybox::MakeDirs((*h)->home() + "/config", 0700);
  Json config = {{"resolve", {{"upstream.test", {"127.0.0.1"}}}},
                 {"internal_allow", {"127.0.0.1:" + port}},
                 {"max_tunnels_per_vm", std::max(256, tunnels)}};
  (void)trybox::WriteFileAtomic((*h)->home() + "/config/egress.json", config.dump());
  st = (*h)->RestartDaemon();
  if (!st.ok()) Die("daemon", st.ToString());
  CliResult c = (*h)->Cli({"create", "--memory", "1024", "--allow", "upstream.test:" + port});
  if (c.code != 0) Die("create", c.err);
  std::string id = c.out.substr(0, c.out.find('\n'));
  auto sh = [&](const std::string& s) {
    CliResult r = (*h)->Cli({"exec", id, "--", "bash", "-c", s});
    if (r.code != 0) Die("exec " + s, r.err);
    return r.out;
  };

  std::printf("egress_bench: %d MiB transfers, %d setups, %d concurrent tunnels\n", mib, setups,
              tunnels);
  // Throughput. curl's time_pretransfer marks the tunnel as open, so the rate is the bytes'.
  auto w =
      Numbers(sh("curl -sS -p -o /dev/null -w '%{size_download} %{time_pretransfer} "
                 "%{time_total}' " +
                 base + "/bytes/" + std::to_string(bytes)));
  double down = w[0] / 1e6 / (w[2] - w[1]);
  sh("head -c " + std::to_string(bytes) + " /dev/urandom > /root/big");
  auto u =
      Numbers(sh("curl -sS -p --data-binary @/root/big -o /dev/null -w '%{size_upload} "
                 "%{time_pretransfer} %{time_total}' " +
                 base + "/sink"));
  double upload = u[0] / 1e6 / (u[2] - u[1]);
  // The channel alone: the same bytes as exec stdout over the same virtio-serial port.
  auto t0 = Clock::now();
  CliResult cat = (*h)->Cli({"exec", id, "--", "head", "-c", std::to_string(bytes), "/dev/zero"});
  double channel = static_cast<double>(cat.out.size()) / 1e6 / Seconds(t0);
  double direct = DirectMBps(up.port(), bytes);
  double proxy_only = ProxyOnlyMBps(up.port(), bytes);
  std::printf("\nthroughput (%d MiB)\n", mib);
  std::printf("  guest tunnel download            %8.1f MB/s\n", down);
  std::printf("  guest tunnel upload              %8.1f MB/s\n", upload);
  std::printf("  direct host loopback (no proxy)  %8.1f MB/s   tunnel/direct   %.3f\n", direct,
              down / direct);
  std::printf("  proxy alone on the host          %8.1f MB/s   proxy/direct    %.3f\n", proxy_only,
              proxy_only / direct);
  std::printf("  guest channel (exec stdout)      %8.1f MB/s   tunnel/channel  %.3f\n", channel,
              down / channel);

  // Setup: CONNECT sent (after the TCP connect to the relay) -> tunnel established.
  std::string loop = "for i in $(seq " + std::to_string(setups) +
                     "); do curl -sS -p -o /dev/null -w '%{time_connect} %{time_pretransfer} "
                     "%{time_total}\\n' " +
                     base + "/; done";
  auto s = Numbers(sh(loop));
  std::vector<double> setup, total;
  for (size_t i = 0; i + 2 < s.size(); i += 3) {
    setup.push_back((s[i + 1] - s[i]) * 1000);
    total.push_back(s[i + 2] * 1000);
  }
  std::printf("\ntunnel setup, n=%zu (in the guest, curl's clock)\n", setup.size());
  std::printf("  CONNECT -> established  p50 %6.1f ms  p99 %6.1f ms\n", Pct(setup, 50),
              Pct(setup, 99));
  std::printf("  whole request           p50 %6.1f ms  p99 %6.1f ms\n", Pct(total, 50),
              Pct(total, 99));

  // The transparent path (a program that ignores the proxy variables: the guest's resolver,
  // then a steered connection) against CONNECT, on the same requests, alternated so that the
  // host's load falls on both alike. The request times leave out curl's name lookup (its
  // resolver thread polls on its own clock); the resolver is timed apart, below.
  const std::string transparent = "--noproxy '*'";
  const std::string proxied = "-p";
  std::vector<double> t_req, p_req;
  for (int round = 0; round < 5; ++round) {
    for (const std::string& flags : {transparent, proxied}) {
      auto v = Numbers(
          sh("for i in $(seq " + std::to_string(std::max(1, setups / 5)) + "); do curl -sS " +
             flags + " -o /dev/null -w '%{time_namelookup} %{time_total}\\n' " + base + "/; done"));
      for (size_t i = 0; i + 1 < v.size(); i += 2) {
        (flags == transparent ? t_req : p_req).push_back((v[i + 1] - v[i]) * 1000);
      }
    }
  }
  std::vector<double> t_rate, p_rate;
  for (int round = 0; round < 5; ++round) {
    for (const std::string& flags : {transparent, proxied}) {
      auto v = Numbers(sh("curl -sS " + flags +
                          " -o /dev/null -w '%{size_download} %{time_pretransfer} "
                          "%{time_total}' " +
                          base + "/bytes/" + std::to_string(bytes)));
      (flags == transparent ? t_rate : p_rate).push_back(v[0] / 1e6 / (v[2] - v[1]));
    }
  }
  // The guest's resolver, as a program sees it: getaddrinfo (A and AAAA) in one Python
  // process, for names new to the guest (each a question to the host) and for one name
  // asked again (answered from what the guest keeps).
  const std::string lookups =
      "python3 -c 'import socket, sys, time\n"
      "socket.getaddrinfo(\"localhost\", 80)\n"  // glibc loads its NSS modules once
      "for n in sys.argv[1:]:\n"
      "    t = time.perf_counter(); socket.getaddrinfo(n, 80, 0, socket.SOCK_STREAM)\n"
      "    print((time.perf_counter() - t) * 1000)' ";
  std::string fresh_names, same_names;
  for (int i = 0; i < setups; ++i) {
    fresh_names += " n" + std::to_string(i) + ".upstream.test";
    same_names += " upstream.test";
  }
  // Distinct names need a VM that may resolve them all: a wildcard allow entry.
  CliResult cw = (*h)->Cli({"create", "--memory", "1024", "--allow", "*.upstream.test:" + port});
  if (cw.code != 0) Die("create --allow *.upstream.test", cw.err);
  const std::string wild = cw.out.substr(0, cw.out.find('\n'));
  CliResult fr = (*h)->Cli({"exec", wild, "--", "bash", "-c", lookups + fresh_names});
  if (fr.code != 0) Die("lookups", fr.err);
  std::vector<double> dns_fresh = Numbers(fr.out);
  std::vector<double> dns_same = Numbers(sh(lookups + same_names));
  (void)(*h)->Cli({"rm", wild});
  std::printf("\ntransparent path vs CONNECT, n=%zu requests each (alternated)\n", t_req.size());
  std::printf("  request without name lookup, transparent  p50 %6.1f ms  p99 %6.1f ms\n",
              Pct(t_req, 50), Pct(t_req, 99));
  std::printf(
      "  request without name lookup, CONNECT      p50 %6.1f ms  p99 %6.1f ms   "
      "transparent/CONNECT %.3f\n",
      Pct(p_req, 50), Pct(p_req, 99), Pct(t_req, 50) / Pct(p_req, 50));
  std::printf(
      "  download (%d MiB, median of 5) transparent %6.1f MB/s  CONNECT %6.1f MB/s  "
      "transparent/CONNECT %.3f\n",
      mib, Pct(t_rate, 50), Pct(p_rate, 50), Pct(t_rate, 50) / Pct(p_rate, 50));
  std::printf("  guest resolver, getaddrinfo of a new name (n=%zu)   p50 %6.1f ms  p99 %6.1f ms\n",
              dns_fresh.size(), Pct(dns_fresh, 50), Pct(dns_fresh, 99));
  std::printf("  guest resolver, the same name again (n=%zu)        p50 %6.1f ms  p99 %6.1f ms\n",
              dns_same.size(), Pct(dns_same, 50), Pct(dns_same, 99));

  // Concurrency: every echo is held until all N are in flight at once.
  up.SetEchoBarrier(tunnels, std::chrono::seconds(120));
  sh("head -c 65536 /dev/urandom > /root/t && mkdir -p /root/o && rm -f /root/o/*");
  auto start = Clock::now();
  // --parallel-immediate: open every connection at once instead of waiting to multiplex.
  sh("curl -sS -Z --parallel-immediate --parallel-max " + std::to_string(tunnels) +
     " -p --data-binary @/root/t -o '/root/o/#1' '" + base + "/echo?i=[1-" +
     std::to_string(tunnels) + "]'");
  double secs = Seconds(start);
  std::string want = sh("sha256sum < /root/t").substr(0, 64);
  std::string got =
      sh("cd /root/o && ls | wc -l && sha256sum * | awk '{print $1}' | sort | "
         "uniq -c");
  int files = std::atoi(got.c_str());
  int matching = 0;
  std::istringstream in(got.substr(got.find('\n') + 1));
  int n;
  std::string sha;
  while (in >> n >> sha) {
    if (sha == want) matching = n;
  }
  std::printf("\n%d concurrent tunnels from one VM, 64 KiB each way\n", tunnels);
  std::printf("  most open at once at the upstream  %d\n", up.max_concurrent_echo());
  std::printf("  bodies back %d, byte-exact %d, lost or corrupt %d, in %.1f s\n", files, matching,
              tunnels - matching, secs);
  // Internet mode against the allow-list on the same burst: N small requests at once, each
  // decided by the proxy; the VMs alternate so the host's load falls on both alike.
  CliResult ci = (*h)->Cli({"create", "--memory", "1024", "--internet"});
  if (ci.code != 0) Die("create --internet", ci.err);
  std::string inet = ci.out.substr(0, ci.out.find('\n'));
  const std::string burst = "curl -sS -Z --parallel-immediate --parallel-max " +
                            std::to_string(tunnels) + " -p -o /dev/null '" + base + "/?i=[1-" +
                            std::to_string(tunnels) + "]' -w '%{http_code}\\n' | grep -c 200";
  std::vector<double> list_s, inet_s;
  for (int round = 0; round < 5; ++round) {
    for (const std::string& vm : {id, inet}) {
      auto t = Clock::now();
      CliResult r = (*h)->Cli({"exec", vm, "--", "bash", "-c", burst});
      double secs = Seconds(t);
      if (r.code != 0 || std::atoi(r.out.c_str()) != tunnels) {
        Die("burst in " + vm,
            "expected " + std::to_string(tunnels) + " answers, got " + r.out + r.err);
      }
      (vm == id ? list_s : inet_s).push_back(secs * 1000);
    }
  }
  std::printf("\n%d-connection burst, allow-list vs internet mode (5 rounds each, alternated)\n",
              tunnels);
  std::printf("  allow-list  p50 %7.1f ms  p99 %7.1f ms\n", Pct(list_s, 50), Pct(list_s, 99));
  std::printf("  internet    p50 %7.1f ms  p99 %7.1f ms   internet/allow-list %.3f\n",
              Pct(inet_s, 50), Pct(inet_s, 99), Pct(inet_s, 50) / Pct(list_s, 50));
  (void)(*h)->Cli({"rm", id, inet});
  return 0;
}
