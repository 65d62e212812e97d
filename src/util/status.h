// Status and Result<T>: errors as values.
//
// A Status is either OK or an error with a code and a message that names the thing and the
// reason. Result<T> holds a T or a non-OK Status. Neither is thread-safe to mutate; both are
// cheap to move.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace trybox {

enum class Code {
  kOk = 0,
  kInvalidArgument,  // the caller's input is malformed (bad name, bad frame)
  kNotFound,         // a named thing does not exist (image, VM, path)
  kAlreadyExists,
  kFailedPrecondition,  // the thing exists but is in the wrong state (VM dead, image tampered)
  kUnavailable,         // a peer is gone or unreachable (guest channel lost, daemon down)
  kDeadlineExceeded,
  kResourceExhausted,  // disk full, too many VMs, over a quota
  kPermissionDenied,
  kInternal,   // a broken invariant or an unexpected OS error
  kCancelled,  // the caller (or another thread on its behalf) stopped the operation
};

const char* CodeName(Code code);
// The inverse of CodeName ("NOT_FOUND" -> kNotFound); kInternal for a name it does not know
// (a peer newer than this build).
Code CodeFromName(std::string_view name);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NOT_FOUND: image 'x' is not built".
  std::string ToString() const;

  // Prefixes context: Status(kNotFound, "no such file").Annotate("put /a") -> "put /a: no such
  // file".
  Status Annotate(const std::string& context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return Status(Code::kInvalidArgument, std::move(m));
}
inline Status NotFound(std::string m) { return Status(Code::kNotFound, std::move(m)); }
inline Status FailedPrecondition(std::string m) {
  return Status(Code::kFailedPrecondition, std::move(m));
}
inline Status Unavailable(std::string m) { return Status(Code::kUnavailable, std::move(m)); }
inline Status Internal(std::string m) { return Status(Code::kInternal, std::move(m)); }
inline Status DeadlineExceeded(std::string m) {
  return Status(Code::kDeadlineExceeded, std::move(m));
}
inline Status ResourceExhausted(std::string m) {
  return Status(Code::kResourceExhausted, std::move(m));
}
inline Status Cancelled(std::string m) { return Status(Code::kCancelled, std::move(m)); }
inline Status PermissionDenied(std::string m) {
  return Status(Code::kPermissionDenied, std::move(m));
}

// Converts errno (read at the call) into a Status whose message is "what: strerror".
// ENOENT maps to kNotFound, ENOSPC/EDQUOT to kResourceExhausted, EACCES/EPERM to
// kPermissionDenied, everything else to kInternal.
Status ErrnoError(const std::string& what, int err = errno);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status(Code::kInternal, "Result built from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T value_or(T fallback) const& { return ok() ? std::get<T>(v_) : std::move(fallback); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace trybox

#define TRYBOX_CONCAT_INNER(a, b) a##b
#define TRYBOX_CONCAT(a, b) TRYBOX_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define RETURN_IF_ERROR(expr)      \
  do {                             \
    ::trybox::Status _st = (expr); \
    if (!_st.ok()) return _st;     \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());`
#define ASSIGN_OR_RETURN(lhs, expr) ASSIGN_OR_RETURN_IMPL(TRYBOX_CONCAT(_res_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
