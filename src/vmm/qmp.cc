#include "vmm/qmp.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "util/json.h"
#include "util/socket.h"

namespace trybox::vmm {

using Json = nlohmann::json;

Result<Qmp> Qmp::Connect(const std::string& path, std::chrono::steady_clock::time_point deadline) {
  // The socket listens from before QEMU starts (vmm/qemu.h, kQmpSocketFd): the connect is
  // queued at once, and the greeting comes when QEMU is ready (or the connection is reset
  // if QEMU dies first).
  auto fd = ConnectUnix(path);
  if (!fd.ok()) {
    return Unavailable("QEMU's monitor socket " + path + " refused: " + fd.status().message());
  }
  Qmp q(std::move(*fd));
  q.deadline_ = deadline;
  ASSIGN_OR_RETURN(Json greeting, q.ReadMessage());
  if (!greeting.contains("QMP")) {
    return Internal("QEMU's monitor greeted with " + greeting.dump());
  }
  RETURN_IF_ERROR(q.Execute("qmp_capabilities").status());
  return q;
}

Result<Json> Qmp::ReadMessage() {
  for (;;) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      Json msg = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (msg.is_discarded() || !msg.is_object()) {
        return Internal("QEMU's monitor sent a line that is not a JSON object");
      }
      return msg;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline_ - std::chrono::steady_clock::now());
    struct pollfd p = {fd_.get(), POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("poll QEMU monitor");
    if (n == 0) return DeadlineExceeded("QEMU's monitor did not answer in time");
    char buf[4096];
    auto got = ReadSome(fd_.get(), buf, sizeof buf);
    if (!got.ok()) return got.status();
    if (*got == 0) return Unavailable("QEMU's monitor closed (QEMU exited?)");
    buffer_.append(buf, *got);
  }
}

Result<Json> Qmp::Execute(const std::string& command, const Json& arguments, int fd) {
  Json msg = {{"execute", command}};
  if (!arguments.is_null()) msg["arguments"] = arguments;
  std::string line = msg.dump() + "\n";
  if (fd >= 0) {
    struct iovec iov = {line.data(), line.size()};
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    struct msghdr mh = {};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    struct cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    ssize_t n = ::sendmsg(fd_.get(), &mh, MSG_NOSIGNAL);
    if (n < 0) return ErrnoError("send " + command + " to QEMU's monitor");
    if (static_cast<size_t>(n) < line.size()) {
      RETURN_IF_ERROR(WriteFull(fd_.get(), line.data() + n, line.size() - n));
    }
  } else {
    RETURN_IF_ERROR(WriteFull(fd_.get(), line));
  }
  for (;;) {
    ASSIGN_OR_RETURN(Json reply, ReadMessage());
    if (reply.contains("event")) continue;
    if (reply.contains("error")) {
      const Json& e = reply["error"];
      return Internal("QEMU refused " + command + ": " + StrOr(e, "class", "?") + ": " +
                      StrOr(e, "desc", "?"));
    }
    if (reply.contains("return")) return reply["return"];
    return Internal("QEMU's monitor answered " + command + " with " + reply.dump());
  }
}

}  // namespace trybox::vmm
