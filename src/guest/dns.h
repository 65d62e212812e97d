// The guest's resolver (docs/protocol/egress.md, "Transparent egress"): the DNS messages
// trybox-init answers on 127.0.0.53, and the pool of addresses it hands out for names.
//
// Only what a stub resolver (glibc, musl, Node's c-ares, Go) sends is understood: a
// standard query (opcode 0) with one question and no compression in it. Anything else
// gets FORMERR (or REFUSED), never silence, so a client fails at once instead of timing out.
// The answers are never the real addresses: an allowed name gets an address from
// 198.18.0.0/15 that maps back to the name, so the host dials (and audits) by name.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trybox::guest {

inline constexpr uint16_t kDnsTypeA = 1;
inline constexpr uint16_t kDnsTypeAAAA = 28;
inline constexpr uint16_t kDnsClassIn = 1;

enum class DnsRcode : uint8_t {
  kNoError = 0,
  kFormErr = 1,
  kServFail = 2,
  kNxDomain = 3,
  kNotImp = 4,
  kRefused = 5,
};

struct DnsQuery {
  uint16_t id = 0;
  bool recursion_desired = false;
  uint8_t opcode = 0;
  std::string name;  // lower case, no trailing dot; "" for the root
  uint16_t qtype = 0;
  uint16_t qclass = 0;
  std::string question;  // the question section as sent, echoed in the answer
};

// kInvalidArgument for a message that is not a query this resolver can answer; `id` (when
// the header was complete) is filled in anyway so that the caller can answer FORMERR.
Result<DnsQuery> ParseDnsQuery(std::string_view packet, uint16_t* id = nullptr);

// An answer to `q`: `rcode`, and when `ipv4` is set one A record (host byte order) with
// `ttl`. NOERROR without an address is "no data of that type" (an AAAA for an allowed name).
std::string DnsAnswer(const DnsQuery& q, DnsRcode rcode, std::optional<uint32_t> ipv4 = {},
                      uint32_t ttl = 0);
// A header-only error answer for a message that could not be parsed.
std::string DnsError(uint16_t id, DnsRcode rcode);

// Names to addresses in 198.18.0.0/15 and back, for the life of the guest. An address is
// never reused for another name. Thread-safe.
class NamePool {
 public:
  static constexpr uint32_t kBase = 0xC6120000;  // 198.18.0.0
  static constexpr uint32_t kMask = 0xFFFE0000;  // /15

  static bool Contains(uint32_t addr) { return (addr & kMask) == kBase; }
  // The name's address, given out now if it has none yet. kResourceExhausted when the
  // pool is used up (131,070 names).
  Result<uint32_t> AddressFor(const std::string& name);
  // The name behind a pool address, if one was given out.
  std::optional<std::string> NameAt(uint32_t addr) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint32_t> by_name_;
  std::map<uint32_t, std::string> by_addr_;
  uint32_t next_ = kBase + 1;
};

// The host's answers about names, shared by concurrent questions: a lookup's A and AAAA
// questions (sent together) cost one round trip to the host. Allowed answers are kept
// `allowed_ttl` (the host decides again at every connection anyway, so a `trybox deny` is
// not late); refusals and errors are kept only while being asked, never after: the lookup
// after a `trybox allow` asks the host again and finds the name (issue 41.12: a refusal kept
// one second made an agent's retry right after its approval fail). Thread-safe.
class NameDecisions {
 public:
  using Clock = std::chrono::steady_clock;
  // Asks the host: true (allowed), false (refused), or why it could not be asked.
  using Ask = std::function<Result<bool>(const std::string& name)>;

  explicit NameDecisions(Clock::duration allowed_ttl) : allowed_ttl_(allowed_ttl) {}
  Result<bool> Decide(const std::string& name, const Ask& ask);
  // How many times `ask` ran (for tests and the benchmark).
  uint64_t asked() const;

 private:
  struct Entry {
    std::shared_future<Result<bool>> answer;
    Clock::time_point expires = Clock::time_point::max();  // max: still being asked
  };
  const Clock::duration allowed_ttl_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
  uint64_t asked_ = 0;
};

}  // namespace trybox::guest
