#include "egress/byte_stream.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>

#include "util/fd.h"
#include "util/socket.h"

namespace trybox::egress {

Result<std::string> FdStream::Read(size_t max,
                                   std::optional<std::chrono::steady_clock::time_point> deadline) {
  pollfd p{fd_, POLLIN, 0};
  for (;;) {
    int ms = -1;
    if (deadline) {
      auto left =
          std::chrono::ceil<std::chrono::milliseconds>(*deadline - std::chrono::steady_clock::now())
              .count();
      ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
    }
    int n = ::poll(&p, 1, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("poll");
    if (n == 0) return DeadlineExceeded("no bytes in time");
    break;
  }
  std::string buf(max, '\0');
  auto got = ReadSome(fd_, buf.data(), buf.size());
  if (!got.ok()) return Unavailable(got.status().message());
  buf.resize(*got);
  return buf;
}

Status FdStream::Write(std::string_view data) {
  // A peer that went away is an error here, never a SIGPIPE.
  Status st = SendFull(fd_, data);
  return st.ok() ? st : Unavailable(st.message());
}

Status FdStream::CloseWrite() {
  if (::shutdown(fd_, SHUT_WR) != 0) return ErrnoError("shutdown");
  return Status::Ok();
}

void FdStream::Abort() { ::shutdown(fd_, SHUT_RDWR); }

}  // namespace trybox::egress
