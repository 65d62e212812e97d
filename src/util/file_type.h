// Names of file types for messages and reports: "a character device", "a fifo", ...
#pragma once

#include <sys/stat.h>

namespace trybox {

inline const char* DescribeFileType(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a fifo";
  if (S_ISSOCK(mode)) return "a socket";
  return "an unsupported file type";
}

}  // namespace trybox
