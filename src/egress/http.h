// The one piece of HTTP the egress proxy reads: a client's request head, either
//   CONNECT host:port HTTP/1.1            (authority-form, the tunnel)
//   GET http://host[:port]/path HTTP/1.1  (absolute-form, plain HTTP)
// Bytes come from an untrusted guest, so parsing is strict: CRLF line ends, token methods,
// no obsolete line folding, a size cap. Everything after the head is never parsed.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace trybox::egress {

inline constexpr size_t kDefaultMaxHead = 16 * 1024;

// RFC 9110's pieces, shared by the proxy's and the interception's parsers.
bool IsHttpToken(std::string_view s);          // a method or a header name
bool IsHttpCtl(char c);                        // a control byte other than HTAB
std::string_view TrimOws(std::string_view s);  // spaces and tabs off both ends

// A message head split strictly: CRLF line ends only (a bare CR or LF is an error), no
// obsolete line folding, token header names, no control byte in a value. `start` is the
// request or status line (a view into `buffered`). nullopt while no blank line has come (and
// fewer than `max_head` bytes); kResourceExhausted past `max_head`; kInvalidArgument for a
// malformed head. `what` ("request", "response") names the head in errors, which never quote
// its bytes.
struct HeadLines {
  std::string_view start;
  std::vector<std::pair<std::string, std::string>> headers;
  size_t size = 0;  // bytes of the head including the blank line
};
Result<std::optional<HeadLines>> SplitHead(std::string_view buffered, size_t max_head,
                                           const char* what);

struct RequestHead {
  std::string method;
  std::string target;
  std::string version;  // "HTTP/1.1" or "HTTP/1.0"
  std::vector<std::pair<std::string, std::string>> headers;
  size_t size = 0;  // bytes of the head including the blank line
};

// nullopt while `buffered` holds no complete head yet (and is under `max_head` bytes).
// kResourceExhausted once `max_head` bytes arrived without the blank line;
// kInvalidArgument for a malformed head.
Result<std::optional<RequestHead>> ParseRequestHead(std::string_view buffered,
                                                    size_t max_head = kDefaultMaxHead);

struct ProxyTarget {
  bool tunnel = false;  // CONNECT
  std::string host;     // as sent, not yet validated (CanonicalHostname does that)
  int port = 0;
  std::string path;  // plain HTTP: origin-form ("/x?y"); empty for CONNECT
};

// Where the request wants to go. CONNECT needs an explicit port; absolute-form takes only
// "http://" (default port 80); userinfo and bracketed IPv6 hosts are passed on as the host
// so that the refusal names them.
Result<ProxyTarget> ParseProxyTarget(const RequestHead& head);

// The head to send upstream for plain HTTP: origin-form request line, Host set to the
// target, "Connection: close" added (one upstream per client connection), and dropped: the
// hop-by-hop headers (Connection, Keep-Alive, Proxy-Connection, Proxy-Authenticate,
// Proxy-Authorization and any other Proxy-*, TE, Trailer, Upgrade) and every header the
// request's Connection headers name. Transfer-Encoding and Content-Length stay: the body
// is relayed as it came, so its framing must too. kInvalidArgument when a Connection header
// names Host, Content-Length or Transfer-Encoding (dropping those would change what the
// upstream reads as the request).
Result<std::string> OriginRequest(const RequestHead& head, const ProxyTarget& target);

// A complete refusal from the proxy: status line, `X-Trybox-Reason: <reason>` and a short
// text body, `Connection: close`. The reason is made printable ASCII on one line (it may
// quote what a guest sent).
std::string RefusalResponse(int status, const std::string& reason);

}  // namespace trybox::egress
