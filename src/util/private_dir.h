// Directories only their owner can use, such as the runtime directory that holds a daemon's
// socket. A directory another user created, or a symbolic link to one, would let that user
// answer in the daemon's place (and read what the client sends), so it is refused, never
// repaired: the caller cannot tell a planted directory from a mistake.
#pragma once

#include <string>

#include "util/status.h"

namespace trybox {

// OK if `path` is, as lstat(2) sees it, a directory (not a symbolic link) owned by the
// effective uid with permission bits exactly 0700. Otherwise kNotFound if it does not exist,
// kPermissionDenied naming the path, what is wrong (a symlink, its owner, its mode) and what
// to do. Never changes anything.
Status CheckPrivateDir(const std::string& path);

// Creates `path` with mode 0700 if it does not exist (missing parents too, also 0700), then
// CheckPrivateDir. An existing path is checked as it is, never chmod'ed or chown'ed.
Status MakePrivateDir(const std::string& path);

}  // namespace trybox
