// Unix stream sockets: connect, and a listener that unlinks its socket file when dropped.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "util/fd.h"
#include "util/status.h"

namespace trybox {

Result<UniqueFd> ConnectUnix(const std::string& path);

// A listening socket bound at `path` (a stale socket file there is replaced), mode 0600 set
// by chmod after the bind; the path stays when the fd is closed. For a directory only its
// owner can enter (a VM's directory), so the moment between bind and chmod exposes nothing.
// It leaves the umask alone: the umask is the whole process's, and changing it (as this
// once did) races every other thread that creates a file or directory meanwhile.
Result<UniqueFd> ListenUnixInPrivateDir(const std::string& path);

// Owns a listening socket and its path; the destructor closes it and unlinks the path.
class UnixListener {
 public:
  // ListenUnixInPrivateDir(path), owned: `path`'s directory must be private (the daemon's
  // runtime directory is checked to be).
  static Result<UnixListener> Listen(const std::string& path);
  UnixListener(UnixListener&& o) noexcept : fd_(std::move(o.fd_)), path_(std::move(o.path_)) {
    o.path_.clear();
  }
  UnixListener& operator=(UnixListener&&) = delete;
  ~UnixListener();

  // Blocks for the next connection. kUnavailable after Shutdown().
  Result<UniqueFd> Accept();
  // Wakes a blocked Accept (from another thread).
  void Shutdown();
  const std::string& path() const { return path_; }

 private:
  UnixListener(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  UniqueFd fd_;
  std::string path_;
};

struct PeerCred {
  pid_t pid;
  uid_t uid;
  gid_t gid;
};
Result<PeerCred> GetPeerCred(int fd);

// All of `data` into the socket `fd` by send(MSG_NOSIGNAL): a peer that went away is an
// error ("send: ..."), never a SIGPIPE.
Status SendFull(int fd, std::string_view data);

}  // namespace trybox
