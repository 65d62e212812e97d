#include "agent/http.h"

#include <curl/curl.h>
#include <string.h>  // explicit_bzero

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "util/ascii.h"

namespace trybox::agent {
namespace {

constexpr size_t kMaxReplyBytes = 32u << 20;

void GlobalInitOnce() {
  // curl_global_init is not safe to race; a function-local static runs it exactly once.
  static const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  (void)rc;
}

struct Sink {
  HttpResponse* resp;
  bool too_big = false;
};

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  size_t len = size * n;
  if (sink->resp->body.size() + len > kMaxReplyBytes) {
    sink->too_big = true;
    return 0;
  }
  sink->resp->body.append(data, len);
  return len;
}

std::string Trim(std::string s) {
  auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  s.erase(s.begin(), std::find_if_not(s.begin(), s.end(), space));
  s.erase(std::find_if_not(s.rbegin(), s.rend(), space).base(), s.end());
  return s;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  std::string line(data, size * n);
  // A new status line (after "100 Continue", say) starts a new header block.
  if (line.rfind("HTTP/", 0) == 0) {
    sink->resp->headers.clear();
    return line.size();
  }
  size_t colon = line.find(':');
  if (colon == std::string::npos) return line.size();
  std::string name = AsciiLower(line.substr(0, colon));
  sink->resp->headers[name] = Trim(line.substr(colon + 1));
  return line.size();
}

// curl_slist_append copied each line (the credential's among them) to the heap; the copies
// are overwritten before they are freed.
void WipeAndFree(curl_slist* list) {
  for (curl_slist* l = list; l != nullptr; l = l->next) {
    ::explicit_bzero(l->data, std::strlen(l->data));
  }
  curl_slist_free_all(list);
}

// curl calls this about once a second even while nothing moves (a server that never
// answers): non-zero stops the transfer and closes its connection.
int OnProgress(void* cancel, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<const std::atomic<bool>*>(cancel)->load() ? 1 : 0;
}

bool AllDigits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

}  // namespace

Result<std::unique_ptr<HttpClient>> HttpClient::Make() {
  GlobalInitOnce();
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return Internal("curl_easy_init failed");
  return std::unique_ptr<HttpClient>(new HttpClient(curl));
}

HttpClient::~HttpClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

Result<HttpResponse> HttpClient::Post(const HttpPost& post) {
  CURL* curl = static_cast<CURL*>(curl_);
  curl_easy_reset(curl);  // keeps the connection cache, drops every option
  HttpResponse resp;
  Sink sink{&resp};
  char errbuf[CURL_ERROR_SIZE] = {0};

  curl_slist* headers = nullptr;
  for (const auto& h : post.headers) headers = curl_slist_append(headers, h.c_str());
  if (post.credential != nullptr && !post.credential->empty()) {
    // The line is built in pages of its own and wiped as soon as curl has its copy (the
    // list, wiped below). Best-effort beyond that: curl copies the request head into its
    // own buffers to send it, and OpenSSL encrypts from them; both free without wiping.
    auto line = egress::SecretValue::Join(post.credential_head, post.credential->view());
    if (!line.ok()) {
      curl_slist_free_all(headers);
      return line.status();
    }
    headers = curl_slist_append(headers, line->c_str());
  }
  // Without this, curl sends "Expect: 100-continue" for large bodies and waits for the
  // server's interim answer: one more round trip on every big prompt.
  headers = curl_slist_append(headers, "Expect:");

  curl_easy_setopt(curl, CURLOPT_URL, post.url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl, CURLOPT_VERBOSE, 0L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_POST, 1L);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, post.body.data());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(post.body.size()));
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(std::max<int64_t>(1, post.timeout.count())));
  if (!post.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, post.ca_file.c_str());
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &sink);
  if (post.cancel != nullptr) {
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, const_cast<std::atomic<bool>*>(post.cancel));
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  }

  CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  // The list and the error buffer must outlive the transfer; detach them before returning.
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
  WipeAndFree(headers);

  if (sink.too_big) {
    return Unavailable("reply larger than " + std::to_string(kMaxReplyBytes >> 20) + " MiB");
  }
  if (rc != CURLE_OK) {
    std::string text = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc);
    if (rc == CURLE_OPERATION_TIMEDOUT) return DeadlineExceeded(text);
    if (rc == CURLE_ABORTED_BY_CALLBACK) return Cancelled("the model request was stopped");
    return Unavailable(text);
  }
  resp.status = static_cast<int>(status);
  return resp;
}

std::optional<std::chrono::milliseconds> RetryAfter(
    const std::map<std::string, std::string>& headers) {
  using std::chrono::milliseconds;
  if (auto it = headers.find("retry-after-ms"); it != headers.end()) {
    char* end = nullptr;
    double ms = std::strtod(it->second.c_str(), &end);
    if (end != it->second.c_str() && *end == '\0' && std::isfinite(ms) && ms >= 0) {
      return milliseconds(static_cast<int64_t>(std::min(ms, 1e12)));
    }
  }
  auto it = headers.find("retry-after");
  if (it == headers.end()) return std::nullopt;
  const std::string& v = it->second;
  if (AllDigits(v)) {
    if (v.size() > 9) return milliseconds(int64_t{999999999} * 1000);
    return milliseconds(std::stoll(v) * 1000);
  }
  time_t when = curl_getdate(v.c_str(), nullptr);
  if (when < 0) return std::nullopt;
  time_t now = std::time(nullptr);
  return milliseconds(std::max<int64_t>(0, static_cast<int64_t>(when - now)) * 1000);
}

}  // namespace trybox::agent
