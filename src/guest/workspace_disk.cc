#include "guest/workspace_disk.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace trybox::guest {
namespace {

using Json = nlohmann::json;

Json Fail(const char* error, const std::string& message) {
  return {{"ok", false}, {"error", error}, {"message", message}};
}

// The device number of the disk, or 0.
dev_t DiskDevice(const TransferDisk& disk) {
  struct stat st;
  if (::fstat(disk.fd_for_io(), &st) != 0 || !S_ISBLK(st.st_mode)) return 0;
  return st.st_rdev;
}

// True if the file system at the mount point is the disk's.
bool MountedFrom(const std::string& dir, const TransferDisk& disk) {
  struct stat st;
  dev_t dev = DiskDevice(disk);
  return dev != 0 && ::stat(dir.c_str(), &st) == 0 && st.st_dev == dev;
}

// The disk for one request, or an empty lock once the stream was ended saying why not.
std::unique_lock<std::timed_mutex> TakeDisk(channel::Stream& stream, TransferDisk* disk) {
  if (disk == nullptr) {
    (void)stream.End(Fail("no_workspace_disk", "this guest has no workspace disk"));
    return {};
  }
  auto held = disk->Lock();
  if (!held) (void)stream.End(Fail("disk_busy", "another request uses the workspace disk"));
  return held;
}

}  // namespace

void ServeWorkspaceMount(channel::Stream& stream, const Json& request, TransferDisk* disk) {
  const uint64_t bytes = DiskBytesField(request);
  if (bytes == 0) {
    (void)stream.End(Fail("bad_request", "'disk.bytes' must be a positive integer"));
    return;
  }
  auto held = TakeDisk(stream, disk);
  if (!held) return;
  const std::string dir = kWorkspaceMountPoint;
  if (MountedFrom(dir, *disk)) {
    (void)stream.End(Fail("already_mounted", dir + " is the workspace disk already"));
    return;
  }
  Status st = disk->AwaitCapacity(bytes);
  if (st.ok()) st = disk->Rewind();  // the host wrote the file system behind our back
  if (st.ok() && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    st = ErrnoError("mkdir " + dir);
  }
  if (st.ok()) st = MountExt4(disk->fd_for_io(), "/dev/.trybox-ws", dir);
  if (!st.ok()) {
    (void)stream.End(Fail("io", st.message()));
    return;
  }
  // mke2fs's lost+found is not the project's.
  ::rmdir((dir + "/lost+found").c_str());
  (void)stream.End({{"ok", true}});
}

void ServeWorkspaceFreeze(channel::Stream& stream, TransferDisk* disk) {
  auto held = TakeDisk(stream, disk);
  if (!held) return;
  const std::string dir = kWorkspaceMountPoint;
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || !MountedFrom(dir, *disk)) {
    (void)stream.End(Fail("not_mounted", dir + " is not the workspace disk"));
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  // FIFREEZE writes back every dirty page and checkpoints the journal first: the host then
  // reads a consistent file system without replaying anything.
  if (::ioctl(fd.get(), FIFREEZE, 0) != 0) {
    (void)stream.End(Fail("io", ErrnoError("freeze " + dir).message()));
    return;
  }
  Status sent = stream.SendEvent({{"type", "frozen"}});
  while (sent.ok()) {
    auto m = stream.Next(start + kMaxFrozen);
    if (!m.ok() || m->kind != channel::Stream::Message::Kind::kData) break;
  }
  Status thawed = Status::Ok();
  if (::ioctl(fd.get(), FITHAW, 0) != 0) thawed = ErrnoError("thaw " + dir);
  const auto frozen_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  if (!stream.finished()) {
    (void)stream.End(thawed.ok() ? Json{{"ok", true}, {"frozen_ms", frozen_ms}}
                                 : Fail("io", thawed.message()));
  }
}

}  // namespace trybox::guest
