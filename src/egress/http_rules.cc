#include "egress/http_rules.h"

#include <cstring>

#include "egress/hostname.h"
#include "util/ascii.h"

namespace trybox::egress {
namespace {

// How much of a request's path a reason quotes.
constexpr size_t kQuotedPath = 200;

bool IsMethodChar(char c) { return (c >= 'A' && c <= 'Z') || c == '-' || c == '_'; }

// Bytes a rule's path may hold as written: RFC 3986 pchar without '%' (a rule is written
// decoded) and without ';' (see ParsePath), plus '/'.
bool IsRulePathChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return c != '\0' && std::strchr("-._~!$&'()*+,=:@/", c) != nullptr;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The path as the rules compare it: decoded, lower case, with the checks of the file
// comment; an error says why it has no single reading. `raw` begins with '/'.
Result<std::string> ComparablePath(std::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    char c = raw[i];
    if (c == '%') {
      int hi = i + 2 < raw.size() ? HexValue(raw[i + 1]) : -1;
      int lo = i + 2 < raw.size() ? HexValue(raw[i + 2]) : -1;
      if (hi < 0 || lo < 0) return InvalidArgument("a malformed percent-encoding");
      c = static_cast<char>(hi * 16 + lo);
      i += 2;
      if (c == '/' || c == '\\') return InvalidArgument("an encoded '/' or '\\'");
    } else if (c == '\\') {
      return InvalidArgument("a '\\'");
    } else if (c == ';') {
      return InvalidArgument("a ';' (some servers drop what follows it in a segment)");
    }
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return InvalidArgument("a control character");
    }
    out.push_back(AsciiLower(c));
  }
  // Segments: none empty (but a trailing '/'), none "." or "..".
  size_t start = 1;
  while (start <= out.size()) {
    size_t end = out.find('/', start);
    if (end == std::string::npos) end = out.size();
    std::string_view seg(out.data() + start, end - start);
    if (seg == "." || seg == "..") return InvalidArgument("a '.' or '..' segment");
    if (seg.empty() && end != out.size()) return InvalidArgument("an empty segment ('//')");
    start = end + 1;
  }
  return out;
}

bool PathMatches(const std::string& prefix, const std::string& path) {
  if (prefix == "/") return true;
  if (path.compare(0, prefix.size(), prefix) != 0) return false;
  return path.size() == prefix.size() || path[prefix.size()] == '/';
}

std::string Quoted(std::string_view path) {
  if (path.size() <= kQuotedPath) return std::string(path);
  return std::string(path.substr(0, kQuotedPath)) + "...";
}

}  // namespace

Result<HttpRule> ParseHttpRule(std::string_view text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    size_t start = i;
    while (i < text.size() && text[i] != ' ' && text[i] != '\t') ++i;
    if (i > start) words.emplace_back(text.substr(start, i - start));
  }
  if (words.size() != 3) {
    return InvalidArgument(
        "a HTTP rule is ACTION METHODS HOST[/PATH], e.g. "
        "'allow GET,POST api.github.com/repos/OWNER/NAME'");
  }
  HttpRule r;
  if (words[0] == "allow") {
    r.allow = true;
  } else if (words[0] != "deny") {
    return InvalidArgument("the action must be allow or deny");
  }
  if (words[1] != "*") {
    size_t from = 0;
    for (;;) {
      size_t comma = words[1].find(',', from);
      std::string m = words[1].substr(from, comma == std::string::npos ? comma : comma - from);
      if (m.empty() || m.size() > 32) {
        return InvalidArgument("methods must be * or a comma list such as GET,HEAD");
      }
      for (char c : m) {
        if (!IsMethodChar(c)) {
          return InvalidArgument("method '" + m + "' must be upper-case letters (e.g. GET)");
        }
      }
      r.methods.push_back(std::move(m));
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
  }
  const std::string& hp = words[2];
  size_t slash = hp.find('/');
  auto host = CanonicalHostname(std::string_view(hp).substr(0, slash));
  if (!host.ok()) return InvalidArgument("host: " + host.status().message());
  r.host = *host;
  std::string path = slash == std::string::npos ? "/" : hp.substr(slash);
  for (char c : path) {
    if (!IsRulePathChar(c)) {
      return InvalidArgument(std::string("the path may not hold '") + c +
                             "' (write it decoded, without a query)");
    }
  }
  auto comparable = ComparablePath(path);
  if (!comparable.ok()) return InvalidArgument("the path holds " + comparable.status().message());
  r.path = *comparable;
  if (r.path.size() > 1 && r.path.back() == '/') r.path.pop_back();
  r.text = words[0] + " " + words[1] + " " + r.host + (r.path == "/" ? "" : r.path);
  return r;
}

Result<HttpRules> HttpRules::Make(const std::vector<std::string>& texts) {
  if (texts.size() > kMaxHttpRules) {
    return InvalidArgument("more than " + std::to_string(kMaxHttpRules) + " HTTP rules");
  }
  HttpRules out;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto r = ParseHttpRule(texts[i]);
    if (!r.ok()) {
      return InvalidArgument("HTTP rule " + std::to_string(i) + ": " + r.status().message());
    }
    out.rules_.push_back(std::move(*r));
  }
  return out;
}

bool HttpRules::Covers(const std::string& host) const {
  for (const auto& r : rules_) {
    if (r.host == host) return true;
  }
  return false;
}

std::string HttpRules::Check(const std::string& host, std::string_view method,
                             std::string_view target) const {
  if (!Covers(host)) return "";
  std::string_view raw = target == "*" ? std::string_view("/") : target;
  raw = raw.substr(0, raw.find_first_of("?#"));
  const std::string what = std::string(method) + " " + Quoted(raw);
  if (raw.empty() || raw.front() != '/') {
    return "HTTP rules for " + host + " need an origin-form target, not " + what;
  }
  auto path = ComparablePath(raw);
  if (!path.ok()) {
    return "HTTP rules for " + host + " cannot decide " + what + ": its path holds " +
           path.status().message();
  }
  for (const auto& r : rules_) {
    if (r.host != host || !PathMatches(r.path, *path)) continue;
    bool method_ok = r.methods.empty();
    for (const auto& m : r.methods) method_ok = method_ok || m == method;
    if (!method_ok) continue;
    if (r.allow) return "";
    return "HTTP rule '" + r.text + "' refuses " + what;
  }
  return "no HTTP rule for " + host + " allows " + what;
}

}  // namespace trybox::egress
