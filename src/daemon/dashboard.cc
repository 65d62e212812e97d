// The web dashboard's own requests (docs/dashboard.md): the pages and their files, signing in
// and out, and the session a page's calls to /trybox/v1 carry. The routes the pages read
// are trybox's REST routes (rest_api.cc); this file decides only who may call them.
#include <cstdlib>

#include "api/dashboard_auth.h"
#include "daemon/http_api.h"
#include "daemon/ui_assets.h"
#include "util/fd.h"
#include "util/log.h"

namespace trybox::daemon {

namespace {

std::optional<std::string> ContentTypeOf(const std::string& name) {
  auto ends = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  return std::nullopt;
}

// A served name: segments of [A-Za-z0-9_.-] that do not start with a dot, so that nothing
// outside the directory (and nothing hidden in it) can be named.
bool IsServedName(const std::string& name) {
  if (name.empty()) return false;
  size_t seg_start = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '/') {
      if (i == seg_start || name[seg_start] == '.') return false;
      seg_start = i + 1;
      continue;
    }
    const char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-' || c == '.')) {
      return false;
    }
  }
  return true;
}

// The page the login form is, with `error` (the server's own words) in its alert.
api::HttpResponse LoginPage(int status, const std::string& error) {
  std::optional<UiFile> page = FindUiFile("login.html");
  if (!page) {
    return {status, "text/plain; charset=utf-8", {}, "this tryboxd was built without its pages"};
  }
  std::string body = page->body;
  const std::string slot = "{{error}}";
  if (const size_t at = body.find(slot); at != std::string::npos) {
    body.replace(at, slot.size(), api::HtmlEscape(error));
  }
  api::HttpResponse r{status, page->content_type, {}, std::move(body)};
  r.headers.emplace_back("Cache-Control", "no-store");
  return r;
}

}  // namespace

std::optional<UiFile> FindUiFile(const std::string& name) {
  if (!IsServedName(name)) return std::nullopt;
  std::optional<std::string> type = ContentTypeOf(name);
  if (!type) return std::nullopt;
  if (const char* dir = std::getenv("TRYBOX_UI_DIR"); dir && *dir) {
    auto body = ReadFileToString(std::string(dir) + "/" + name);
    if (!body.ok()) return std::nullopt;
    return UiFile{*type, std::move(*body)};
  }
  for (const UiAsset& a : EmbeddedUiAssets()) {
    if (name == a.name) {
      return UiFile{*type, std::string(reinterpret_cast<const char*>(a.data), a.size)};
    }
  }
  return std::nullopt;
}

bool HttpApi::IsDashboardPath(const std::string& path) {
  return path == "/" || path.rfind("/ui/", 0) == 0;
}

std::variant<api::KeyIdentity, api::HttpResponse> HttpApi::SessionCaller(
    const api::HttpRequest& req, const std::string& token, api::DashboardSession* found) {
  const std::optional<api::DashboardSession> session = sessions_.Find(token);
  if (!session) return api::JsonError(401, "the dashboard session ended: sign in again at /");
  if (auto refusal = api::CrossOriginRefusal(req)) return api::JsonError(403, *refusal);
  std::optional<api::KeyIdentity> key = keys_.ById(session->key_id);
  if (!key) {
    // The key was removed (trybox api-key rm): its sessions end with it.
    sessions_.Close(token);
    return api::JsonError(401, "the key this session signed in with was removed: sign in again");
  }
  if (req.method != "GET" && req.method != "HEAD" &&
      !SameSecret(req.Header("x-csrf-token"), session->csrf)) {
    return api::JsonError(403,
                          "a change made with the dashboard's session needs its X-CSRF-Token "
                          "(GET /ui/session)");
  }
  if (found) *found = *session;
  return *key;
}

api::HttpResponse HttpApi::HandleDashboard(const api::HttpRequest& req, std::string* who) {
  const std::string token = api::CookieValue(req.Header("cookie"), api::kSessionCookie);

  if (req.path == "/") {
    if (req.method != "GET" && req.method != "HEAD") {
      return api::JsonError(405, "the dashboard's page is read with GET");
    }
    if (token.empty()) return LoginPage(401, "");
    auto caller = SessionCaller(req, token);
    if (auto* refused = std::get_if<api::HttpResponse>(&caller)) {
      return LoginPage(refused->status, "");
    }
    *who = std::get<api::KeyIdentity>(caller).id;
    std::optional<UiFile> page = FindUiFile("index.html");
    if (!page) return api::JsonError(500, "this tryboxd was built without its pages");
    api::HttpResponse r{200, page->content_type, {}, std::move(page->body)};
    r.headers.emplace_back("Cache-Control", "no-store");
    return r;
  }

  if (req.path == "/ui/login") {
    if (req.method != "POST") return api::JsonError(405, "sign in with POST");
    if (auto refusal = api::CrossOriginRefusal(req)) return LoginPage(403, *refusal);
    int retry_after = 0;
    if (!rate_.Allow("dashboard login", &retry_after)) {
      api::HttpResponse r = LoginPage(429, "too many attempts to sign in; wait a moment");
      r.headers.emplace_back("Retry-After", std::to_string(retry_after));
      return r;
    }
    const std::string key = api::FormValue(req.body, "key").value_or("");
    std::optional<api::KeyIdentity> id = key.empty() ? std::nullopt : keys_.Check(key);
    if (!id) return LoginPage(401, "that is not an API key of this daemon");
    *who = id->id;
    if (!id->operator_scope) {
      return LoginPage(403,
                       "this key reaches only its own sandboxes; the dashboard needs a key made "
                       "with `trybox api-key create NAME --operator`");
    }
    auto [session_token, session] = sessions_.Open(id->id);
    api::HttpResponse r{303, "text/plain; charset=utf-8", {}, "signed in\n"};
    r.headers.emplace_back("Location", "/");
    r.headers.emplace_back("Set-Cookie", api::SessionCookie(session_token, sessions_.lifetime()));
    r.headers.emplace_back("Cache-Control", "no-store");
    LogInfo("http", "dashboard: key " + id->id + " signed in");
    return r;
  }

  if (req.path == "/ui/session" || req.path == "/ui/logout") {
    if (token.empty()) return api::JsonError(401, "no dashboard session: sign in at /");
    api::DashboardSession session;
    auto caller = SessionCaller(req, token, &session);
    if (auto* refused = std::get_if<api::HttpResponse>(&caller)) return std::move(*refused);
    const api::KeyIdentity& key = std::get<api::KeyIdentity>(caller);
    *who = key.id;
    if (req.path == "/ui/session") {
      if (req.method != "GET") return api::JsonError(405, "read the session with GET");
      return api::JsonReply(
          200, Json{{"csrf", session.csrf}, {"key", {{"id", key.id}, {"name", key.name}}}}.dump());
    }
    if (req.method != "POST") return api::JsonError(405, "sign out with POST");
    sessions_.Close(token);
    api::HttpResponse r = api::JsonReply(200, "{}");
    r.headers.emplace_back("Set-Cookie", api::ClearedSessionCookie());
    LogInfo("http", "dashboard: key " + key.id + " signed out");
    return r;
  }

  // The pages' scripts and styles: no data in them, so no session is needed.
  // A page is served at / alone, where its session is checked.
  const std::string name = req.path.substr(4);
  if (req.method != "GET") return api::JsonError(405, "the dashboard's files are read with GET");
  const bool page = ContentTypeOf(name).value_or("").rfind("text/html", 0) == 0;
  std::optional<UiFile> file = page ? std::nullopt : FindUiFile(name);
  if (!file) return api::JsonError(404, "no such file of the dashboard: " + name);
  api::HttpResponse r{200, file->content_type, {}, std::move(file->body)};
  r.headers.emplace_back("Cache-Control", "no-cache");
  return r;
}

}  // namespace trybox::daemon
