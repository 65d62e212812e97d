#include "util/socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace trybox {
namespace {

Result<sockaddr_un> Addr(const std::string& path) {
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return InvalidArgument("socket path is too long (" + std::to_string(path.size()) +
                           " bytes): " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

Result<UniqueFd> ConnectUnix(const std::string& path) {
  ASSIGN_OR_RETURN(sockaddr_un addr, Addr(path));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return ErrnoError("connect " + path);
  }
  return fd;
}

Result<UniqueFd> ListenUnixInPrivateDir(const std::string& path) {
  ASSIGN_OR_RETURN(sockaddr_un addr, Addr(path));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket");
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path.c_str());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return ErrnoError("bind " + path);
  }
  if (::chmod(path.c_str(), 0600) != 0 || ::listen(fd.get(), 128) != 0) {
    Status s = ErrnoError("listen on " + path);
    ::unlink(path.c_str());
    return s;
  }
  return fd;
}

Result<UnixListener> UnixListener::Listen(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, ListenUnixInPrivateDir(path));
  return UnixListener(std::move(fd), path);
}

UnixListener::~UnixListener() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

Result<UniqueFd> UnixListener::Accept() {
  for (;;) {
    int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c >= 0) return UniqueFd(c);
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EINVAL) return Unavailable("listener shut down");
    return ErrnoError("accept");
  }
}

void UnixListener::Shutdown() { ::shutdown(fd_.get(), SHUT_RDWR); }

Result<PeerCred> GetPeerCred(int fd) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoError("getsockopt(SO_PEERCRED)");
  }
  return PeerCred{cred.pid, cred.uid, cred.gid};
}

Status SendFull(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("send");
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

}  // namespace trybox
