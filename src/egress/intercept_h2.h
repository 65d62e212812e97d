// HTTP/2 with the guest on an intercepted tunnel (docs/secrets.md). When the guest's TLS
// handshake settles on ALPN "h2", RelayHttp2 serves HTTP/2 to it (nghttp2) and carries every
// request stream to the upstream as an HTTP/1.1 request through RelayHttp (intercept.h). So
// each rule of the HTTP/1.1 relay holds for HTTP/2 unchanged, by the same code: placeholders
// swapped in the target, headers and Basic credentials (and bodies for `body` secrets), a
// foreign placeholder refused, the VM's HTTP rules, the Host check, Set-Cookie dropped.
//
// Translation of one stream (RFC 9113 section 8 to RFC 9112):
//  - ":method :path HTTP/1.1", then `Host: <:authority>` (or the `host` field when there is
//    no :authority; both, when they differ, so that RelayHttp refuses the request), the
//    other fields as they came (nghttp2 has already refused upper-case names, connection-
//    specific fields, and CR, LF or NUL in values), and `cookie` fields joined with "; ".
//  - A request that ends with its HEADERS has no body (POST, PUT and PATCH get
//    `Content-Length: 0`); one with a `content-length` keeps it; any other body is sent with
//    `Transfer-Encoding: chunked`, one chunk per DATA frame.
//  - ":scheme" must be "https"; CONNECT (a tunnel inside the tunnel) and request trailers
//    are refused (400), as is a request head over InterceptLimits::max_head (431). These, like
//    RelayHttp's refusals, reach the guest as a response carrying `x-trybox-reason`.
//  - The response's connection-specific fields (Connection and what it names, Keep-Alive,
//    Transfer-Encoding, Upgrade, Proxy-Connection, TE) are dropped and names lower-cased;
//    1xx responses are sent as interim HEADERS; the body, de-chunked, as DATA frames.
//    Response trailers are dropped.
//
// Upstream connections ("lanes"): each is an HTTP/1.1 connection with its own RelayHttp and
// serves one stream at a time. The first is the connection the proxy opened (and verified)
// before the guest's handshake; more are made by `dial` as streams run concurrently, and a
// lane whose response left the connection open serves the next stream (at most
// kMaxIdleLanes wait idle). A stream the guest resets, or a relay refusal that ends its
// connection, ends that lane only.
//
// Limits: at most kMaxStreams concurrent streams (SETTINGS_MAX_CONCURRENT_STREAMS, enforced
// here as well as advertised), each stream's request body flow-controlled by what the
// upstream has taken (a window of kStreamWindow), each stream's response buffered up to
// kMaxBufferedResponse before its lane stops reading the upstream, and a connection with no
// stream for InterceptLimits::head_timeout closed with GOAWAY.
//
// Thread-safety: RelayHttp2 blocks its caller, which runs the HTTP/2 session; one thread
// reads the guest, and each lane has two (its RelayHttp and its response reader), all joined
// before it returns. The guest stream must stay alive until then; `dial` is called from lane
// threads, concurrently.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "egress/byte_stream.h"
#include "egress/http_rules.h"
#include "egress/intercept.h"
#include "egress/secrets.h"
#include "util/status.h"

namespace trybox::egress {

// A new connection to the tunnel's upstream, ready for HTTP/1.1 (TLS verified).
using UpstreamDialer = std::function<Result<std::unique_ptr<ByteStream>>()>;

inline constexpr int kMaxStreams = 16;
inline constexpr int kMaxIdleLanes = 4;
inline constexpr int kStreamWindow = 1 << 20;
inline constexpr size_t kMaxBufferedResponse = 256 << 10;

// Serves HTTP/2 to `guest` for requests to `host` (canonical, the CONNECT target) until the
// guest closes, the connection idles out, or either side fails. The result sums the lanes':
// requests forwarded, substitutions, bytes; the first refusal (made up here or by a lane's
// relay) with its reason; `error` when the HTTP/2 session itself ended abnormally.
InterceptResult RelayHttp2(ByteStream& guest, const UpstreamDialer& dial, const SecretSet& secrets,
                           const std::string& host, const InterceptLimits& limits = {},
                           const HttpRules* rules = nullptr);

}  // namespace trybox::egress
