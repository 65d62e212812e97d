// HttpApi: tryboxd's HTTP server as a service (docs/protocol/http.md). Off until `serve`
// (the verb behind `trybox serve`) starts it on a loopback address. Every request is
// checked against the API keys (api/api_keys.h) and a per-key rate limit, routed, and
// logged (method, path, status, time, key id; never the key). The handlers call the daemon's
// services as the socket's verbs do: the E2B-compatible control plane (e2b_control.cc,
// docs/protocol/e2b.md) creates and destroys VMs through VmService; the in-sandbox API
// (envd_process.cc) runs commands as execs. A sandbox past its timeout is destroyed by this
// service's reaper thread.
//
// Thread-safe. Lock order: mu_ before nothing else (the book and key ring have their own).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include "api/api_keys.h"
#include "api/dashboard_auth.h"
#include "api/http_server.h"
#include "api/router.h"
#include "channel/mux.h"
#include "daemon/image_builds.h"
#include "daemon/sandbox_book.h"
#include "daemon/vm_service.h"
#include "store/store.h"
#include "util/mutex.h"

namespace trybox::daemon {

struct HttpApiSettings {
  api::HttpLimits limits;
  double requests_per_second = 20;  // per key, on average
  double burst = 40;                // per key, at once
  int64_t max_sandbox_timeout_s = 24 * 3600;
  ImageBuildSettings image_builds;  // recipe builds started over HTTP (image_builds.h)
};

// The sign-in form's body (docs/dashboard.md): a key, form-encoded. The one body the server
// reads from a caller it does not know yet.
inline constexpr size_t kMaxLoginBytes = 4096;

// The envd version the in-sandbox API answers as (docs/protocol/e2b.md, "Versions").
inline constexpr const char* kEnvdVersion = "0.5.2";

class HttpApi {
 public:
  HttpApi(store::Store& store, VmService& vms, HttpApiSettings settings = {});
  ~HttpApi();
  HttpApi(const HttpApi&) = delete;
  HttpApi& operator=(const HttpApi&) = delete;

  // Loads the keys; starts the reaper.
  Status Init();
  api::KeyRing& keys() { return keys_; }

  // Starts the server on `where` and returns its URL. Asking again for the address in use
  // is a no-op; another address while serving is FAILED_PRECONDITION.
  Result<std::string> Serve(const api::ListenAddress& where) EXCLUDES(mu_);
  // The URL served, if any.
  std::optional<std::string> url() EXCLUDES(mu_);
  // Stops the server (requests in flight finish); sandboxes stay until their timeout.
  // Whether it was serving.
  bool StopServing() EXCLUDES(mu_);
  // Stops the server and the reaper; the daemon then destroys every VM itself.
  void Shutdown() EXCLUDES(mu_);

  // The daemon's verbs, for trybox's own REST routes (rest_api.cc): a connection from
  // inside the daemon (ControlServer::Attach). Set once, before serving.
  void SetVerbConnection(UniqueFd fd) EXCLUDES(mu_);

  // What HttpServer calls with a request's head, before its body is read: the refusal of a
  // caller without the credentials its route needs (logged), or the body's limit and
  // whether the caller was proven (api::Admission).
  api::Admission Admit(const api::HttpRequest& req);
  // What HttpServer calls with a whole request: authentication (again: a key may have been
  // removed since its head), the rate limit, routing and the log line.
  api::HttpResponse Handle(const api::HttpRequest& req);

 private:
  void AddE2bRoutes();   // e2b_control.cc
  void AddEnvdRoutes();  // envd_process.cc
  void AddRestRoutes();  // rest_api.cc
  // Who calls: the key in X-API-KEY or Authorization, else the dashboard session of the
  // cookie; the answer to send instead when neither lets the request in.
  std::variant<api::KeyIdentity, api::HttpResponse> Caller(const api::HttpRequest& req);
  // The dashboard (dashboard.cc, docs/dashboard.md): its pages and files, sign-in and out.
  static bool IsDashboardPath(const std::string& path);
  api::HttpResponse HandleDashboard(const api::HttpRequest& req, std::string* who);
  // The session of cookie `token`, checked: live, same origin, its key not removed, and the
  // CSRF token for a change. Its key (and the session into `found`), or the refusal.
  std::variant<api::KeyIdentity, api::HttpResponse> SessionCaller(
      const api::HttpRequest& req, const std::string& token,
      api::DashboardSession* found = nullptr);
  // A verb over the in-daemon connection: its END as a JSON reply (without "ok"), or its
  // error as an HTTP error (HttpStatusFor).
  // `data`: where channel 1's bytes go (a transcript), at most 64 MiB.
  api::HttpResponse CallVerb(const Json& request, std::string* data = nullptr);
  // A streaming verb: its EVENTs as server-sent events, then `end` or `error`. With `log`,
  // the verb is `logs`, its bytes relayed as `output` events.
  api::HttpResponse StreamVerb(const Json& request, bool log = false);
  Result<std::shared_ptr<channel::Stream>> OpenVerb(const Json& request) EXCLUDES(mu_);
  // The sandbox an in-sandbox request (it names one in E2b-Sandbox-Id) may act in: its
  // access token right, and the key that created it not removed. Else the 401 to send.
  std::variant<SandboxInfo, api::HttpResponse> SandboxCaller(const api::HttpRequest& req);
  // An in-sandbox request: its caller checked, then routed to envd's services.
  api::HttpResponse HandleInSandbox(api::HttpRequest& req, std::string* who);
  // `resp` with the security headers, and its line in the log.
  static api::HttpResponse Finish(const api::HttpRequest& req, api::HttpResponse resp,
                                  const std::string& who, std::chrono::steady_clock::time_point t0);
  Result<store::ExecRecord> SandboxExec(const std::string& sandbox, int64_t pid);
  // The same, and still running; NOT_FOUND if it ended.
  Result<store::ExecRecord> RunningSandboxExec(const std::string& sandbox, int64_t pid);
  void ReapLoop() EXCLUDES(mu_);
  // Ends a sandbox: its VM destroyed, its entry gone. Logs what it saw.
  void EndSandbox(const std::string& id, const std::string& why);
  void WakeReaper() EXCLUDES(mu_);

  store::Store& store_;
  VmService& vms_;
  const HttpApiSettings settings_;
  api::KeyRing keys_;
  api::RateLimiter rate_;
  api::SessionBook sessions_;
  api::Router router_;       // the control plane (X-API-KEY)
  api::Router envd_router_;  // the in-sandbox API (X-Access-Token)
  SandboxBook book_;
  ImageBuilds builds_;

  // Set while the server stops: open process streams end within a second (envd_process.cc).
  std::atomic<bool> streams_stop_{false};
  Mutex mu_;
  CondVar reaper_cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool book_changed_ GUARDED_BY(mu_) = false;
  std::unique_ptr<api::HttpServer> server_ GUARDED_BY(mu_);
  std::shared_ptr<channel::Mux> verbs_ GUARDED_BY(mu_);
  std::thread reaper_;
};

// Compares two secrets in time independent of where they differ.
bool SameSecret(const std::string& a, const std::string& b);

// The HTTP status for a service error: 400, 404, 409, 503, 504 or 500.
int HttpStatusFor(const Status& st);

// The address `trybox serve` last served on, kept in $state/http-listen so that the HTTP API
// comes back on the same port after a daemon restart (docs/protocol/http.md). "" when none
// is kept; `listen` "" forgets it.
std::string RememberedListen(const std::string& state_dir);
void RememberListen(const std::string& state_dir, const std::string& listen);
// Serves on `where`, but a request for any port (0) on the host last served takes that
// port again when it is free. Remembers the address served.
Result<std::string> ServeRemembering(HttpApi& http, const std::string& state_dir,
                                     const api::ListenAddress& where);

}  // namespace trybox::daemon
