#include "api/dashboard_auth.h"

#include <microhttpd.h>

#include "util/names.h"
#include "util/sha256.h"

namespace trybox::api {

namespace {

// A token as Open makes it: 64 lowercase hex digits.
bool LooksLikeToken(const std::string& token) {
  if (token.size() != 64) return false;
  for (char c : token) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// A Host header's name part: "127.0.0.1:3000" -> "127.0.0.1", "[::1]:3000" -> "[::1]".
std::string HostName(const std::string& host) {
  if (!host.empty() && host[0] == '[') {
    const size_t close = host.find(']');
    return close == std::string::npos ? host : host.substr(0, close + 1);
  }
  const size_t colon = host.rfind(':');
  return colon == std::string::npos ? host : host.substr(0, colon);
}

bool IsLoopbackName(const std::string& name) {
  if (name == "localhost" || name == "[::1]") return true;
  // 127.0.0.0/8, as the listener takes it (http_server.cc's ParseListenAddress).
  if (name.rfind("127.", 0) != 0) return false;
  int dots = 0;
  for (char c : name) {
    if (c == '.') {
      ++dots;
    } else if (c < '0' || c > '9') {
      return false;
    }
  }
  return dots == 3;
}

}  // namespace

std::pair<std::string, DashboardSession> SessionBook::Open(const std::string& key_id) {
  std::string token = RandomHex(32);
  DashboardSession s{key_id, RandomHex(32)};
  MutexLock lock(mu_);
  const Clock::time_point now = Now();
  // Expired sessions go first; past the cap, the oldest.
  for (auto it = by_hash_.begin(); it != by_hash_.end();) {
    it = it->second.expires <= now ? by_hash_.erase(it) : std::next(it);
  }
  while (by_hash_.size() >= max_sessions_) {
    auto oldest = by_hash_.begin();
    for (auto it = by_hash_.begin(); it != by_hash_.end(); ++it) {
      if (it->second.opened < oldest->second.opened) oldest = it;
    }
    by_hash_.erase(oldest);
  }
  by_hash_[Sha256Hex(token)] = Entry{s, now, now + lifetime_};
  return {std::move(token), std::move(s)};
}

std::optional<DashboardSession> SessionBook::Find(const std::string& token) {
  if (!LooksLikeToken(token)) return std::nullopt;
  const std::string hash = Sha256Hex(token);
  MutexLock lock(mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  if (it->second.expires <= Now()) {
    by_hash_.erase(it);
    return std::nullopt;
  }
  return it->second.session;
}

void SessionBook::Close(const std::string& token) {
  if (!LooksLikeToken(token)) return;
  const std::string hash = Sha256Hex(token);
  MutexLock lock(mu_);
  by_hash_.erase(hash);
}

void SessionBook::SetClockForTest(std::function<Clock::time_point()> now) {
  MutexLock lock(mu_);
  now_ = std::move(now);
}

SessionBook::Clock::time_point SessionBook::Now() { return now_ ? now_() : Clock::now(); }

std::string CookieValue(const std::string& header, const std::string& name) {
  size_t pos = 0;
  while (pos < header.size()) {
    size_t end = header.find(';', pos);
    if (end == std::string::npos) end = header.size();
    size_t b = pos;
    while (b < end && (header[b] == ' ' || header[b] == '\t')) ++b;
    const size_t eq = header.find('=', b);
    if (eq != std::string::npos && eq < end && header.compare(b, eq - b, name) == 0 &&
        eq - b == name.size()) {
      std::string value = header.substr(eq + 1, end - eq - 1);
      while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.pop_back();
      return value;
    }
    pos = end + 1;
  }
  return "";
}

std::optional<std::string> FormValue(const std::string& body, const std::string& name) {
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t end = body.find('&', pos);
    if (end == std::string::npos) end = body.size();
    const std::string pair = body.substr(pos, end - pos);
    const size_t eq = pair.find('=');
    std::string key = pair.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : pair.substr(eq + 1);
    for (std::string* s : {&key, &value}) {
      for (char& c : *s) {
        if (c == '+') c = ' ';
      }
      // libmicrohttpd's decoder: %XX to the byte, in place; the result is shorter or equal.
      s->resize(MHD_http_unescape(s->data()));
    }
    if (key == name) return value;
    pos = end + 1;
  }
  return std::nullopt;
}

std::optional<std::string> CrossOriginRefusal(const HttpRequest& req) {
  const std::string host = req.Header("host");
  if (!IsLoopbackName(HostName(host))) {
    return "the dashboard answers only on a loopback name; this request names host '" + host + "'";
  }
  const std::string site = req.Header("sec-fetch-site");
  if (!site.empty() && site != "same-origin" && site != "none") {
    return "a request from another origin (Sec-Fetch-Site: " + site + ") may not use the session";
  }
  const std::string origin = req.Header("origin");
  if (!origin.empty() && origin != "http://" + host) {
    return "a request from another origin (" + origin + ") may not use the session";
  }
  return std::nullopt;
}

std::string SessionCookie(const std::string& token, std::chrono::seconds lifetime) {
  return std::string(kSessionCookie) + "=" + token +
         "; Path=/; HttpOnly; SameSite=Strict; Max-Age=" + std::to_string(lifetime.count());
}

std::string ClearedSessionCookie() {
  return std::string(kSessionCookie) + "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0";
}

void AddSecurityHeaders(HttpResponse* resp) {
  resp->headers.emplace_back(
      "Content-Security-Policy",
      "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
      "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'");
  resp->headers.emplace_back("X-Content-Type-Options", "nosniff");
  // same-origin, not no-referrer: under no-referrer Chromium sends `Origin: null` with a
  // form's POST, which the same-origin check must refuse.
  resp->headers.emplace_back("Referrer-Policy", "same-origin");
  resp->headers.emplace_back("X-Frame-Options", "DENY");
}

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace trybox::api
