// The transfer disk as the guest sees it (docs/protocol/guest.md, "Bulk data through a
// disk"): a virtio-blk device (serial "trybox-xfer") whose contents the host writes before a
// put and reads after a get, so that bulk bytes do not cross the control channel.
//
// trybox-init opens it once at boot and removes its /dev node, as for the other disks: no
// command can open it. Its capacity is 0 between transfers; the host announces a size just
// before a request that uses it. One transfer at a time: Lock() refuses a second.
// Thread-safe. In unit tests a regular file stands in for the device.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "util/fd.h"
#include "util/status.h"

namespace trybox::guest {

inline constexpr const char* kTransferDiskSerial = "trybox-xfer";
// The workspace disk (docs/protocol/guest.md, "The workspace disk"): an ext4 file system the
// host builds, mounted at /workspace for the VM's life. Same class, another serial.
inline constexpr const char* kWorkspaceDiskSerial = "trybox-ws";

// The name under /sys/block ("vdc") of the disk whose serial is `serial`; "" if none.
std::string DiskBySerial(const std::string& serial);

class TransferDisk {
 public:
  explicit TransferDisk(UniqueFd fd) : fd_(std::move(fd)) {}

  // Finds the block device whose serial is `serial`, opens it and unlinks its node.
  // kNotFound if the machine has none.
  static Result<std::unique_ptr<TransferDisk>> Find(const char* serial = kTransferDiskSerial);

  // Exclusive use for one transfer; an empty lock when another one is still under way after
  // a second. (The host runs one transfer at a time per VM and starts the next on the last
  // one's END, which the guest sends a moment before its handler lets go of the disk.)
  std::unique_lock<std::timed_mutex> Lock() {
    return std::unique_lock<std::timed_mutex>(mu_, std::chrono::seconds(1));
  }

  // Waits until the capacity is at least `bytes`. The host resized the disk before sending
  // the request, but the driver learns of it from a configuration interrupt handled on a
  // kernel worker, so the new size may lag by a moment; there is no event to wait on, so
  // this backs off from 0.1 ms to 10 ms, for at most 5 s.
  Status AwaitCapacity(uint64_t bytes);
  uint64_t Capacity() const;

  // Drops what the guest cached of the disk (the host wrote behind its back) and seeks to
  // the start. For a transfer's first byte.
  Status Rewind();

  // Raw fd for tar's stdin or stdout (dup'ed into the child) and for reads and writes.
  int fd_for_io() const { return fd_.get(); }

 private:
  std::timed_mutex mu_;
  UniqueFd fd_;
};

// A copy between the transfer disk and a file: 0 or the errno of each side's failure (the
// disk's: a read or write of it failed or it held fewer bytes than it should, EIO; the file's:
// its read or write failed, ENOSPC on a full root disk).
struct CopyErrors {
  int disk = 0;
  int file = 0;
  bool ok() const { return disk == 0 && file == 0; }
};

// A transfer's bytes move by direct I/O (O_DIRECT) on each side that allows it: the device
// copies them between the disk and guest memory, on the host and at its speed, where a
// buffered read or write is a copy by the guest's CPU (under TCG, emulated and about as slow
// as the channel). A file system without direct I/O (tmpfs) is read or written buffered. The
// descriptors' flags are as they were afterwards.

// The first `n` bytes of the disk (rewound first) into `file`, an empty file open for
// writing, from its start.
CopyErrors CopyDiskToFile(TransferDisk& disk, uint64_t n, int file);

// All of `file`, from its start to its end, onto the disk from its start, at most `max`
// bytes (past them: disk = ENOSPC). *bytes counts what was copied. The caller flushes the disk.
CopyErrors CopyFileToDisk(int file, TransferDisk& disk, uint64_t max, uint64_t* bytes);

// A request's "disk": {"bytes": S} for a disk the host formatted: S, or 0 when missing or not
// an unsigned integer.
uint64_t DiskBytesField(const nlohmann::json& request);

// Mounts the ext4 file system on the disk open as `disk_fd` at the existing directory `dir`
// (nosuid, nodev, noatime, no inode-table zeroing). The disk's node was removed at boot: a
// node of our own named `node` is made for mount(2) alone and removed again.
Status MountExt4(int disk_fd, const std::string& node, const std::string& dir);

}  // namespace trybox::guest
