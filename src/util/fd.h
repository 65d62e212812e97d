// UniqueFd: owns one file descriptor. Move-only; the destructor closes quietly, Close()
// reports the error. Plus the blocking read/write helpers every subsystem uses.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trybox {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int Release();
  Status Close();
  // Closes quietly and takes `fd`.
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Writes all of `data`, retrying on EINTR and short writes. EPIPE is kUnavailable.
Status WriteFull(int fd, const void* data, size_t len);
inline Status WriteFull(int fd, std::string_view s) { return WriteFull(fd, s.data(), s.size()); }

// Reads exactly `len` bytes. Returns kUnavailable("eof") if the peer closed before any byte,
// kUnavailable("truncated") if it closed part-way.
Status ReadFull(int fd, void* data, size_t len);

// Reads at most `len` bytes (one read(2), EINTR retried). 0 means EOF.
Result<size_t> ReadSome(int fd, void* data, size_t len);

Result<std::string> ReadFileToString(const std::string& path);
// Writes to a temp file beside `path`, fsyncs and renames over it.
// `durable`: fsync before the rename. Off only where a crash may lose the file (a
// throwaway guest's own /etc files).
Status WriteFileAtomic(const std::string& path, std::string_view data, mode_t mode = 0644,
                       bool durable = true);

Result<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode = 0);

// The names in a directory, without . and ..; unordered. A directory that cannot be opened
// is an error (ENOENT included).
Result<std::vector<std::string>> ListDir(const std::string& dir);

// Removes a tree like `rm -rf`; a missing path is OK.
Status RemoveTree(const std::string& path);
// Copies a regular file's bytes to a new file `to` (which must not exist), with `mode`.
Status CopyFile(const std::string& from, const std::string& to, mode_t mode);
// Copies the data extents of `from` into `to` at the same offsets, up to `size` bytes: holes
// stay holes (SEEK_DATA/SEEK_HOLE), data moves in the kernel (copy_file_range) where it can.
Status CopyDataExtents(int from, int to, uint64_t size);
Status MakeDirs(const std::string& path, mode_t mode = 0755);

// A directory created under `parent` (mkdtemp) and removed with its contents when dropped.
class TempDir {
 public:
  static Result<TempDir> Make(const std::string& parent, const std::string& prefix);
  TempDir(TempDir&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  TempDir& operator=(TempDir&&) = delete;
  TempDir(const TempDir&) = delete;
  ~TempDir();
  const std::string& path() const { return path_; }
  // Keeps the directory on disk (for example after renaming it into place).
  void Release() { path_.clear(); }

 private:
  explicit TempDir(std::string p) : path_(std::move(p)) {}
  std::string path_;
};

}  // namespace trybox
