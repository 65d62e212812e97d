#include "egress/allowlist.h"

#include <arpa/inet.h>

#include <cstring>

#include "egress/hostname.h"

namespace trybox::egress {
namespace {

Result<int> ParsePort(std::string_view s, std::string_view whole) {
  bool digits = !s.empty() && s.size() <= 5;
  for (char c : s) digits = digits && c >= '0' && c <= '9';
  int port = digits ? std::stoi(std::string(s)) : 0;
  if (!digits || port < 1 || port > 65535) {
    return InvalidArgument("'" + std::string(whole) + "': port must be 1..65535");
  }
  return port;
}

}  // namespace

bool AllowEntry::MatchesHost(const std::string& h) const {
  if (!wildcard) return h == host;
  return h.size() > host.size() + 1 && h.compare(h.size() - host.size(), host.size(), host) == 0 &&
         h[h.size() - host.size() - 1] == '.';
}

bool AllowEntry::Covers(const std::string& h, int p) const {
  return MatchesHost(h) && (port == 0 || port == p);
}

std::string AllowEntry::ToString() const {
  return (wildcard ? "*." : "") + host + (port == 0 ? "" : ":" + std::to_string(port));
}

namespace {

// `what` names the entry's kind in errors ("allow-list entry", "deny entry").
Result<AllowEntry> ParseEntry(std::string_view text, const std::string& what) {
  AllowEntry e;
  std::string_view host = text;
  size_t colon = text.rfind(':');
  if (colon != std::string_view::npos && text.find(':') == colon) {
    ASSIGN_OR_RETURN(e.port, ParsePort(text.substr(colon + 1), text));
    host = text.substr(0, colon);
  }
  if (host.substr(0, 2) == "*.") {
    e.wildcard = true;
    host.remove_prefix(2);
  }
  auto canonical = CanonicalHostname(host);
  if (!canonical.ok()) return canonical.status().Annotate(what);
  e.host = *canonical;
  // "*.com" would cover a whole top-level domain: refused as almost certainly a mistake.
  if (e.wildcard && e.host.find('.') == std::string::npos) {
    return InvalidArgument(what + " '" + std::string(text) +
                           "': a wildcard needs at least two labels after '*.'");
  }
  return e;
}

}  // namespace

Result<AllowEntry> ParseAllowEntry(std::string_view text) {
  return ParseEntry(text, "allow-list entry");
}

Result<AllowEntry> ParseDenyEntry(std::string_view text) {
  const bool has_port = text.find(':') != std::string_view::npos;
  ASSIGN_OR_RETURN(AllowEntry e, ParseEntry(text, "deny entry"));
  if (!has_port) e.port = 0;
  return e;
}

const char* EgressModeName(EgressMode m) {
  return m == EgressMode::kInternet ? "internet" : "allowlist";
}

std::string Reach::DeniedBy(const std::string& host, int port) const {
  for (const auto& d : deny) {
    if (d.Covers(host, port)) {
      return host + ":" + std::to_string(port) + " is denied for this VM (deny " + d.ToString() +
             ")";
    }
  }
  return "";
}

std::string Reach::Check(const std::string& host, int port) const {
  if (std::string denied = DeniedBy(host, port); !denied.empty()) return denied;
  if (mode == EgressMode::kInternet) return "";
  return allow.Check(host, port);
}

std::string Reach::CheckName(const std::string& host) const {
  for (const auto& d : deny) {
    if (d.port == 0 && d.MatchesHost(host)) {
      return host + " is denied for this VM (deny " + d.ToString() + ")";
    }
  }
  if (mode == EgressMode::kInternet) return "";
  bool listed = false;
  for (const auto& e : allow.entries()) {
    if (!e.MatchesHost(host)) continue;
    if (DeniedBy(host, e.port).empty()) return "";
    listed = true;
  }
  if (listed) return host + " is denied for this VM on every port its allow-list entries name";
  return host + " is not on the VM's allow-list";
}

std::string Reach::AllowedBecause() const {
  return mode == EgressMode::kInternet ? "internet mode: any public host"
                                       : "host and port on the allow-list";
}

namespace {

bool SamePattern(const AllowEntry& a, const AllowEntry& b) {
  return a.wildcard == b.wildcard && a.host == b.host;
}

}  // namespace

bool Reach::Allow(const AllowEntry& e) {
  size_t before = deny.size();
  std::erase_if(deny, [&](const AllowEntry& d) {
    return SamePattern(d, e) && (d.port == 0 || d.port == e.port);
  });
  bool changed = deny.size() != before;
  std::vector<AllowEntry> entries = allow.entries();
  for (const auto& a : entries) {
    if (SamePattern(a, e) && a.port == e.port) return changed;
  }
  entries.push_back(e);
  allow = AllowList(std::move(entries));
  return true;
}

bool Reach::Deny(const AllowEntry& e) {
  std::vector<AllowEntry> entries = allow.entries();
  size_t before = entries.size();
  std::erase_if(entries, [&](const AllowEntry& a) {
    return SamePattern(a, e) && (e.port == 0 || a.port == e.port);
  });
  bool changed = entries.size() != before;
  allow = AllowList(std::move(entries));
  for (const auto& d : deny) {
    if (SamePattern(d, e) && d.port == e.port) return changed;
  }
  deny.push_back(e);
  return true;
}

std::vector<std::string> Reach::DenyStrings() const {
  std::vector<std::string> out;
  for (const auto& d : deny) out.push_back(d.ToString());
  return out;
}

Result<AllowList> AllowList::Parse(const std::vector<std::string>& texts) {
  std::vector<AllowEntry> entries;
  for (const auto& t : texts) {
    ASSIGN_OR_RETURN(AllowEntry e, ParseAllowEntry(t));
    entries.push_back(std::move(e));
  }
  return AllowList(std::move(entries));
}

std::string AllowList::Check(const std::string& host, int port) const {
  bool host_listed = false;
  for (const auto& e : entries_) {
    if (!e.MatchesHost(host)) continue;
    if (e.port == port) return "";
    host_listed = true;
  }
  if (host_listed) return "port " + std::to_string(port) + " is not allowed for " + host;
  return host + " is not on the VM's allow-list";
}

std::vector<std::string> AllowList::ToStrings() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.ToString());
  return out;
}

Result<AddressOverride> AddressOverride::Parse(std::string_view text) {
  AddressOverride o;
  o.text = std::string(text);
  std::string addr;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find("]:");
    if (close == std::string_view::npos) {
      return InvalidArgument("address override '" + o.text + "': expected [IPV6]:PORT");
    }
    addr = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return InvalidArgument("address override '" + o.text + "': expected IPV4:PORT");
    }
    addr = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  ASSIGN_OR_RETURN(int p, ParsePort(port, text));
  auto* v4 = reinterpret_cast<sockaddr_in*>(&o.addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&o.addr);
  if (::inet_pton(AF_INET, addr.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(p));
  } else if (::inet_pton(AF_INET6, addr.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(p));
  } else {
    return InvalidArgument("address override '" + o.text + "': not a numeric IP address");
  }
  return o;
}

bool AddressOverride::Matches(const sockaddr_storage& a) const {
  if (a.ss_family != addr.ss_family) return false;
  if (a.ss_family == AF_INET) {
    auto* x = reinterpret_cast<const sockaddr_in*>(&a);
    auto* y = reinterpret_cast<const sockaddr_in*>(&addr);
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  auto* x = reinterpret_cast<const sockaddr_in6*>(&a);
  auto* y = reinterpret_cast<const sockaddr_in6*>(&addr);
  return x->sin6_port == y->sin6_port &&
         std::memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
}

}  // namespace trybox::egress
