#include "util/fd.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

namespace trybox {

UniqueFd::~UniqueFd() { Reset(); }

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) Reset(other.Release());
  return *this;
}

int UniqueFd::Release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

Status UniqueFd::Close() {
  if (fd_ < 0) return Status::Ok();
  int fd = Release();
  // close(2) must not be retried on EINTR on Linux: the fd is gone either way.
  if (::close(fd) != 0 && errno != EINTR) return ErrnoError("close");
  return Status::Ok();
}

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status WriteFull(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status ReadFull(int fd, void* data, size_t len) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < len) {
    ssize_t n = ::read(fd, p + got, len - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read");
    }
    if (n == 0) return Unavailable(got == 0 ? "eof" : "truncated");
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<size_t> ReadSome(int fd, void* data, size_t len) {
  for (;;) {
    ssize_t n = ::read(fd, data, len);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno != EINTR) return ErrnoError("read");
  }
}

Result<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoError("open " + path);
  return UniqueFd(fd);
}

Result<std::string> ReadFileToString(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  std::string out;
  char buf[65536];
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, ReadSome(fd.get(), buf, sizeof buf));
    if (n == 0) break;
    out.append(buf, n);
  }
  return out;
}

Status WriteFileAtomic(const std::string& path, std::string_view data, mode_t mode, bool durable) {
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(tmp, O_WRONLY | O_CREAT | O_TRUNC, mode));
    Status st = WriteFull(fd.get(), data);
    if (st.ok() && durable && ::fsync(fd.get()) != 0) st = ErrnoError("fsync " + tmp);
    if (st.ok()) st = fd.Close();
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      return st.Annotate("write " + path);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status st = ErrnoError("rename " + tmp + " -> " + path);
    ::unlink(tmp.c_str());
    return st;
  }
  return Status::Ok();
}

Result<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return ErrnoError("open directory " + dir);
  std::vector<std::string> out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(std::move(name));
  }
  ::closedir(d);
  return out;
}

Status RemoveTree(const std::string& path) {
  std::error_code ec;
  // Read-only directories (frozen images) would make remove_all fail; open them up first.
  if (std::filesystem::is_directory(std::filesystem::symlink_status(path, ec))) {
    for (auto it = std::filesystem::recursive_directory_iterator(
             path, std::filesystem::directory_options::skip_permission_denied, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) ::chmod(it->path().c_str(), 0700);
    }
    ::chmod(path.c_str(), 0700);
  }
  std::filesystem::remove_all(path, ec);
  if (ec) return Internal("remove " + path + ": " + ec.message());
  return Status::Ok();
}

Status MakeDirs(const std::string& path, mode_t mode) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Internal("mkdir " + path + ": " + ec.message());
  ::chmod(path.c_str(), mode);
  return Status::Ok();
}

Result<TempDir> TempDir::Make(const std::string& parent, const std::string& prefix) {
  std::string tmpl = parent + "/" + prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoError("mkdtemp " + tmpl);
  return TempDir(tmpl);
}

TempDir::~TempDir() {
  if (!path_.empty()) (void)RemoveTree(path_);
}

Status CopyFile(const std::string& from, const std::string& to, mode_t mode) {
  ASSIGN_OR_RETURN(UniqueFd in, OpenFile(from, O_RDONLY | O_CLOEXEC));
  ASSIGN_OR_RETURN(UniqueFd out, OpenFile(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  for (;;) {
    ssize_t n = ::copy_file_range(in.get(), nullptr, out.get(), nullptr, 1 << 30, 0);
    if (n == 0) return Status::Ok();
    if (n > 0) continue;
    if (errno == EINTR) continue;
    // Between file systems of different kinds (a tmpfs and an ext4, say) the kernel refuses
    // copy_file_range: the bytes are copied through a buffer instead, from where it stopped.
    if (errno == EXDEV || errno == EOPNOTSUPP || errno == ENOSYS) {
      std::string buf(1 << 20, '\0');
      Status st;
      for (;;) {
        auto got = ReadSome(in.get(), buf.data(), buf.size());
        if (!got.ok()) {
          st = got.status();
          break;
        }
        if (*got == 0) return Status::Ok();
        st = WriteFull(out.get(), std::string_view(buf.data(), *got));
        if (!st.ok()) break;
      }
      ::unlink(to.c_str());
      return st.Annotate("copy " + from + " to " + to);
    }
    Status st = ErrnoError("copy " + from + " to " + to);
    ::unlink(to.c_str());
    return st;
  }
}

namespace {

Status PWriteAll(int fd, std::string_view d, off_t offset) {
  while (!d.empty()) {
    ssize_t n = ::pwrite(fd, d.data(), d.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("write");
    d.remove_prefix(static_cast<size_t>(n));
    offset += n;
  }
  return Status::Ok();
}

// [at, end) of `from` into `to` at the same offsets: copy_file_range, else read and write.
Status CopyRange(int from, int to, off_t at, off_t end) {
  while (at < end) {
    loff_t in = at, out = at;
    ssize_t n = ::copy_file_range(from, &in, to, &out, static_cast<size_t>(end - at), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      at += n;
      continue;
    }
    if (n == 0) return Internal("the file shrank while it was copied");
    if (errno != EXDEV && errno != EINVAL && errno != EOPNOTSUPP && errno != ENOSYS) {
      return ErrnoError("copy_file_range");
    }
    std::string buf(1 << 20, '\0');
    while (at < end) {
      size_t want = static_cast<size_t>(std::min<off_t>(end - at, static_cast<off_t>(buf.size())));
      ssize_t r = ::pread(from, buf.data(), want, at);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        return r < 0 ? ErrnoError("read") : Internal("the file shrank while it was copied");
      RETURN_IF_ERROR(PWriteAll(to, std::string_view(buf.data(), static_cast<size_t>(r)), at));
      at += r;
    }
  }
  return Status::Ok();
}

}  // namespace

Status CopyDataExtents(int from, int to, uint64_t size) {
  off_t pos = 0;
  const off_t end = static_cast<off_t>(size);
  while (pos < end) {
    off_t data = ::lseek(from, pos, SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;  // only a hole is left
    if (data < 0) return ErrnoError("seek to data");
    if (data >= end) break;
    off_t hole = ::lseek(from, data, SEEK_HOLE);
    if (hole < 0) return ErrnoError("seek to a hole");
    hole = std::min(hole, end);
    RETURN_IF_ERROR(CopyRange(from, to, data, hole));
    pos = hole;
  }
  return Status::Ok();
}

}  // namespace trybox
