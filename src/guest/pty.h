// A pseudo-terminal pair for an exec with "tty" (docs/protocol/guest.md, "exec"): the
// master stays with trybox-init (output is read from it, input and window sizes written to
// it), the slave becomes the command's stdin, stdout, stderr and controlling terminal.
#pragma once

#include <sys/types.h>

#include <optional>

#include "guest/requests.h"
#include "util/fd.h"
#include "util/status.h"

namespace trybox::guest {

struct Pty {
  UniqueFd master;  // O_NONBLOCK, close-on-exec
  UniqueFd slave;   // close-on-exec (dup'ed onto 0..2 in the child)
};

// Opens a pair through /dev/ptmx with the window size `size`. `owner`: the uid of the
// account the command runs as, given the slave as login(1) would (mode 0620, group tty);
// absent, the slave stays root's.
Result<Pty> OpenPty(TermSize size, std::optional<uid_t> owner = std::nullopt);

// TIOCSWINSZ on the master: the kernel sends SIGWINCH to the terminal's foreground group.
Status SetWindowSize(int master, TermSize size);

}  // namespace trybox::guest
