#include "daemon/http_api.h"

#include <unistd.h>

#include <chrono>

#include "api/connect.h"
#include "daemon/envd.h"
#include "util/fd.h"
#include "util/log.h"

namespace trybox::daemon {

int HttpStatusFor(const Status& st) {
  switch (st.code()) {
    case Code::kInvalidArgument:
      return 400;
    case Code::kNotFound:
      return 404;
    case Code::kAlreadyExists:
    case Code::kFailedPrecondition:
      return 409;
    case Code::kPermissionDenied:
      return 403;
    case Code::kResourceExhausted:
    case Code::kUnavailable:
      return 503;
    case Code::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

namespace {

// trybox's own routes (rest_api.cc), for operator keys only. Judged on the path's segments,
// as the router matches them, so that no spelling ("//trybox/v1", "/trybox//v1") reaches a
// route past this check.
bool IsOperatorRoute(const std::string& path) {
  const std::vector<std::string> segments = api::SplitPath(path);
  return !segments.empty() && segments[0] == "trybox";
}

}  // namespace

HttpApi::HttpApi(store::Store& store, VmService& vms, HttpApiSettings settings)
    : store_(store),
      vms_(vms),
      settings_(settings),
      keys_(store),
      rate_(settings.requests_per_second, settings.burst),
      builds_(settings.image_builds) {
  AddE2bRoutes();
  AddEnvdRoutes();
  AddRestRoutes();
}

HttpApi::~HttpApi() { Shutdown(); }

Status HttpApi::Init() {
  RETURN_IF_ERROR(keys_.Load());
  reaper_ = std::thread([this] { ReapLoop(); });
  return Status::Ok();
}

Result<std::string> HttpApi::Serve(const api::ListenAddress& where) {
  MutexLock lock(mu_);
  if (stopping_) return Unavailable("the daemon is stopping");
  if (server_) {
    // Port 0 asks for any port: the one in use is as good.
    if (where.host == server_->host() && (where.port == 0 || where.port == server_->port())) {
      return server_->url();
    }
    return FailedPrecondition("already serving on " + server_->url() +
                              "; stop it first (trybox serve --stop)");
  }
  ASSIGN_OR_RETURN(
      server_, api::HttpServer::Start(
                   where, settings_.limits, [this](const api::HttpRequest& r) { return Handle(r); },
                   [this](const api::HttpRequest& r) { return Admit(r); }));
  LogInfo("http", "serving on " + server_->url());
  return server_->url();
}

std::optional<std::string> HttpApi::url() {
  MutexLock lock(mu_);
  if (!server_) return std::nullopt;
  return server_->url();
}

bool HttpApi::StopServing() {
  std::unique_ptr<api::HttpServer> server;
  {
    MutexLock lock(mu_);
    server = std::move(server_);
  }
  if (!server) return false;
  const std::string url = server->url();
  streams_stop_ = true;  // open streams end: the server's stop waits for them
  server.reset();        // waits for the requests in flight, outside the lock they may need
  streams_stop_ = false;
  LogInfo("http", "stopped serving on " + url);
  return true;
}

void HttpApi::Shutdown() {
  (void)StopServing();
  builds_.Shutdown();  // while the socket still answers the builds' clean-up
  {
    MutexLock lock(mu_);
    stopping_ = true;
    reaper_cv_.SignalAll();
  }
  if (reaper_.joinable()) reaper_.join();
  std::shared_ptr<channel::Mux> verbs;
  {
    MutexLock lock(mu_);
    verbs = std::move(verbs_);
  }
  if (verbs) verbs->Shutdown();
}

void HttpApi::WakeReaper() {
  MutexLock lock(mu_);
  book_changed_ = true;
  reaper_cv_.SignalAll();
}

void HttpApi::EndSandbox(const std::string& id, const std::string& why) {
  auto report = vms_.Destroy(id);
  if (report.ok()) {
    LogInfo("http", "sandbox " + id + " destroyed: " + why);
  } else {
    LogInfo("http",
            "sandbox " + id + " (" + why + ") was already gone: " + report.status().message());
  }
}

void HttpApi::ReapLoop() {
  while (true) {
    // The deadlines are on the monotonic clock (sandbox_book.h): a step of the wall clock
    // neither ends a sandbox early nor keeps it late.
    const auto until = book_.NextEnd().value_or(SteadyClock::time_point::max());
    {
      MutexLock lock(mu_);
      while (!stopping_ && !book_changed_ && SteadyClock::now() < until) {
        (void)reaper_cv_.WaitUntil(mu_,
                                   std::min(until, SteadyClock::now() + std::chrono::hours(1)));
      }
      if (stopping_) return;
      book_changed_ = false;
    }
    for (const std::string& id : book_.TakeExpired(SteadyClock::now())) {
      EndSandbox(id, "its timeout passed");
    }
  }
}

namespace {

api::HttpResponse Unauthenticated(const std::string& message) {
  api::HttpResponse r = api::JsonError(401, "");
  r.body = Json{{"code", "unauthenticated"}, {"message", message}}.dump();
  return r;
}

bool IsInSandbox(const api::HttpRequest& req) { return !req.Header("e2b-sandbox-id").empty(); }

bool IsHealth(const api::HttpRequest& req) { return req.method == "GET" && req.path == "/health"; }

}  // namespace

std::variant<SandboxInfo, api::HttpResponse> HttpApi::SandboxCaller(const api::HttpRequest& req) {
  const std::string id = req.Header("e2b-sandbox-id");
  const std::optional<SandboxInfo> s = book_.Find(id);
  // An unknown sandbox and a wrong token get the same answer: ids cannot be probed.
  if (!s || !SameSecret(req.Header("x-access-token"), s->access_token)) {
    return Unauthenticated("unknown sandbox or wrong access token");
  }
  // The token is worth what the key that made the sandbox is: removing the key revokes it.
  if (!keys_.ById(s->owner)) {
    return Unauthenticated("the API key that created sandbox " + id +
                           " was removed, and its access token with it (the sandbox runs on "
                           "until its timeout; trybox rm " +
                           id + " ends it)");
  }
  return *s;
}

api::Admission HttpApi::Admit(const api::HttpRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  // What needs no credentials has no body worth reading, but for the sign-in form.
  api::Admission open{std::nullopt, false, 0};
  if (IsInSandbox(req)) {
    if (IsHealth(req)) return open;
    auto caller = SandboxCaller(req);
    if (auto* refused = std::get_if<api::HttpResponse>(&caller)) {
      return {Finish(req, std::move(*refused), "-", t0), false, 0};
    }
    // Uploads to a sandbox may be larger than any other request.
    const bool upload = req.method == "POST" && req.path == "/files";
    return {std::nullopt, true, upload ? kMaxFileWriteBytes : settings_.limits.max_body_bytes};
  }
  if (IsHealth(req)) return open;
  if (IsDashboardPath(req.path)) {
    // The dashboard's pages decide for themselves (HandleDashboard); a live session is proven.
    if (req.path == "/ui/login") return {std::nullopt, false, kMaxLoginBytes};
    const std::string token = api::CookieValue(req.Header("cookie"), api::kSessionCookie);
    if (token.empty() || !std::holds_alternative<api::KeyIdentity>(SessionCaller(req, token))) {
      return open;
    }
    return {std::nullopt, true, settings_.limits.max_body_bytes};
  }
  auto caller = Caller(req);
  if (auto* refused = std::get_if<api::HttpResponse>(&caller)) {
    return {Finish(req, std::move(*refused), "-", t0), false, 0};
  }
  return {std::nullopt, true, settings_.limits.max_body_bytes};
}

api::HttpResponse HttpApi::HandleInSandbox(api::HttpRequest& req, std::string* who) {
  const std::string id = req.Header("e2b-sandbox-id");
  if (IsHealth(req)) {
    // envd's health needs no token; it says whether the sandbox is there.
    return book_.Find(id) && vms_.Get(id).ok()
               ? api::HttpResponse{204, "", {}, ""}
               : api::connect::UnaryError(NotFound("sandbox " + id + " not found"));
  }
  auto caller = SandboxCaller(req);
  if (auto* refused = std::get_if<api::HttpResponse>(&caller)) return std::move(*refused);
  const SandboxInfo* s = &std::get<SandboxInfo>(caller);
  *who = s->owner;
  int retry_after = 0;
  if (!rate_.Allow(s->owner, &retry_after)) {
    api::HttpResponse r =
        api::connect::UnaryError(Status(Code::kResourceExhausted, "rate limit; retry later"));
    r.headers.emplace_back("Retry-After", std::to_string(retry_after));
    return r;
  }
  req.principal = s->owner;
  req.sandbox = id;
  return envd_router_.Dispatch(req);
}

std::variant<api::KeyIdentity, api::HttpResponse> HttpApi::Caller(const api::HttpRequest& req) {
  std::string key = req.Header("x-api-key");
  const std::string auth = req.Header("authorization");
  if (key.empty() && auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
  if (key.empty()) {
    // No key: a page of the dashboard calls with its session's cookie (docs/dashboard.md).
    const std::string token = api::CookieValue(req.Header("cookie"), api::kSessionCookie);
    if (!token.empty()) return SessionCaller(req, token);
    return api::JsonError(401, "missing API key: send it in the X-API-KEY header");
  }
  std::optional<api::KeyIdentity> id = keys_.Check(key);
  if (!id) return api::JsonError(401, "invalid API key");
  return *id;
}

api::HttpResponse HttpApi::Handle(const api::HttpRequest& in) {
  const auto t0 = std::chrono::steady_clock::now();
  api::HttpRequest req = in;
  api::HttpResponse resp;
  std::string who = "-";
  if (IsInSandbox(req)) {
    resp = HandleInSandbox(req, &who);
  } else if (IsHealth(req)) {
    resp = {200, "application/json", {}, "{\"status\":\"ok\"}"};
  } else if (IsDashboardPath(req.path)) {
    resp = HandleDashboard(req, &who);
  } else {
    auto caller = Caller(req);
    int retry_after = 0;
    if (auto* refused = std::get_if<api::HttpResponse>(&caller)) {
      resp = std::move(*refused);
    } else if (const api::KeyIdentity& id = std::get<api::KeyIdentity>(caller);
               !rate_.Allow(id.id, &retry_after)) {
      who = id.id;
      resp = api::JsonError(429, "rate limit: more than " +
                                     std::to_string(settings_.requests_per_second) +
                                     " requests a second for this key; retry later");
      resp.headers.emplace_back("Retry-After", std::to_string(retry_after));
    } else if (!id.operator_scope && IsOperatorRoute(req.path)) {
      who = id.id;
      resp = api::JsonError(403,
                            "this key reaches only its own sandboxes (scope sandboxes); trybox's "
                            "own routes need a key made with `trybox api-key create NAME "
                            "--operator`");
    } else {
      who = id.id;
      req.principal = id.id;
      resp = router_.Dispatch(req);
    }
  }
  return Finish(req, std::move(resp), who, t0);
}

api::HttpResponse HttpApi::Finish(const api::HttpRequest& req, api::HttpResponse resp,
                                  const std::string& who,
                                  std::chrono::steady_clock::time_point t0) {
  api::AddSecurityHeaders(&resp);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  char took[32];
  std::snprintf(took, sizeof(took), "%.1f", ms);
  LogInfo("http", req.method + " " + req.path + " " + std::to_string(resp.status) + " " + took +
                      " ms key=" + who + " peer=" + req.peer);
  return resp;
}

std::string RememberedListen(const std::string& state_dir) {
  auto text = ReadFileToString(state_dir + "/http-listen");
  if (!text.ok()) return "";
  std::string t = *text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return api::ParseListenAddress(t).ok() ? t : "";
}

void RememberListen(const std::string& state_dir, const std::string& listen) {
  const std::string path = state_dir + "/http-listen";
  if (listen.empty()) {
    (void)::unlink(path.c_str());
    return;
  }
  Status st = WriteFileAtomic(path, listen + "\n", 0600);
  if (!st.ok()) LogWarn("http", "could not remember the address served: " + st.message());
}

Result<std::string> ServeRemembering(HttpApi& http, const std::string& state_dir,
                                     const api::ListenAddress& where) {
  Result<std::string> url = Unavailable("not served");
  if (where.port == 0) {
    const std::string kept = RememberedListen(state_dir);
    auto old = api::ParseListenAddress(kept);
    if (!kept.empty() && old.ok() && old->host == where.host) {
      url = http.Serve(*old);
      if (!url.ok()) {
        LogInfo("http", "the port served before (" + kept + ") is not free (" +
                            url.status().message() + "); taking another");
      }
    }
  }
  if (!url.ok()) url = http.Serve(where);
  if (!url.ok()) return url;
  std::string hostport = *url;
  if (hostport.rfind("http://", 0) == 0) hostport = hostport.substr(7);
  RememberListen(state_dir, hostport);
  return url;
}

}  // namespace trybox::daemon
