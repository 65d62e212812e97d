// What the web dashboard's sign-in rests on (docs/dashboard.md): sessions kept in memory
// behind an HttpOnly cookie, a CSRF token per session, the same-origin check a cookie's
// request must pass, and the headers every answer carries. HTTP-level and free of the
// daemon, so that each rule is tested on its own (dashboard_auth_test.cc).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/http_server.h"
#include "util/mutex.h"

namespace trybox::api {

inline constexpr const char* kSessionCookie = "trybox_session";

struct DashboardSession {
  std::string key_id;  // the API key that signed in, by its public id
  std::string csrf;    // 64 hex digits: the X-CSRF-Token of this session's changes
};

// The sessions in force. A token is 256 random bits, shown once (in Set-Cookie); the book
// keeps only its SHA-256, so that a lookup's time says nothing about a token's prefix.
// Thread-safe.
class SessionBook {
 public:
  using Clock = std::chrono::steady_clock;
  explicit SessionBook(std::chrono::seconds lifetime = std::chrono::hours(12),
                       size_t max_sessions = 1024)
      : lifetime_(lifetime), max_sessions_(max_sessions) {}

  std::chrono::seconds lifetime() const { return lifetime_; }
  // A new session for `key_id`: its token (the cookie's value) and the session. Past
  // `max_sessions` the oldest one is ended.
  std::pair<std::string, DashboardSession> Open(const std::string& key_id) EXCLUDES(mu_);
  // The session of `token`, or nothing for an unknown, malformed or expired one.
  std::optional<DashboardSession> Find(const std::string& token) EXCLUDES(mu_);
  void Close(const std::string& token) EXCLUDES(mu_);
  // For tests: whether `now` is past a session's end is judged against this clock.
  void SetClockForTest(std::function<Clock::time_point()> now) EXCLUDES(mu_);

 private:
  struct Entry {
    DashboardSession session;
    Clock::time_point opened;
    Clock::time_point expires;
  };
  Clock::time_point Now() REQUIRES(mu_);

  const std::chrono::seconds lifetime_;
  const size_t max_sessions_;
  Mutex mu_;
  std::map<std::string, Entry> by_hash_ GUARDED_BY(mu_);
  std::function<Clock::time_point()> now_ GUARDED_BY(mu_);
};

// The value of cookie `name` in a Cookie header ("a=1; trybox_session=ab"), or "".
std::string CookieValue(const std::string& header, const std::string& name);

// Field `name` of an application/x-www-form-urlencoded body ('+' is a space, %XX a byte),
// or nothing when absent.
std::optional<std::string> FormValue(const std::string& body, const std::string& name);

// Whether `req` may act with a session's cookie: it names a loopback host (so a page on a
// name rebound to 127.0.0.1 is not its own origin), and neither its Origin nor its
// Sec-Fetch-Site says it came from another origin. A request without either header (curl, a
// navigation typed by hand) passes; the CSRF token still guards its changes. The refusal's
// reason otherwise.
std::optional<std::string> CrossOriginRefusal(const HttpRequest& req);

// The Set-Cookie value that hands out `token` for `lifetime`, and the one that clears it.
std::string SessionCookie(const std::string& token, std::chrono::seconds lifetime);
std::string ClearedSessionCookie();

// The headers of every answer: a Content-Security-Policy that lets in only this origin's
// scripts and styles (no inline ones), nosniff, no referrer to other origins, no framing.
void AddSecurityHeaders(HttpResponse* resp);

// `text` with &, <, >, " and ' as entities: for the little text the server itself writes
// into a page (the login form's error).
std::string HtmlEscape(const std::string& text);

}  // namespace trybox::api
