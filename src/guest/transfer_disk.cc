#include "guest/transfer_disk.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace trybox::guest {

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
