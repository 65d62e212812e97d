// HttpClient: one libcurl easy handle that POSTs JSON to a model endpoint (model.h).
//
// The handle is reused between requests, so consecutive requests to one host share a
// keep-alive connection. Proxy environment variables (http_proxy, https_proxy, all_proxy)
// are ignored on purpose: model traffic carries the API key and must never be routed
// through a proxy that a user's shell happened to export (docs/protocol/model.md).
// Thread-compatible: one Post at a time per client.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "egress/secrets.h"
#include "util/status.h"

namespace trybox::agent {

struct HttpResponse {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // names lower-cased; the last value wins
};

struct HttpPost {
  std::string url;
  std::vector<std::string> headers;  // "Name: value"; never a secret
  // The credential: sent as `credential_head` followed by the key ("x-api-key: ",
  // "authorization: Bearer "), built in the key's own kind of pages. Null: no credential.
  std::shared_ptr<const egress::SecretValue> credential;
  std::string credential_head;
  std::string body;
  std::chrono::milliseconds timeout{0};  // the whole exchange, connect included
  std::string ca_file;                   // empty: the system's CA bundle
  // Set (by any thread) to stop the exchange: HttpClient then drops the connection within
  // about a second and returns kCancelled. Null: only the timeout ends it.
  const std::atomic<bool>* cancel = nullptr;
};

// What a model client sends through: libcurl in tryboxd (HttpClient), or the connection
// to tryboxd in the unprivileged trybox-agent, where the daemon adds the credential.
class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // Any HTTP status is a response. A transport failure is kUnavailable naming it; running
  // past `timeout` is kDeadlineExceeded; stopped through `cancel`, kCancelled.
  virtual Result<HttpResponse> Post(const HttpPost& post) = 0;
};

class HttpClient : public HttpTransport {
 public:
  static Result<std::unique_ptr<HttpClient>> Make();
  ~HttpClient() override;
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // curl's own text for a transport failure (connect, TLS, reset).
  Result<HttpResponse> Post(const HttpPost& post) override;

 private:
  explicit HttpClient(void* curl) : curl_(curl) {}
  void* curl_;  // CURL*, owned
};

// The delay a 429 or 5xx response asks for: retry-after-ms (milliseconds), else Retry-After
// (delta-seconds or an HTTP-date). nullopt when neither is present or parses.
std::optional<std::chrono::milliseconds> RetryAfter(
    const std::map<std::string, std::string>& headers);

}  // namespace trybox::agent
