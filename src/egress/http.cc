#include "egress/http.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "util/ascii.h"

namespace trybox::egress {
namespace {

bool IsTchar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

Result<int> Port(std::string_view s) {
  bool ok = !s.empty() && s.size() <= 5 &&
            std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  int p = ok ? std::stoi(std::string(s)) : 0;
  if (p < 1 || p > 65535) return InvalidArgument("bad port '" + std::string(s.substr(0, 16)) + "'");
  return p;
}

// "host:port", "[v6]:port", "host". Splits at the last ':' outside brackets.
Result<std::pair<std::string, std::optional<int>>> SplitAuthority(std::string_view a) {
  std::string_view host = a;
  std::optional<int> port;
  size_t colon = a.rfind(':');
  size_t bracket = a.rfind(']');
  if (colon != std::string_view::npos && (bracket == std::string_view::npos || colon > bracket)) {
    ASSIGN_OR_RETURN(port, Port(a.substr(colon + 1)));
    host = a.substr(0, colon);
  }
  if (host.empty()) return InvalidArgument("empty host");
  return std::make_pair(std::string(host), port);
}

const char* StatusText(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 403:
      return "Forbidden";
    case 408:
      return "Request Timeout";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
  }
  return "Error";
}

// The reason travels in a header, so it is kept to printable ASCII on one line.
std::string HeaderSafe(std::string s) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return s;
}

}  // namespace

std::string RefusalResponse(int status, const std::string& reason) {
  std::string safe = HeaderSafe(reason);
  std::string body = "trybox egress: " + safe + "\n";
  return "HTTP/1.1 " + std::to_string(status) + " " + StatusText(status) +
         "\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\nX-Trybox-Reason: " + safe + "\r\n\r\n" + body;
}

bool IsHttpToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), IsTchar);
}

bool IsHttpCtl(char c) {
  auto u = static_cast<unsigned char>(c);
  return (u < 0x20 && c != '\t') || u == 0x7f;
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Result<std::optional<HeadLines>> SplitHead(std::string_view buf, size_t max_head,
                                           const char* what) {
  size_t end = buf.find("\r\n\r\n");
  if (end == std::string_view::npos ? buf.size() >= max_head : end + 4 > max_head) {
    return ResourceExhausted(std::string(what) + " head larger than " + std::to_string(max_head) +
                             " bytes");
  }
  if (end == std::string_view::npos) return std::optional<HeadLines>();
  HeadLines h;
  h.size = end + 4;
  std::string_view head = buf.substr(0, end + 2);  // every line ends in CRLF
  bool first = true;
  while (!head.empty()) {
    size_t crlf = head.find("\r\n");
    std::string_view l = head.substr(0, crlf);
    head.remove_prefix(crlf + 2);
    if (l.find_first_of("\r\n") != std::string_view::npos) {
      return InvalidArgument(std::string("bare CR or LF in the ") + what + " head");
    }
    if (first) {
      h.start = l;
      first = false;
      continue;
    }
    if (!l.empty() && (l.front() == ' ' || l.front() == '\t')) {
      return InvalidArgument("obsolete header line folding");
    }
    size_t colon = l.find(':');
    if (colon == std::string_view::npos || !IsHttpToken(l.substr(0, colon))) {
      return InvalidArgument("malformed header line");
    }
    std::string_view value = TrimOws(l.substr(colon + 1));
    if (std::any_of(value.begin(), value.end(), IsHttpCtl)) {
      return InvalidArgument("control byte in a header value");
    }
    h.headers.emplace_back(std::string(l.substr(0, colon)), std::string(value));
  }
  return std::optional<HeadLines>(std::move(h));
}

Result<std::optional<RequestHead>> ParseRequestHead(std::string_view buf, size_t max_head) {
  ASSIGN_OR_RETURN(auto lines, SplitHead(buf, max_head, "request"));
  if (!lines) return std::optional<RequestHead>();
  RequestHead h;
  h.size = lines->size;
  h.headers = std::move(lines->headers);
  std::string_view rl = lines->start;
  size_t sp1 = rl.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : rl.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || rl.find(' ', sp2 + 1) != std::string_view::npos) {
    return InvalidArgument("request line is not 'METHOD TARGET VERSION'");
  }
  h.method = std::string(rl.substr(0, sp1));
  h.target = std::string(rl.substr(sp1 + 1, sp2 - sp1 - 1));
  h.version = std::string(rl.substr(sp2 + 1));
  if (!IsHttpToken(h.method)) return InvalidArgument("method is not a token");
  if (h.target.empty()) return InvalidArgument("empty request target");
  for (char c : h.target) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      return InvalidArgument("control or non-ASCII byte in the request target");
    }
  }
  if (h.version != "HTTP/1.1" && h.version != "HTTP/1.0") {
    return InvalidArgument("unsupported HTTP version");
  }
  return std::optional<RequestHead>(std::move(h));
}

Result<ProxyTarget> ParseProxyTarget(const RequestHead& h) {
  ProxyTarget t;
  if (h.method == "CONNECT") {
    t.tunnel = true;
    auto a = SplitAuthority(h.target);
    if (!a.ok()) return a.status().Annotate("CONNECT target");
    if (!a->second) return InvalidArgument("CONNECT target needs an explicit port");
    t.host = a->first;
    t.port = *a->second;
    return t;
  }
  std::string lower = AsciiLower(h.target.substr(0, std::min<size_t>(h.target.size(), 8)));
  if (lower.rfind("https://", 0) == 0) {
    return InvalidArgument("https:// requests must use CONNECT");
  }
  if (lower.rfind("http://", 0) != 0) {
    return InvalidArgument("not a proxy request (expected CONNECT or an absolute http:// URL)");
  }
  std::string_view rest = std::string_view(h.target).substr(7);
  size_t end = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, end);
  auto a = SplitAuthority(authority);
  if (!a.ok()) return a.status().Annotate("URL authority");
  t.host = a->first;
  t.port = a->second.value_or(80);
  t.path = end == std::string_view::npos ? "/" : std::string(rest.substr(end));
  if (t.path.front() != '/') t.path = "/" + t.path;
  size_t hash = t.path.find('#');
  if (hash != std::string::npos) t.path.resize(hash);
  return t;
}

Result<std::string> OriginRequest(const RequestHead& h, const ProxyTarget& t) {
  std::set<std::string> drop = {"host", "connection", "keep-alive", "proxy-connection",
                                "te",   "trailer",    "upgrade"};
  for (const auto& [name, value] : h.headers) {
    if (AsciiLower(name) != "connection") continue;
    std::string_view rest = value;
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string token = AsciiLower(TrimOws(rest.substr(0, comma)));
      rest.remove_prefix(comma == std::string_view::npos ? rest.size() : comma + 1);
      if (token.empty()) continue;
      if (token == "host" || token == "content-length" || token == "transfer-encoding") {
        return InvalidArgument("the Connection header names " + token +
                               ", which the upstream needs to read the request");
      }
      drop.insert(token);
    }
  }
  std::string out = h.method + " " + t.path + " " + h.version + "\r\n";
  out += "Host: " + t.host + (t.port == 80 ? "" : ":" + std::to_string(t.port)) + "\r\n";
  for (const auto& [name, value] : h.headers) {
    std::string n = AsciiLower(name);
    if (drop.count(n) || n.rfind("proxy-", 0) == 0) continue;
    out += name + ": " + value + "\r\n";
  }
  out += "Connection: close\r\n\r\n";
  return out;
}

}  // namespace trybox::egress
