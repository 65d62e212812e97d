#include "api/connect.h"

#include "util/numbers.h"
#include "util/utf8.h"

namespace trybox::api::connect {

std::string Envelope(const Json& message, uint8_t flags) {
  const std::string text = message.dump(-1, ' ', false, Json::error_handler_t::replace);
  std::string out(5, '\0');
  out[0] = static_cast<char>(flags);
  const uint32_t n = static_cast<uint32_t>(text.size());
  out[1] = static_cast<char>(n >> 24);
  out[2] = static_cast<char>(n >> 16);
  out[3] = static_cast<char>(n >> 8);
  out[4] = static_cast<char>(n);
  return out + text;
}

std::string EndStream(const Status& st) {
  if (st.ok()) return Envelope(Json::object(), kEndStreamFlag);
  return Envelope({{"error", {{"code", CodeName(st)}, {"message", st.message()}}}}, kEndStreamFlag);
}

Result<Json> ParseStreamingRequest(std::string_view body) {
  if (body.size() < 5) {
    return InvalidArgument("the request is not a Connect envelope (" + std::to_string(body.size()) +
                           " bytes)");
  }
  const uint8_t flags = static_cast<uint8_t>(body[0]);
  if (flags & kCompressedFlag) return InvalidArgument("compressed envelopes are not accepted");
  if (flags != 0) return InvalidArgument("unexpected envelope flags " + std::to_string(flags));
  const uint32_t n = (uint32_t{static_cast<uint8_t>(body[1])} << 24) |
                     (uint32_t{static_cast<uint8_t>(body[2])} << 16) |
                     (uint32_t{static_cast<uint8_t>(body[3])} << 8) |
                     uint32_t{static_cast<uint8_t>(body[4])};
  if (body.size() - 5 < n) {
    return InvalidArgument("the envelope says " + std::to_string(n) + " bytes and " +
                           std::to_string(body.size() - 5) + " came");
  }
  if (body.size() - 5 > n) return InvalidArgument("bytes after the request's one envelope");
  Json j = Json::parse(body.substr(5), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("the request message is not a JSON object");
  }
  return j;
}

Result<Json> ParseUnaryRequest(std::string_view body) {
  if (body.empty()) return Json::object();
  Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("the request message is not a JSON object");
  }
  return j;
}

const char* CodeName(const Status& st) {
  switch (st.code()) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid_argument";
    case Code::kNotFound:
      return "not_found";
    case Code::kAlreadyExists:
      return "already_exists";
    case Code::kFailedPrecondition:
      return "failed_precondition";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kDeadlineExceeded:
      return "deadline_exceeded";
    case Code::kResourceExhausted:
      return "resource_exhausted";
    case Code::kPermissionDenied:
      return "permission_denied";
    case Code::kCancelled:
      return "canceled";
    default:
      return "internal";
  }
}

int UnaryHttpStatus(const Status& st) {
  // The protocol's table (Connect, "Error codes").
  switch (st.code()) {
    case Code::kInvalidArgument:
    case Code::kFailedPrecondition:
      return 400;
    case Code::kNotFound:
      return 404;
    case Code::kAlreadyExists:
      return 409;
    case Code::kPermissionDenied:
      return 403;
    case Code::kResourceExhausted:
      return 429;
    case Code::kUnavailable:
      return 503;
    case Code::kDeadlineExceeded:
      return 504;
    case Code::kCancelled:
      return 499;
    default:
      return 500;
  }
}

HttpResponse UnaryReply(const Json& message) {
  return {
      200, "application/json", {}, message.dump(-1, ' ', false, Json::error_handler_t::replace)};
}

HttpResponse UnaryError(const Status& st) {
  Json j = {{"code", CodeName(st)}, {"message", st.message()}};
  return {UnaryHttpStatus(st),
          "application/json",
          {},
          j.dump(-1, ' ', false, Json::error_handler_t::replace)};
}

Result<int64_t> TimeoutMs(const HttpRequest& req) {
  const std::string t = req.Header("connect-timeout-ms");
  if (t.empty()) return 0;
  if (t.size() > 10) return InvalidArgument("Connect-Timeout-Ms has more than 10 digits");
  return ParseBoundedInt(t, 0, 9999999999, "Connect-Timeout-Ms");
}

std::string Base64(std::string_view data) { return Base64Encode(data); }

Result<std::string> FromBase64(std::string_view text) {
  // Protobuf's JSON accepts both alphabets, padded or not: made standard, then decoded.
  std::string s(text);
  for (char& c : s) {
    if (c == '-') c = '+';
    if (c == '_') c = '/';
  }
  while (s.size() % 4 != 0) s += '=';
  return Base64Decode(s);
}

}  // namespace trybox::api::connect
