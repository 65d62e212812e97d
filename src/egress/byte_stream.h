// A connected byte stream in both directions, as the TLS-intercepting relay sees its two
// ends (the guest's decrypted side and the upstream's): a plain socket (FdStream) or a TLS
// session over one (tls.h's TlsStream).
//
// Thread-safety: one thread may Read while another Writes; Abort may be called from any
// thread and wakes a blocked Read or Write. Two concurrent Reads (or Writes) are not allowed.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "util/status.h"

namespace trybox::egress {

class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Up to `max` bytes, blocking until at least one arrives; "" at the peer's clean end of
  // its direction. kDeadlineExceeded when `deadline` passes first; kUnavailable when the
  // connection failed or was aborted.
  virtual Result<std::string> Read(
      size_t max, std::optional<std::chrono::steady_clock::time_point> deadline) = 0;
  // All of `data`, or an error.
  virtual Status Write(std::string_view data) = 0;
  // Ends this side's direction cleanly (shutdown(SHUT_WR); a TLS close_notify first).
  virtual Status CloseWrite() = 0;
  // Tears the connection down in both directions; a blocked Read or Write returns an error.
  virtual void Abort() = 0;
};

// A connected socket. Does not own the fd.
class FdStream : public ByteStream {
 public:
  explicit FdStream(int fd) : fd_(fd) {}
  Result<std::string> Read(size_t max,
                           std::optional<std::chrono::steady_clock::time_point> deadline) override;
  Status Write(std::string_view data) override;
  Status CloseWrite() override;
  void Abort() override;

 private:
  int fd_;
};

}  // namespace trybox::egress
