#include "guest/transfer_disk.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

namespace trybox::guest {
namespace {

// One read and one write of a copy. Direct I/O needs offsets, lengths and memory aligned to
// the device's logical block (512 bytes for virtio-blk); a page is used for all three.
constexpr size_t kDirectChunk = 4 << 20;
constexpr uint64_t kAlign = 4096;
// The disk is read in whole sectors: the host announces a put's size rounded up to one.
constexpr uint64_t kSector = 512;

uint64_t RoundDown(uint64_t n, uint64_t to) { return n / to * to; }
uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// O_DIRECT on `fd` while this lives, if its file system allows it (fcntl refuses with EINVAL
// where it does not); its flags are restored at the end.
class DirectIo {
 public:
  explicit DirectIo(int fd) : fd_(fd), flags_(::fcntl(fd, F_GETFL)) {
    on_ = flags_ >= 0 && ::fcntl(fd, F_SETFL, flags_ | O_DIRECT) == 0;
  }
  ~DirectIo() {
    if (flags_ >= 0) (void)::fcntl(fd_, F_SETFL, flags_);
  }
  DirectIo(const DirectIo&) = delete;
  DirectIo& operator=(const DirectIo&) = delete;
  bool on() const { return on_; }
  // Buffered from here on: for an unaligned tail, or after a short transfer.
  void Off() {
    if (on_) (void)::fcntl(fd_, F_SETFL, flags_ & ~O_DIRECT);
    on_ = false;
  }

 private:
  int fd_;
  int flags_;
  bool on_ = false;
};

struct FreeAligned {
  void operator()(char* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char, FreeAligned>;

AlignedBuffer MakeAligned(size_t bytes) {
  void* p = nullptr;
  if (::posix_memalign(&p, kAlign, bytes) != 0) return nullptr;
  return AlignedBuffer(static_cast<char*>(p));
}

// pread until `len` bytes or the end: the count read, or -errno.
int64_t PReadFull(int fd, char* buf, size_t len, uint64_t offset) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = ::pread(fd, buf + got, len - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) break;
    got += static_cast<size_t>(n);
    // A direct read that stopped short at an unaligned length is the end of the file.
    if (got % kAlign != 0) break;
  }
  return static_cast<int64_t>(got);
}

// All of `len` bytes at `offset`: 0 or errno.
int PWriteFull(int fd, const char* buf, size_t len, uint64_t offset) {
  while (len > 0) {
    ssize_t n = ::pwrite(fd, buf, len, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    buf += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return 0;
}

// Writes `len` bytes at `offset` (a multiple of kAlign while `out` is direct): the aligned
// part directly, the rest after turning direct I/O off. 0 or errno.
int WriteAligned(DirectIo& out, int fd, const char* buf, size_t len, uint64_t offset) {
  size_t direct = out.on() ? static_cast<size_t>(RoundDown(len, kAlign)) : 0;
  if (direct > 0) {
    if (int e = PWriteFull(fd, buf, direct, offset)) return e;
  }
  if (direct == len) return 0;
  out.Off();
  return PWriteFull(fd, buf + direct, len - direct, offset + direct);
}

}  // namespace

std::string DiskBySerial(const std::string& serial) {
  DIR* d = ::opendir("/sys/block");
  if (!d) return "";
  std::string name;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    auto got = ReadFileToString(std::string("/sys/block/") + e->d_name + "/serial");
    if (got.ok() && got->substr(0, got->find('\n')) == serial) {
      name = e->d_name;
      break;
    }
  }
  ::closedir(d);
  return name;
}

Result<std::unique_ptr<TransferDisk>> TransferDisk::Find(const char* serial) {
  const std::string name = DiskBySerial(serial);
  if (name.empty()) return NotFound(std::string("no disk with serial ") + serial);
  const std::string node = "/dev/" + name;
  // devtmpfs makes the node on a kernel thread, a moment after the disk shows in sysfs.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  struct stat st;
  while (::stat(node.c_str(), &st) != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(node, O_RDWR | O_CLOEXEC));
  if (::unlink(node.c_str()) != 0) return ErrnoError("unlink " + node);
  return std::make_unique<TransferDisk>(std::move(fd));
}

uint64_t TransferDisk::Capacity() const {
  struct stat st;
  if (::fstat(fd_.get(), &st) != 0) return 0;
  if (!S_ISBLK(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  uint64_t bytes = 0;
  if (::ioctl(fd_.get(), BLKGETSIZE64, &bytes) != 0) return 0;
  return bytes;
}

Status TransferDisk::AwaitCapacity(uint64_t bytes) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  auto pause = std::chrono::microseconds(100);
  for (;;) {
    uint64_t have = Capacity();
    if (have >= bytes) return Status::Ok();
    if (Clock::now() > deadline) {
      return DeadlineExceeded("the transfer disk holds " + std::to_string(have) + " bytes, not " +
                              std::to_string(bytes));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(10));
  }
}

Status TransferDisk::Rewind() {
  struct stat st;
  if (::fstat(fd_.get(), &st) != 0) return ErrnoError("stat the transfer disk");
  if (S_ISBLK(st.st_mode) && ::ioctl(fd_.get(), BLKFLSBUF, 0) != 0) {
    return ErrnoError("flush the transfer disk's cache");
  }
  if (::lseek(fd_.get(), 0, SEEK_SET) != 0) return ErrnoError("seek the transfer disk");
  return Status::Ok();
}

CopyErrors CopyDiskToFile(TransferDisk& disk, uint64_t n, int file) {
  if (!disk.Rewind().ok()) return {EIO, 0};
  const int in = disk.fd_for_io();
  DirectIo in_direct(in), out_direct(file);
  AlignedBuffer buf = MakeAligned(kDirectChunk);
  if (!buf) return {0, ENOMEM};
  uint64_t done = 0;
  while (done < n) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kDirectChunk, n - done));
    const size_t ask = in_direct.on() ? static_cast<size_t>(RoundUp(want, kSector)) : want;
    int64_t got = PReadFull(in, buf.get(), ask, done);
    if (got < 0) return {static_cast<int>(-got), 0};
    if (got == 0) return {EIO, 0};  // shorter than announced
    const size_t use = std::min<size_t>(static_cast<size_t>(got), want);
    if (int e = WriteAligned(out_direct, file, buf.get(), use, done)) return {0, e};
    done += use;
    if (done % kAlign != 0) in_direct.Off();
  }
  return {};
}

CopyErrors CopyFileToDisk(int file, TransferDisk& disk, uint64_t max, uint64_t* bytes) {
  *bytes = 0;
  if (Status st = disk.Rewind(); !st.ok()) return {EIO, 0};
  const int out = disk.fd_for_io();
  DirectIo in_direct(file), out_direct(out);
  AlignedBuffer buf = MakeAligned(kDirectChunk);
  if (!buf) return {ENOMEM, 0};
  for (;;) {
    int64_t got = PReadFull(file, buf.get(), kDirectChunk, *bytes);
    if (got < 0) return {0, static_cast<int>(-got)};
    if (got == 0) return {};
    const size_t len = static_cast<size_t>(got);
    if (*bytes + len > max) return {ENOSPC, 0};
    if (int e = WriteAligned(out_direct, out, buf.get(), len, *bytes)) return {e, 0};
    *bytes += len;
    // The end, or a file that grew after a short read: the rest is read buffered, from here.
    if (*bytes % kAlign != 0) in_direct.Off();
  }
}

uint64_t DiskBytesField(const nlohmann::json& request) {
  if (auto d = request.find("disk"); d != request.end() && d->is_object()) {
    if (auto b = d->find("bytes"); b != d->end() && b->is_number_unsigned()) {
      return b->get<uint64_t>();
    }
  }
  return 0;
}

Status MountExt4(int disk_fd, const std::string& node, const std::string& dir) {
  struct stat st;
  if (::fstat(disk_fd, &st) != 0) return ErrnoError("stat the disk");
  if (!S_ISBLK(st.st_mode)) return FailedPrecondition("the disk is not a block device");
  ::unlink(node.c_str());
  if (::mknod(node.c_str(), S_IFBLK | 0600, st.st_rdev) != 0) return ErrnoError("mknod " + node);
  int rc = ::mount(node.c_str(), dir.c_str(), "ext4", MS_NOATIME | MS_NOSUID | MS_NODEV,
                   "noinit_itable");
  int err = errno;
  ::unlink(node.c_str());
  if (rc != 0) return ErrnoError("mount the disk at " + dir, err);
  return Status::Ok();
}

}  // namespace trybox::guest
