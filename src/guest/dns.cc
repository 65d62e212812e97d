#include "guest/dns.h"

namespace trybox::guest {
namespace {

constexpr size_t kHeader = 12;
constexpr size_t kMaxName = 255;   // wire length, RFC 1035 2.3.4
constexpr size_t kSweepAt = 4096;  // NameDecisions entries before the expired ones go

uint16_t Get16(std::string_view p, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(p[at]) << 8) |
                               static_cast<uint8_t>(p[at + 1]));
}

void Put16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v & 0xff));
}

void Put32(std::string& out, uint32_t v) {
  Put16(out, static_cast<uint16_t>(v >> 16));
  Put16(out, static_cast<uint16_t>(v & 0xffff));
}

std::string Header(uint16_t id, bool rd, uint8_t opcode, DnsRcode rcode, uint16_t qd, uint16_t an) {
  std::string h;
  Put16(h, id);
  // QR=1, the opcode echoed, RD echoed, RA=1 (this resolver does the recursion, on the host).
  h.push_back(static_cast<char>(0x80 | ((opcode & 0xf) << 3) | (rd ? 1 : 0)));
  h.push_back(static_cast<char>(0x80 | static_cast<uint8_t>(rcode)));
  Put16(h, qd);
  Put16(h, an);
  Put16(h, 0);  // NS
  Put16(h, 0);  // AR: no EDNS answer; a client that sent OPT accepts a reply without one
  return h;
}

}  // namespace

Result<DnsQuery> ParseDnsQuery(std::string_view p, uint16_t* id_out) {
  if (p.size() < kHeader) return InvalidArgument("DNS message shorter than its header");
  DnsQuery q;
  q.id = Get16(p, 0);
  if (id_out) *id_out = q.id;
  uint8_t b2 = static_cast<uint8_t>(p[2]);
  if (b2 & 0x80) return InvalidArgument("DNS message is a response, not a query");
  q.opcode = (b2 >> 3) & 0xf;
  q.recursion_desired = b2 & 1;
  if (q.opcode != 0) return InvalidArgument("DNS opcode " + std::to_string(q.opcode));
  if (Get16(p, 4) != 1) return InvalidArgument("DNS query without exactly one question");
  size_t at = kHeader;
  std::string name;
  for (;;) {
    if (at >= p.size()) return InvalidArgument("DNS question cut short");
    uint8_t len = static_cast<uint8_t>(p[at++]);
    if (len == 0) break;
    if (len & 0xC0) return InvalidArgument("DNS question uses compression or a label type");
    if (at + len > p.size()) return InvalidArgument("DNS question cut short");
    if (at - kHeader + len + 1 > kMaxName) return InvalidArgument("DNS name over 255 bytes");
    if (!name.empty()) name.push_back('.');
    for (size_t i = 0; i < len; ++i) {
      char c = p[at + i];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      name.push_back(c);
    }
    at += len;
  }
  if (at + 4 > p.size()) return InvalidArgument("DNS question cut short");
  q.qtype = Get16(p, at);
  q.qclass = Get16(p, at + 2);
  at += 4;
  q.name = std::move(name);
  q.question = std::string(p.substr(kHeader, at - kHeader));
  return q;
}

std::string DnsAnswer(const DnsQuery& q, DnsRcode rcode, std::optional<uint32_t> ipv4,
                      uint32_t ttl) {
  std::string out = Header(q.id, q.recursion_desired, q.opcode, rcode, 1, ipv4 ? 1 : 0);
  out += q.question;
  if (ipv4) {
    Put16(out, 0xC000 | kHeader);  // the name: a pointer to the question's
    Put16(out, kDnsTypeA);
    Put16(out, kDnsClassIn);
    Put32(out, ttl);
    Put16(out, 4);
    Put32(out, *ipv4);
  }
  return out;
}

std::string DnsError(uint16_t id, DnsRcode rcode) { return Header(id, false, 0, rcode, 0, 0); }

Result<uint32_t> NamePool::AddressFor(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  // .0 and .255 of each /24 are skipped: some programs treat them as special.
  while ((next_ & 0xff) == 0 || (next_ & 0xff) == 0xff) ++next_;
  if (!Contains(next_)) {
    return ResourceExhausted("the guest's name pool (198.18.0.0/15) is used up");
  }
  uint32_t a = next_++;
  by_name_.emplace(name, a);
  by_addr_.emplace(a, name);
  return a;
}

std::optional<std::string> NamePool::NameAt(uint32_t addr) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end()) return std::nullopt;
  return it->second;
}

Result<bool> NameDecisions::Decide(const std::string& name, const Ask& ask) {
  std::promise<Result<bool>> promise;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const auto now = Clock::now();
    auto it = entries_.find(name);
    if (it != entries_.end() && it->second.expires > now) {
      std::shared_future<Result<bool>> answer = it->second.answer;
      lock.unlock();
      return answer.get();  // kept, or being asked by another question right now
    }
    // Names are many and kept briefly: the expired ones go when the map grows.
    if (entries_.size() >= kSweepAt) {
      std::erase_if(entries_, [&](const auto& e) { return e.second.expires <= now; });
    }
    entries_[name] = Entry{promise.get_future().share(), Clock::time_point::max()};
    ++asked_;
  }
  Result<bool> answer = ask(name);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      // Not reachable: an entry being asked never expires, so nothing removes it.
    } else if (!answer.ok() || !*answer) {
      entries_.erase(it);  // the questions that came meanwhile share it; the next one asks
    } else {
      it->second.expires = Clock::now() + allowed_ttl_;
    }
  }
  promise.set_value(answer);
  return answer;
}

uint64_t NameDecisions::asked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return asked_;
}

}  // namespace trybox::guest
