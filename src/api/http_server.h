// HttpServer: tryboxd's HTTP/1.1 listener (docs/protocol/http.md), on libmicrohttpd.
//
// Plain HTTP on a loopback address only: API keys travel in headers, so the listener never
// binds an address another machine can reach (put a TLS proxy in front for that). One thread
// per connection, so a handler may block (a create takes seconds).
//
// Each request meets the gate when its head has arrived, before a byte of its body is read:
// the gate refuses it (its answer sent at once, the body never read, the connection closed),
// or admits it with a body limit, saying whether its caller was proven (a key, a token, a
// session). A body past the limit is refused with 413 when its Content-Length says so, and
// the connection is closed when a chunked body grows past it. An admitted request is whole
// before its handler runs. Connections that have not proven their caller are kept from
// crowding out those that have (connection_guard.h).
// Thread-safe: the gate and the handler are called from many threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "util/status.h"

namespace trybox::api {

// One part of a multipart/form-data body that carried a file name (an upload).
struct FormFile {
  std::string field;     // the part's name ("file")
  std::string filename;  // as the client sent it
  std::string data;
};

struct HttpRequest {
  std::string method;                          // as sent: "GET", "POST"...
  std::string path;                            // decoded, without the query
  std::map<std::string, std::string> query;    // decoded; the first of a repeated name
  std::map<std::string, std::string> headers;  // names in lowercase
  // The body as sent, except for multipart/form-data: that is parsed (by libmicrohttpd's
  // post processor) into `files` and `form` instead, and `body` stays empty.
  std::string body;
  std::vector<FormFile> files;
  std::map<std::string, std::string> form;  // the parts without a file name
  std::string peer;                         // "127.0.0.1:41234"
  // Set by the layer that checked the caller: the API key's id (the sandbox's owner, for an
  // in-sandbox request), and the sandbox an in-sandbox request's access token was checked
  // against. Empty before that.
  std::string principal;
  std::string sandbox;

  // The header's value, or "" when absent.
  std::string Header(const std::string& lowercase_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // A streamed body instead of `body` (sent chunked): called for each next piece on the
  // connection's own thread, so it may block until there is one; false at the end. It is
  // not called again once the peer is gone, and it is destroyed when the exchange ends.
  std::function<bool(std::string* next)> stream;
};

struct HttpLimits {
  size_t max_body_bytes = size_t{1} << 20;  // for a server without a gate
  unsigned max_connections = 64;
  // Of those, kept for connections serving a proven caller's request: at most
  // max_connections - reserved_connections wait for a head or serve an unproven request.
  unsigned reserved_connections = 16;
  unsigned max_unproven_per_peer = 32;  // a peer is a local user (peer.h)
  // An unproven connection (a new one, or one kept alive after its request) is closed when
  // no request with credentials arrives on it this long.
  unsigned head_timeout_s = 10;
  unsigned idle_timeout_s = 60;  // a connection that sends nothing this long is closed
};

// The gate's word on a request whose head has arrived.
struct Admission {
  // The answer to send instead (a 401): the body is never read.
  std::optional<HttpResponse> refusal;
  // The caller showed a key, a sandbox's token or a session: while this request is served,
  // its connection is not one of the unproven (connection_guard.h).
  bool proven = false;
  size_t body_limit = 0;  // bytes
};

// "HOST:PORT" with HOST a loopback address ("127.0.0.1", "localhost", "[::1]"); PORT 0 picks
// a free port. INVALID_ARGUMENT names what is wrong, a non-loopback host among it.
struct ListenAddress {
  std::string host;  // numeric: "127.0.0.1" or "::1"
  uint16_t port = 0;
};
Result<ListenAddress> ParseListenAddress(const std::string& text);

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  // Called with the head of each request (`body` empty). Without one, every request is
  // admitted as proven, with `max_body_bytes`.
  using Gate = std::function<Admission(const HttpRequest&)>;

  // Binds and starts serving; UNAVAILABLE (with errno's words) when the address is taken.
  static Result<std::unique_ptr<HttpServer>> Start(const ListenAddress& where,
                                                   const HttpLimits& limits, Handler handler,
                                                   Gate gate = nullptr);
  // Stops accepting and waits for the requests in flight.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const { return port_; }
  const std::string& host() const { return host_; }  // numeric, as bound
  // "http://127.0.0.1:PORT"
  std::string url() const;
  const HttpLimits& limits() const { return limits_; }

  struct Impl;

 private:
  HttpServer() = default;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  uint16_t port_ = 0;
  HttpLimits limits_;
};

// A JSON error body in the shape E2B's clients read: {"code": STATUS, "message": ...}.
HttpResponse JsonError(int status, const std::string& message);
HttpResponse JsonReply(int status, const std::string& json_text);

}  // namespace trybox::api
