#include "tests/fake_model/fake_model.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>

#include "egress/http.h"

namespace trybox::testing {
namespace {

constexpr size_t kMaxHead = 64 * 1024;
constexpr size_t kMaxBody = 64u << 20;

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string OpenSslError(const std::string& what) {
  unsigned long e = ERR_get_error();
  char buf[256] = "unknown error";
  if (e != 0) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return what + ": " + buf;
}

const char* Reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 529:
      return "Overloaded";
  }
  return "Status";
}

// One accepted connection, plain or TLS.
class Conn {
 public:
  Conn(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  ~Conn() {
    if (ssl_ != nullptr) SSL_free(ssl_);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Bytes read; 0 on EOF or any error (the connection is done either way).
  size_t Read(char* buf, size_t len) {
    if (ssl_ == nullptr) {
      auto n = ReadSome(fd_, buf, len);
      return n.ok() ? *n : 0;
    }
    int n = SSL_read(ssl_, buf, static_cast<int>(len));
    return n > 0 ? static_cast<size_t>(n) : 0;
  }

  bool Write(const std::string& s) {
    if (ssl_ == nullptr) return WriteFull(fd_, s).ok();
    size_t done = 0;
    while (done < s.size()) {
      int n = SSL_write(ssl_, s.data() + done, static_cast<int>(s.size() - done));
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  // Ends our side after a "Connection: close" answer.
  void CloseWrite() {
    if (ssl_ != nullptr) SSL_shutdown(ssl_);
    ::shutdown(fd_, SHUT_WR);
  }

 private:
  int fd_;
  SSL* ssl_;
};

struct Response {
  int status = 200;
  std::string body;
  std::vector<std::string> headers;  // "Name: value"
};

std::string AnthropicErrorType(int status) {
  switch (status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 529:
      return "overloaded_error";
  }
  return "api_error";
}

Response ErrorReply(bool anthropic, int status, const Json& error) {
  std::string message = "fake error";
  if (error.is_object() && error.contains("message")) message = error["message"];
  Response r;
  r.status = status;
  if (anthropic) {
    std::string type = AnthropicErrorType(status);
    if (error.is_object() && error.contains("type")) type = error["type"];
    r.body = Json{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}}.dump();
  } else {
    Json e = {{"message", message}, {"type", "fake_error"}, {"param", nullptr}, {"code", nullptr}};
    if (error.is_object() && error.contains("type")) e["type"] = error["type"];
    if (error.is_object() && error.contains("code")) e["code"] = error["code"];
    r.body = Json{{"error", e}}.dump();
  }
  return r;
}

}  // namespace

class FakeModelServer::Impl {
 public:
  ~Impl() {
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
  }

  // A P-256 key and a self-signed certificate for 127.0.0.1 (SAN IP), written as PEM to a
  // fresh temporary directory for the client to trust.
  Status InitTls() {
    ASSIGN_OR_RETURN(TempDir dir, TempDir::Make("/tmp", "tbx-fake-model-"));
    dir_.emplace(std::move(dir));
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
    if (!key) return Internal(OpenSslError("EVP_EC_gen"));
    std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
    if (!cert) return Internal(OpenSslError("X509_new"));
    X509_set_version(cert.get(), 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), static_cast<long>(std::time(nullptr)));
    X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert.get()), 7 * 24 * 3600);
    X509_set_pubkey(cert.get(), key.get());
    X509_NAME* name = X509_get_subject_name(cert.get());
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
    X509_set_issuer_name(cert.get(), name);
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, cert.get(), cert.get(), nullptr, nullptr, 0);
    const std::pair<int, const char*> exts[] = {
        {NID_basic_constraints, "critical,CA:TRUE"},
        {NID_key_usage, "critical,digitalSignature,keyCertSign"},
        {NID_subject_alt_name, "IP:127.0.0.1"},
        {NID_subject_key_identifier, "hash"},
    };
    for (const auto& [nid, value] : exts) {
      X509_EXTENSION* ext = X509V3_EXT_nconf_nid(nullptr, &v3, nid, value);
      if (ext == nullptr) return Internal(OpenSslError(std::string("extension ") + value));
      X509_add_ext(cert.get(), ext, -1);
      X509_EXTENSION_free(ext);
    }
    if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) {
      return Internal(OpenSslError("X509_sign"));
    }
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
    PEM_write_bio_X509(bio.get(), cert.get());
    char* data = nullptr;
    long len = BIO_get_mem_data(bio.get(), &data);
    ca_file_ = dir_->path() + "/ca.pem";
    RETURN_IF_ERROR(WriteFileAtomic(ca_file_, std::string(data, static_cast<size_t>(len))));

    ctx_ = SSL_CTX_new(TLS_server_method());
    if (ctx_ == nullptr) return Internal(OpenSslError("SSL_CTX_new"));
    if (SSL_CTX_use_certificate(ctx_, cert.get()) != 1 ||
        SSL_CTX_use_PrivateKey(ctx_, key.get()) != 1) {
      return Internal(OpenSslError("SSL_CTX_use_certificate"));
    }
    return Status::Ok();
  }

  SSL_CTX* ctx() const { return ctx_; }
  const std::string& ca_file() const { return ca_file_; }

 private:
  std::optional<TempDir> dir_;
  std::string ca_file_;
  SSL_CTX* ctx_ = nullptr;
};

FakeModelServer::FakeModelServer(Options options)
    : options_(options), impl_(std::make_unique<Impl>()) {}

Result<std::unique_ptr<FakeModelServer>> FakeModelServer::Start(Options options) {
  // A client that hangs up mid-answer must not kill the test process; tryboxd ignores
  // SIGPIPE the same way.
  ::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<FakeModelServer> s(new FakeModelServer(options));
  ASSIGN_OR_RETURN(s->listener_, ListenTcpLoopback(options.port));
  if (options.tls) {
    RETURN_IF_ERROR(s->impl_->InitTls());
    s->ca_file_ = s->impl_->ca_file();
  }
  s->accept_thread_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  return s;
}

FakeModelServer::~FakeModelServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  ::shutdown(listener_.fd.get(), SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
    threads.swap(conn_threads_);
  }
  for (auto& t : threads) t.join();
}

std::string FakeModelServer::anthropic_base_url() const {
  return std::string(options_.tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(port());
}

std::string FakeModelServer::openai_base_url() const { return anthropic_base_url() + "/v1"; }

void FakeModelServer::Push(Json step) {
  std::lock_guard<std::mutex> lock(mu_);
  script_.push_back(std::move(step));
}

size_t FakeModelServer::steps_left() const {
  std::lock_guard<std::mutex> lock(mu_);
  return script_.size();
}

std::vector<FakeModelServer::Recorded> FakeModelServer::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

size_t FakeModelServer::connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connections_;
}

size_t FakeModelServer::hangs_ended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hangs_ended_;
}

bool FakeModelServer::WaitForRequests(size_t n, std::chrono::milliseconds limit) const {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_cv_.wait_for(lock, limit, [&] { return requests_.size() >= n; });
}

bool FakeModelServer::WaitForHangsEnded(size_t n, std::chrono::milliseconds limit) const {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_cv_.wait_for(lock, limit, [&] { return hangs_ended_ >= n; });
}

std::optional<Json> FakeModelServer::Pop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (script_.empty()) return std::nullopt;
  Json step = std::move(script_.front());
  script_.pop_front();
  return step;
}

void FakeModelServer::Record(Recorded r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(std::move(r));
  }
  changed_cv_.notify_all();
}

void FakeModelServer::Hang(int fd) {
  // Readable at the client's close (EOF), or when the destructor shuts the socket down.
  struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
  while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    ++hangs_ended_;
  }
  changed_cv_.notify_all();
}

void FakeModelServer::Delay(int64_t ms) {
  std::unique_lock<std::mutex> lock(mu_);
  stop_cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopping_; });
}

void FakeModelServer::AcceptLoop() {
  for (;;) {
    auto c = AcceptTcp(listener_.fd.get());
    if (!c.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    ++connections_;
    open_fds_.push_back(c->get());
    conn_threads_.emplace_back(
        [this, fd = std::move(*c)]() mutable { ServeConnection(std::move(fd)); });
  }
}

namespace {

// What one scripted step answers to one request.
Response Answer(bool anthropic, const Json& request, size_t request_bytes, const Json& step,
                int id) {
  if (step.contains("status") && step["status"].get<int>() != 200) {
    Response r =
        ErrorReply(anthropic, step["status"].get<int>(), step.value("error", Json::object()));
    return r;
  }
  if (step.contains("raw_body")) {
    Response r;
    r.body = step["raw_body"].get<std::string>();
    return r;
  }
  std::string text = step.value("text", "");
  Json calls = step.value("tool_calls", Json::array());
  int64_t input_tokens = step.value("input_tokens", static_cast<int64_t>(request_bytes / 4));
  int64_t output_tokens = static_cast<int64_t>(text.size() / 4) + 1;
  std::string model = request.is_object() ? request.value("model", "fake") : "fake";
  Json body;
  if (anthropic) {
    Json content = Json::array();
    if (!text.empty()) content.push_back({{"type", "text"}, {"text", text}});
    for (size_t i = 0; i < calls.size(); ++i) {
      content.push_back({{"type", "tool_use"},
                         {"id", "toolu_fake_" + std::to_string(id) + "_" + std::to_string(i)},
                         {"name", calls[i].value("name", "")},
                         {"input", calls[i].value("input", Json::object())}});
    }
    body = {{"id", "msg_fake_" + std::to_string(id)},
            {"type", "message"},
            {"role", "assistant"},
            {"model", model},
            {"content", content},
            {"stop_reason", step.value("stop", calls.empty() ? "end_turn" : "tool_use")},
            {"stop_sequence", nullptr},
            {"usage",
             {{"input_tokens", input_tokens},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", 0},
              {"output_tokens", output_tokens}}}};
  } else {
    Json message = {{"role", "assistant"},
                    {"content", text.empty() && !calls.empty() ? Json(nullptr) : Json(text)}};
    if (!calls.empty()) {
      Json tc = Json::array();
      for (size_t i = 0; i < calls.size(); ++i) {
        std::string args = calls[i].contains("raw_arguments")
                               ? calls[i]["raw_arguments"].get<std::string>()
                               : calls[i].value("input", Json::object()).dump();
        tc.push_back({{"id", "call_fake_" + std::to_string(id) + "_" + std::to_string(i)},
                      {"type", "function"},
                      {"function", {{"name", calls[i].value("name", "")}, {"arguments", args}}}});
      }
      message["tool_calls"] = std::move(tc);
    }
    body = {{"id", "chatcmpl-fake-" + std::to_string(id)},
            {"object", "chat.completion"},
            {"created", static_cast<int64_t>(std::time(nullptr))},
            {"model", model},
            {"choices",
             {{{"index", 0},
               {"message", message},
               {"finish_reason", step.value("stop", calls.empty() ? "stop" : "tool_calls")}}}},
            {"usage",
             {{"prompt_tokens", input_tokens},
              {"completion_tokens", output_tokens},
              {"total_tokens", input_tokens + output_tokens}}}};
  }
  if (step.value("omit_usage", false)) body.erase("usage");
  Response r;
  r.body = body.dump();
  return r;
}

}  // namespace

void FakeModelServer::ServeConnection(UniqueFd fd) {
  SSL* ssl = nullptr;
  if (options_.tls) {
    ssl = SSL_new(impl_->ctx());
    SSL_set_fd(ssl, fd.get());
  }
  {
    Conn conn(fd.get(), ssl);
    bool handshake_ok = ssl == nullptr || SSL_accept(ssl) == 1;
    std::string buf;
    char chunk[65536];
    while (handshake_ok) {
      // The head.
      std::optional<egress::RequestHead> head;
      for (;;) {
        auto parsed = egress::ParseRequestHead(buf, kMaxHead);
        if (!parsed.ok()) {
          conn.Write("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
          conn.CloseWrite();
          break;
        }
        if (parsed->has_value()) {
          head = std::move(**parsed);
          break;
        }
        size_t n = conn.Read(chunk, sizeof chunk);
        if (n == 0) break;
        buf.append(chunk, n);
      }
      if (!head) break;
      buf.erase(0, head->size);
      Recorded rec;
      rec.method = head->method;
      rec.path = head->target;
      for (const auto& [name, value] : head->headers) rec.headers[Lower(name)] = value;
      auto header = [&rec](const char* name) {
        auto it = rec.headers.find(name);
        return it == rec.headers.end() ? std::string() : it->second;
      };

      // The body: Content-Length only; libcurl sends nothing else for a sized POST.
      if (!header("transfer-encoding").empty()) {
        conn.Write(
            "HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        conn.CloseWrite();
        break;
      }
      size_t len = std::strtoull(header("content-length").c_str(), nullptr, 10);
      if (len > kMaxBody) {
        conn.Write(
            "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        conn.CloseWrite();
        break;
      }
      if (Lower(header("expect")) == "100-continue" && buf.size() < len) {
        conn.Write("HTTP/1.1 100 Continue\r\n\r\n");
      }
      bool eof = false;
      while (buf.size() < len) {
        size_t n = conn.Read(chunk, sizeof chunk);
        if (n == 0) {
          eof = true;
          break;
        }
        buf.append(chunk, n);
      }
      if (eof) break;
      std::string body = buf.substr(0, len);
      buf.erase(0, len);
      rec.body = Json::parse(body, nullptr, false);
      if (rec.body.is_discarded()) rec.body = nullptr;
      rec.body_bytes = len;
      std::string connection = Lower(header("connection"));
      bool close =
          connection.find("close") != std::string::npos ||
          (head->version == "HTTP/1.0" && connection.find("keep-alive") == std::string::npos);

      bool anthropic = rec.path == "/v1/messages";
      bool openai = rec.path == "/v1/chat/completions";
      std::string key = anthropic ? header("x-api-key") : header("authorization");
      Json request = rec.body;
      Record(std::move(rec));

      std::unique_lock<std::mutex> turn;
      if (options_.one_at_a_time) turn = std::unique_lock<std::mutex>(turn_mu_);
      Response resp;
      int id;
      {
        std::lock_guard<std::mutex> lock(mu_);
        id = ++next_id_;
      }
      if (head->method != "POST" || (!anthropic && !openai)) {
        resp.status = 404;
        resp.body =
            Json{{"error",
                  {{"message", "fake model: no route " + head->method + " " + head->target}}}}
                .dump();
      } else if (auto step = Pop(); !step) {
        resp = ErrorReply(anthropic, 500, {{"message", "fake model: script exhausted"}});
      } else if (!step->is_object()) {
        resp = ErrorReply(anthropic, 500, {{"message", "fake model: a step is not an object"}});
      } else if (step->value("hang", false)) {
        Hang(fd.get());
        break;  // the client has gone (or the server stops): nothing is answered
      } else {
        if (step->contains("delay_ms")) Delay((*step)["delay_ms"].get<int64_t>());
        std::string want = step->value("expect_key", "");
        if (!want.empty() && key != (anthropic ? want : "Bearer " + want)) {
          resp =
              ErrorReply(anthropic, 401,
                         {{"type", "authentication_error"},
                          {"code", "invalid_api_key"},
                          {"message", "fake model: the request did not carry the expected key"}});
        } else {
          resp = Answer(anthropic, request, len, *step, id);
        }
        if (step->contains("retry_after")) {
          resp.headers.push_back("Retry-After: " + (*step)["retry_after"].get<std::string>());
        }
        if (step->contains("retry_after_ms")) {
          resp.headers.push_back("retry-after-ms: " + (*step)["retry_after_ms"].get<std::string>());
        }
      }
      std::string out = "HTTP/1.1 " + std::to_string(resp.status) + " " + Reason(resp.status) +
                        "\r\nContent-Type: application/json\r\nContent-Length: " +
                        std::to_string(resp.body.size()) + "\r\n";
      for (const auto& h : resp.headers) out += h + "\r\n";
      if (close) out += "Connection: close\r\n";
      out += "\r\n" + resp.body;
      if (!conn.Write(out)) break;
      if (close) {
        conn.CloseWrite();
        break;
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd.get()), open_fds_.end());
  // `fd` closes after the lock is released: the destructor only shuts down listed fds.
}

}  // namespace trybox::testing
