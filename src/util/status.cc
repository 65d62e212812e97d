#include "util/status.h"

#include <cstring>

namespace trybox {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case Code::kNotFound:
      return "NOT_FOUND";
    case Code::kAlreadyExists:
      return "ALREADY_EXISTS";
    case Code::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case Code::kUnavailable:
      return "UNAVAILABLE";
    case Code::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case Code::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case Code::kPermissionDenied:
      return "PERMISSION_DENIED";
    case Code::kInternal:
      return "INTERNAL";
    case Code::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

Code CodeFromName(std::string_view name) {
  for (int c = 0; c <= static_cast<int>(Code::kCancelled); ++c) {
    if (name == CodeName(static_cast<Code>(c))) return static_cast<Code>(c);
  }
  return Code::kInternal;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::Annotate(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

Status ErrnoError(const std::string& what, int err) {
  Code code = Code::kInternal;
  switch (err) {
    case ENOENT:
      code = Code::kNotFound;
      break;
    case ENOSPC:
    case EDQUOT:
      code = Code::kResourceExhausted;
      break;
    case EACCES:
    case EPERM:
      code = Code::kPermissionDenied;
      break;
    case EEXIST:
      code = Code::kAlreadyExists;
      break;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
      code = Code::kUnavailable;
      break;
    default:
      break;
  }
  return Status(code, what + ": " + std::strerror(err));
}

}  // namespace trybox
