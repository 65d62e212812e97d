// The allow-list a VM's egress is checked against, and the operator's override list of
// internal addresses. Immutable once built; safe to share between threads.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trybox::egress {

inline constexpr int kDefaultPort = 443;

// "api.github.com", "api.github.com:8443", "*.example.com", "*.example.com:80".
// A wildcard matches subdomains only: "*.example.com" matches "a.example.com" and
// "a.b.example.com", never "example.com" or "evilexample.com".
struct AllowEntry {
  std::string host;  // canonical; for a wildcard the suffix without "*."
  bool wildcard = false;
  int port = kDefaultPort;

  bool MatchesHost(const std::string& canonical_host) const;
  // MatchesHost, on this entry's port or, for port 0 (a deny entry's "every port"), any.
  bool Covers(const std::string& canonical_host, int port) const;
  std::string ToString() const;
};

Result<AllowEntry> ParseAllowEntry(std::string_view text);
// A `--deny` entry: the same forms, but without a port it covers every port (port 0).
Result<AllowEntry> ParseDenyEntry(std::string_view text);

class AllowList {
 public:
  AllowList() = default;
  explicit AllowList(std::vector<AllowEntry> entries) : entries_(std::move(entries)) {}
  // Parses each "HOST[:PORT]"; the first bad entry fails the whole list, naming it.
  static Result<AllowList> Parse(const std::vector<std::string>& texts);

  // Empty if `host`:`port` is allowed, otherwise the reason it is not.
  std::string Check(const std::string& canonical_host, int port) const;
  const std::vector<AllowEntry>& entries() const { return entries_; }
  std::vector<std::string> ToStrings() const;

 private:
  std::vector<AllowEntry> entries_;
};

// How a VM's egress is decided by name (docs/protocol/egress.md, "Policy").
enum class EgressMode {
  kAllowList,  // only hosts and ports on the VM's allow-list
  kInternet,   // any host on any port; what its name resolves to is still checked
};
const char* EgressModeName(EgressMode m);  // "allowlist", "internet"

// What a VM may reach by name: the one decision every egress path asks before anything is
// resolved. In either mode a deny entry wins; the addresses a name resolves to are judged
// afterwards, by address class, the same way in both modes (proxy.cc).
struct Reach {
  EgressMode mode = EgressMode::kAllowList;
  AllowList allow;
  std::vector<AllowEntry> deny;  // port 0: every port

  // Empty if `host`:`port` may be dialled (subject to its addresses), else why not.
  std::string Check(const std::string& canonical_host, int port) const;
  // The question a name lookup asks, before any port is known: empty if `host` may be
  // dialled on at least one port, else why not.
  std::string CheckName(const std::string& canonical_host) const;
  // The deny part of Check alone: empty unless a deny entry covers `host`:`port`.
  std::string DeniedBy(const std::string& canonical_host, int port) const;
  // Why a connection this Reach let through was let through, for its audit row.
  std::string AllowedBecause() const;
  // A running VM's list grows or shrinks (`trybox allow` / `trybox deny`). Allow drops the
  // deny entries of the same host pattern that cover its port and lists it; Deny drops the
  // allow entries of the same host pattern it covers and lists it. Each returns false when
  // nothing changed.
  bool Allow(const AllowEntry& e);
  bool Deny(const AllowEntry& e);
  std::vector<std::string> DenyStrings() const;
};

// An internal address the operator lets egress reach although it is loopback, private or
// otherwise refused ("127.0.0.1:8080", "[::1]:11434"). Off unless configured; every use is
// marked in the audit record.
struct AddressOverride {
  sockaddr_storage addr{};  // address and port
  std::string text;

  static Result<AddressOverride> Parse(std::string_view text);
  bool Matches(const sockaddr_storage& a) const;
};

}  // namespace trybox::egress
