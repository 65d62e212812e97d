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
  std::string ToString() const;
};

Result<AllowEntry> ParseAllowEntry(std::string_view text);

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
