#include "util/private_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

namespace trybox {
namespace {

std::string Octal(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

Status NotPrivate(const std::string& path, const std::string& why) {
  return PermissionDenied(path + " is not a private directory: " + why +
                          "; it must be a directory owned by uid " + std::to_string(::geteuid()) +
                          " with mode 0700. Another user may have created it: move it away or "
                          "remove it, then try again");
}

}  // namespace

Status CheckPrivateDir(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoError(path);
  if (S_ISLNK(st.st_mode)) return NotPrivate(path, "it is a symbolic link");
  if (!S_ISDIR(st.st_mode)) return NotPrivate(path, "it is not a directory");
  if (st.st_uid != ::geteuid()) {
    return NotPrivate(path, "it is owned by uid " + std::to_string(st.st_uid));
  }
  if ((st.st_mode & 0777) != 0700) return NotPrivate(path, "its mode is " + Octal(st.st_mode));
  return Status::Ok();
}

Status MakePrivateDir(const std::string& path) {
  // Each missing component from the top down; an existing one (/tmp, $XDG_RUNTIME_DIR) is
  // left as it is. mkdir never follows a symbolic link in the last component, so a link
  // planted at `path` stays a link and is refused below.
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    std::string parent = path.substr(0, slash);
    if (::mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError("mkdir " + parent);
  }
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError("mkdir " + path);
  return CheckPrivateDir(path);
}

}  // namespace trybox
