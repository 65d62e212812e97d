// The HTTP/1.1 relay that puts secrets into requests (docs/secrets.md). Once the proxy has
// terminated TLS for a tunnel to a host that a secret is bound to, RelayHttp sits between the
// guest's decrypted side and the upstream's and parses both directions:
//
//  - each request head (strict, capped, with a deadline) gets the real value of every secret
//    bound to the tunnel's host in place of its placeholder: in every header value, inside
//    `Authorization: Basic` credentials (decoded, substituted, re-encoded), and in the request
//    target only for secrets with `target`. Header names are never rewritten; headers are
//    otherwise passed as they came, but for `Accept-Encoding`, narrowed to the codings the
//    response side can decode (gzip, deflate, identity).
//  - a request carrying the placeholder of a secret NOT bound to the host (anywhere in its
//    head, in decoded Basic credentials, or in a buffered body) is refused with 403 and the
//    connection ends; nothing of that request reaches the upstream.
//  - request bodies are relayed as they came (Content-Length or chunked framing, RFC 9112
//    section 6), except that a secret declared with `body` makes bodies of at most
//    InterceptLimits::max_buffered_body bytes buffered, substituted and sent with a corrected
//    Content-Length. Larger bodies, and chunked bodies with a coding besides chunked or with
//    trailer fields, are relayed unmodified and unscanned.
//  - responses are parsed (ParseResponseHead) to find where each ends and to take every bound
//    value back out (scrub.h): from the status line, every header value and the body. A body
//    without a content coding is streamed through a ScrubStream that keeps its length (its
//    framing goes as it came; a chunked one is cut into chunks anew, trailers dropped); a
//    gzip or deflate body is decoded, scrubbed and sent decoded and chunked (or up to the
//    connection's end for HTTP/1.0); any other coding is answered 502. Set-Cookie and
//    Set-Cookie2 are dropped unless a secret bound to the host has keep_cookies, so that a
//    session won with the secret does not reach the guest. A 101 turns the connection into
//    raw bytes both ways (not scrubbed).
//
// Rules the relay adds, each refused with a status and an X-Trybox-Reason header:
//  - the VM's HTTP rules for the host (http_rules.h), checked on each request's method
//    and target before anything of it is sent (403 naming the rule);
//  - the request target must be origin-form ("/path?query") or "*" (OPTIONS); absolute-form
//    is refused with 400 (clients inside a tunnel never send it, and accepting it would give a
//    second place to name the host);
//  - exactly one Host header, naming the tunnel's host (any port): a different Host could reach
//    another site served by the same upstream (domain fronting) with the secret in it (403);
//  - Content-Length together with Transfer-Encoding, a Transfer-Encoding whose last coding is
//    not chunked, or differing Content-Length values are refused with 400;
//  - TRACE and TRACK are refused with 405 (the answer would be the request, values and all).
//
// In the request target a value is written percent-encoded where its bytes would change the
// target's structure or are not allowed in it (everything but letters, digits and
// -._~!$'()*,:@); in headers and bodies it is written as it is (SecretSet guarantees no CR,
// LF or NUL).
//
// No secret value ever appears in an InterceptResult, in error text or in a response the
// relay makes up. Buffers that held a substituted head or body are wiped after they are sent
// (best effort: the allocator may have left copies of partial buffers).
//
// Thread-safety: RelayHttp blocks its caller and runs the response direction on a second
// thread, joined before it returns. Both streams must stay alive until it returns, and the
// caller may Abort either of them from another thread to end the relay early. SecretSet is
// shared read-only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "egress/byte_stream.h"
#include "egress/http.h"
#include "egress/http_rules.h"
#include "egress/secrets.h"
#include "util/status.h"

namespace trybox::egress {

struct InterceptLimits {
  // Bytes of one request or response head (and of a chunked body's trailer section).
  size_t max_head = kDefaultMaxHead;
  // How long a request head may take once its first byte came (then 408), and how long a
  // kept-alive connection may wait idle for the next request once every response was
  // delivered (then it is closed without a response, as servers do).
  std::chrono::milliseconds head_timeout{30000};
  // Request bodies up to this size are buffered for substitution when a secret bound to the
  // host has `body`.
  size_t max_buffered_body = 1 << 20;
};

struct InterceptResult {
  int requests = 0;                          // requests forwarded upstream
  std::map<std::string, int> substitutions;  // secret name -> requests it was put into
  int scrubbed = 0;            // occurrences of a bound value taken out of responses (scrub.h)
  int refused_status = 0;      // 0, or the status made up for the guest (400/403/408/431/502)
  std::string refused_reason;  // names the rule, and a secret by NAME only
  int64_t bytes_up = 0;        // bytes written upstream
  int64_t bytes_down = 0;      // bytes written to the guest
  bool upgraded = false;       // a 101 switched the connection to raw bytes
  std::string error;           // why it ended abnormally; "" when both sides closed cleanly
};

// Relays HTTP/1.1 between `guest` and `upstream` for requests to `host` (canonical, the
// CONNECT target) until both directions are done. See the file comment for the rules.
// `rules` (may be null): a request they refuse for `host` gets a 403 naming the rule
// (http_rules.h) and goes no further.
InterceptResult RelayHttp(ByteStream& guest, ByteStream& upstream, const SecretSet& secrets,
                          const std::string& host, const InterceptLimits& limits = {},
                          const HttpRules* rules = nullptr);

struct ResponseHead {
  std::string version;  // "HTTP/1.1" or "HTTP/1.0"
  int status = 0;       // 100..599
  std::string reason;
  std::vector<std::pair<std::string, std::string>> headers;
  size_t size = 0;  // bytes of the head including the blank line
};

// An upstream's response head, parsed as strictly as ParseRequestHead parses requests: CRLF
// line ends, "HTTP/1.x NNN reason", token header names, no obsolete line folding.
// nullopt while `buffered` holds no complete head yet (and is under `max_head` bytes);
// kResourceExhausted once `max_head` bytes arrived without the blank line; kInvalidArgument
// for a malformed head. Messages never quote the bytes (an upstream may echo a secret).
Result<std::optional<ResponseHead>> ParseResponseHead(std::string_view buffered,
                                                      size_t max_head = kDefaultMaxHead);

}  // namespace trybox::egress
