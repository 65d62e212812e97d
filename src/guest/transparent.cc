#include "guest/transparent.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <system_error>
#include <thread>

#include "guest/dns.h"
#include "guest/steer.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/tcp.h"

namespace trybox::guest {
namespace {

using Clock = std::chrono::steady_clock;
using Kind = channel::Stream::Message::Kind;

constexpr uint32_t kDnsTtl = 10;  // the host decides again at every connection anyway
constexpr auto kAllowedTtl = std::chrono::seconds(kDnsTtl);
constexpr auto kResolveTimeout = std::chrono::seconds(5);
constexpr int kMaxQueriesInFlight = 64;
// Dropped datagrams are reported at most this often, with their counts by destination.
constexpr auto kUdpReportEvery = std::chrono::seconds(1);
constexpr size_t kUdpDestinationsPerReport = 16;

Result<UniqueFd> BindUdp(const char* ip, uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, ip, &a.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    return ErrnoError(std::string("bind ") + ip + ":" + std::to_string(port));
  }
  return fd;
}

struct Shared {
  CurrentMux current;
  NamePool pool;
  NameDecisions decisions{kAllowedTtl};  // refusals are never kept (dns.h)
  std::atomic<int> queries{0};
};

// The host's word on `name`: true (allowed), false (refused), or an error (no session, no
// answer in time).
Result<bool> AskHost(const Shared& sh, const std::string& name, uint16_t qtype) {
  std::shared_ptr<channel::Mux> mux = sh.current();
  if (!mux) return Unavailable("no host session");
  ASSIGN_OR_RETURN(std::shared_ptr<channel::Stream> s,
                   mux->Open({{"op", "resolve"}, {"host", name}, {"type", qtype}}));
  auto deadline = Clock::now() + kResolveTimeout;
  for (;;) {
    ASSIGN_OR_RETURN(channel::Stream::Message m, s->Next(deadline));
    if (m.kind == Kind::kReset) return Unavailable("the host reset the question");
    if (m.kind != Kind::kEnd) continue;
    if (!m.body.is_object() || !m.body.value("ok", false)) {
      return Unavailable("the host could not answer: " + m.body.dump());
    }
    return m.body.value("allowed", false);
  }
}

void Answer(int fd, const sockaddr_in& to, const std::string& msg) {
  (void)!::sendto(fd, msg.data(), msg.size(), MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&to),
                  sizeof to);
}

void ServeQuestion(Shared& sh, int fd, sockaddr_in from, std::string packet) {
  uint16_t id = 0;
  auto q = ParseDnsQuery(packet, &id);
  if (!q.ok()) {
    if (packet.size() >= 12) Answer(fd, from, DnsError(id, DnsRcode::kFormErr));
    return;
  }
  if (q->qclass != kDnsClassIn || q->name.empty()) {
    return Answer(fd, from, DnsAnswer(*q, DnsRcode::kRefused));
  }
  // A name with bytes no hostname has (control bytes, non-ASCII) is refused here: it could
  // not even be carried to the host as JSON text. The host decides every other name.
  for (char c : q->name) {
    if (c <= 0x20 || c >= 0x7f) return Answer(fd, from, DnsAnswer(*q, DnsRcode::kNxDomain));
  }
  auto allowed = sh.decisions.Decide(
      q->name, [&](const std::string& name) { return AskHost(sh, name, q->qtype); });
  if (!allowed.ok()) {
    LogError("dns", q->name + ": " + allowed.status().message());
    return Answer(fd, from, DnsAnswer(*q, DnsRcode::kServFail));
  }
  if (!*allowed) return Answer(fd, from, DnsAnswer(*q, DnsRcode::kNxDomain));
  // The name exists for this guest; only A records do (the guest has no IPv6 route).
  if (q->qtype != kDnsTypeA) return Answer(fd, from, DnsAnswer(*q, DnsRcode::kNoError));
  auto addr = sh.pool.AddressFor(q->name);
  if (!addr.ok()) {
    LogError("dns", addr.status().message());
    return Answer(fd, from, DnsAnswer(*q, DnsRcode::kServFail));
  }
  Answer(fd, from, DnsAnswer(*q, DnsRcode::kNoError, *addr, kDnsTtl));
}

void ServeResolver(std::shared_ptr<Shared> sh, UniqueFd fd) {
  std::string buf(4096, '\0');
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    ssize_t n =
        ::recvfrom(fd.get(), buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &len);
    if (n < 0) {
      if (errno != EINTR) LogError("dns", ErrnoError("recvfrom").message());
      continue;
    }
    std::string packet(buf.data(), static_cast<size_t>(n));
    // Beyond the cap a question is answered at once rather than queued behind the others.
    if (sh->queries.fetch_add(1) >= kMaxQueriesInFlight ||
        !SpawnDetached([sh, fd = fd.get(), from, packet]() mutable {
          ServeQuestion(*sh, fd, from, std::move(packet));
          sh->queries.fetch_sub(1);
        })) {
      sh->queries.fetch_sub(1);
      uint16_t id = 0;
      auto q = ParseDnsQuery(packet, &id);
      if (q.ok()) Answer(fd.get(), from, DnsAnswer(*q, DnsRcode::kServFail));
    }
  }
}

void ServeTcp(std::shared_ptr<Shared> sh, TcpListener l) {
  for (;;) {
    auto c = std::make_shared<UniqueFd>(AcceptRetrying(l.fd.get()));
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (::getsockname(c->get(), reinterpret_cast<sockaddr*>(&local), &len) != 0 ||
        local.sin_family != AF_INET) {
      continue;  // closes it
    }
    uint32_t addr = ntohl(local.sin_addr.s_addr);
    std::string host = Ipv4Text(addr);
    if (NamePool::Contains(addr)) {
      auto name = sh->pool.NameAt(addr);
      // An address the resolver never gave out: sent as the literal, which the host refuses.
      if (name) host = *name;
    }
    channel::Json open = {{"op", "egress"},
                          {"target", {{"host", host}, {"port", ntohs(local.sin_port)}}}};
    std::shared_ptr<channel::Mux> mux = sh->current();
    SpawnDetached(
        [c, mux, open]() mutable { RelayConnection(std::move(*c), std::move(mux), open, true); });
  }
}

// Reads and discards every steered datagram; reports the counts by destination to the host
// at most once per kUdpReportEvery, and only when there is something to report.
void ServeUdpSink(std::shared_ptr<Shared> sh, UniqueFd fd) {
  if (Status st = AskForDestinations(fd.get()); !st.ok()) LogError("egress", st.message());
  std::map<std::string, uint64_t> counts;
  bool pending = false;  // counts wait for their report at `report_at`
  Clock::time_point report_at{};
  for (;;) {
    int timeout = -1;
    if (pending) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(report_at - Clock::now());
      timeout = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    pollfd p{fd.get(), POLLIN, 0};
    int ready = ::poll(&p, 1, timeout);
    if (ready > 0) {
      auto got = ReceiveSteered(fd.get(), MSG_DONTWAIT);
      if (!got.ok()) continue;
      const std::string& to = *got;
      if (counts.size() < kUdpDestinationsPerReport || counts.count(to)) {
        ++counts[to];
      } else {
        ++counts["other"];
      }
      if (!pending) {
        pending = true;
        report_at = Clock::now() + kUdpReportEvery;
      }
      continue;
    }
    if (!pending || Clock::now() < report_at) continue;
    pending = false;
    channel::Json dropped = channel::Json::array();
    for (const auto& [dest, n] : counts) dropped.push_back({{"to", dest}, {"datagrams", n}});
    counts.clear();
    std::shared_ptr<channel::Mux> mux = sh->current();
    if (!mux) continue;  // no session: nobody to tell
    auto s = mux->Open({{"op", "udp"}, {"dropped", std::move(dropped)}});
    if (s.ok()) (void)(*s)->Next(Clock::now() + kResolveTimeout);
  }
}

}  // namespace

Status StartTransparentEgress(CurrentMux current) {
  auto sh = std::make_shared<Shared>();
  sh->current = std::move(current);
  ASSIGN_OR_RETURN(TcpListener tcp, ListenTcpLoopback(kTransparentPort));
  ASSIGN_OR_RETURN(UniqueFd sink, BindUdp("127.0.0.1", kUdpSinkPort));
  ASSIGN_OR_RETURN(UniqueFd resolver, BindUdp(kResolverAddress, 53));
  ASSIGN_OR_RETURN(Steering steering, Steering::Install(tcp.fd.get(), sink.get()));
  // The program and its map live as long as trybox-init: nothing ever detaches them.
  (void)new Steering(std::move(steering));
  // A link (systemd-resolved's) is replaced, not followed.
  ::unlink("/etc/resolv.conf");
  RETURN_IF_ERROR(WriteFileAtomic("/etc/resolv.conf",
                                  "# trybox-init answers DNS for this machine; names reach the "
                                  "network only through trybox's egress policy\n"
                                  "nameserver 127.0.0.53\n",
                                  0644, /*durable=*/false));
  std::thread(ServeTcp, sh, std::move(tcp)).detach();
  std::thread(ServeUdpSink, sh, std::move(sink)).detach();
  std::thread(ServeResolver, sh, std::move(resolver)).detach();
  return Status::Ok();
}

}  // namespace trybox::guest
