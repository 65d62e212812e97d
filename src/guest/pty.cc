#include "guest/pty.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>

namespace trybox::guest {
namespace {

// The "tty" group of Debian's /etc/group (devpts is mounted with gid=5, docs/protocol/guest.md).
constexpr gid_t kTtyGroup = 5;

}  // namespace

Status SetWindowSize(int master, TermSize size) {
  struct winsize ws = {};
  ws.ws_row = size.rows;
  ws.ws_col = size.cols;
  if (::ioctl(master, TIOCSWINSZ, &ws) != 0) return ErrnoError("TIOCSWINSZ");
  return Status::Ok();
}

Result<Pty> OpenPty(TermSize size, std::optional<uid_t> owner) {
  Pty p;
  p.master.Reset(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK));
  if (!p.master.valid()) return ErrnoError("open /dev/ptmx");
  if (::grantpt(p.master.get()) != 0) return ErrnoError("grantpt");
  if (::unlockpt(p.master.get()) != 0) return ErrnoError("unlockpt");
  char name[64];
  if (::ptsname_r(p.master.get(), name, sizeof name) != 0) return ErrnoError("ptsname");
  p.slave.Reset(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!p.slave.valid()) return ErrnoError(std::string("open ") + name);
  RETURN_IF_ERROR(SetWindowSize(p.master.get(), size));
  if (owner) {
    if (::fchown(p.slave.get(), *owner, kTtyGroup) != 0 || ::fchmod(p.slave.get(), 0620) != 0) {
      return ErrnoError(std::string("give ") + name + " to the command's account");
    }
  }
  return p;
}

}  // namespace trybox::guest
