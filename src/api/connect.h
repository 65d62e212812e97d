// The Connect protocol's JSON codec over HTTP/1.1 (connectrpc.com/docs/protocol), as E2B's
// SDKs speak it to envd (docs/protocol/e2b.md, "In-sandbox API"): unary calls are a JSON
// body answered by a JSON body; a server-streaming call's request and response bodies are
// envelopes: a flags byte, a 4-byte big-endian length, then a JSON message. The response's
// last envelope has flag 0x02 and carries the end of the stream: {} or {"error": ...}.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "api/http_server.h"
#include "util/status.h"

namespace trybox::api::connect {

using Json = nlohmann::json;

inline constexpr uint8_t kEndStreamFlag = 0x02;
inline constexpr uint8_t kCompressedFlag = 0x01;

// One envelope around `message`.
std::string Envelope(const Json& message, uint8_t flags = 0);
// The end-of-stream envelope: success, or the error of `st` ({"code", "message"}).
std::string EndStream(const Status& st);

// A streaming request's single message: exactly one uncompressed envelope holding a JSON
// object. INVALID_ARGUMENT naming what is wrong (a cut envelope, a compressed one, more
// than one, bytes after it, JSON that is not an object).
Result<Json> ParseStreamingRequest(std::string_view body);
// A unary request's body: a JSON object ("" is {}).
Result<Json> ParseUnaryRequest(std::string_view body);

// Connect's code name for a Status ("not_found", "invalid_argument", ...), and the HTTP
// status a unary error is sent with.
const char* CodeName(const Status& st);
int UnaryHttpStatus(const Status& st);

HttpResponse UnaryReply(const Json& message);
HttpResponse UnaryError(const Status& st);

// The request's Connect-Timeout-Ms in milliseconds (0: none); INVALID_ARGUMENT when it is
// not 1 to 10 digits, as the protocol says.
Result<int64_t> TimeoutMs(const HttpRequest& req);

// Standard base64 with padding (protobuf JSON's `bytes`), and back.
std::string Base64(std::string_view data);
Result<std::string> FromBase64(std::string_view text);

}  // namespace trybox::api::connect
