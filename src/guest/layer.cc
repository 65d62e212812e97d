#include "guest/layer.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "util/fd.h"

namespace trybox::guest {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kBlock = 4096;

Json Fail(const char* error, const std::string& message) {
  return {{"ok", false}, {"error", error}, {"message", message}};
}

Json FailStatus(const Status& st) {
  return Fail(st.code() == Code::kResourceExhausted ? "no_space" : "io", st.message());
}

std::vector<std::string> Entries(const std::string& dir, Status* st) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    *st = ErrnoError("open " + dir);
    return out;
  }
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(std::move(n));
  }
  ::closedir(d);
  return out;
}

uint64_t RoundUp(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// `root`: the tree's own root, which may be reached through a symlink (the upper dir is
// /proc/self/fd/N, a link to it); below it nothing is followed.
Status Measure(const std::string& path, TreeUsage* u, bool root = false) {
  struct stat st;
  if ((root ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st)) != 0) {
    return ErrnoError("stat " + path);
  }
  u->inodes += 1;
  if (S_ISREG(st.st_mode)) u->bytes += RoundUp(static_cast<uint64_t>(st.st_size));
  if (S_ISLNK(st.st_mode) && st.st_size >= 60) u->bytes += kBlock;
  if (!S_ISDIR(st.st_mode)) return Status::Ok();
  Status status;
  std::vector<std::string> entries = Entries(path, &status);
  // ext4's directory entries (8 bytes and the name, padded to 4), twice over for the slack
  // of half-full blocks and the hash index of a large directory; one block at least.
  uint64_t names = 0;
  for (const std::string& n : entries) names += 8 + (n.size() + 3) / 4 * 4;
  u->bytes += std::max(kBlock, RoundUp(2 * names));
  for (const std::string& n : entries) RETURN_IF_ERROR(Measure(path + "/" + n, u));
  return status;
}

Status CopyXattrs(const std::string& from, const std::string& to) {
  ssize_t n = ::llistxattr(from.c_str(), nullptr, 0);
  if (n < 0) return errno == ENOTSUP ? Status::Ok() : ErrnoError("list xattrs of " + from);
  std::string names(static_cast<size_t>(n), '\0');
  n = ::llistxattr(from.c_str(), names.data(), names.size());
  if (n < 0) return ErrnoError("list xattrs of " + from);
  for (size_t i = 0; i < static_cast<size_t>(n);) {
    std::string name(names.c_str() + i);
    i += name.size() + 1;
    ssize_t len = ::lgetxattr(from.c_str(), name.c_str(), nullptr, 0);
    if (len < 0) return ErrnoError("read xattr " + name + " of " + from);
    std::string value(static_cast<size_t>(len), '\0');
    len = ::lgetxattr(from.c_str(), name.c_str(), value.data(), value.size());
    if (len < 0) return ErrnoError("read xattr " + name + " of " + from);
    if (::lsetxattr(to.c_str(), name.c_str(), value.data(), static_cast<size_t>(len), 0) != 0) {
      return ErrnoError("set xattr " + name + " on " + to);
    }
  }
  return Status::Ok();
}

// Owner, xattrs, mode (after the owner: chown clears set-id bits), then times.
Status CopyAttributes(const std::string& from, const std::string& to, const struct stat& st) {
  if (::lchown(to.c_str(), st.st_uid, st.st_gid) != 0) return ErrnoError("chown " + to);
  RETURN_IF_ERROR(CopyXattrs(from, to));
  if (!S_ISLNK(st.st_mode) && ::chmod(to.c_str(), st.st_mode & 07777) != 0) {
    return ErrnoError("chmod " + to);
  }
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  if (::utimensat(AT_FDCWD, to.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoError("set the times of " + to);
  }
  return Status::Ok();
}

Status CopyContent(const std::string& from, const std::string& to, uint64_t size) {
  ASSIGN_OR_RETURN(UniqueFd in, OpenFile(from, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  ASSIGN_OR_RETURN(UniqueFd out, OpenFile(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  uint64_t done = 0;
  while (done < size) {
    ssize_t n = ::sendfile(out.get(), in.get(), nullptr, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("copy " + from);
    if (n == 0) break;  // it shrank while we copied: what was there is what is kept
    done += static_cast<uint64_t>(n);
  }
  return out.Close();
}

class Copier {
 public:
  Copier(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}

  Status Tree(const std::string& rel) {
    Status status;
    for (const std::string& n : Entries(from_ + rel, &status))
      RETURN_IF_ERROR(Entry(rel + "/" + n));
    return status;
  }

  Status Entry(const std::string& rel) {
    const std::string from = from_ + rel, to = to_ + rel;
    struct stat st;
    if (::lstat(from.c_str(), &st) != 0) return ErrnoError("stat " + from);
    stats_.entries += 1;
    if (S_ISDIR(st.st_mode)) {
      if (::mkdir(to.c_str(), 0700) != 0) return ErrnoError("mkdir " + to);
      RETURN_IF_ERROR(Tree(rel));
    } else if (S_ISREG(st.st_mode)) {
      if (st.st_nlink > 1) {
        auto [it, first] = links_.emplace(std::make_pair(st.st_dev, st.st_ino), rel);
        if (!first) {
          if (::link((to_ + it->second).c_str(), to.c_str()) != 0) return ErrnoError("link " + to);
          return Status::Ok();
        }
      }
      RETURN_IF_ERROR(CopyContent(from, to, static_cast<uint64_t>(st.st_size)));
      stats_.bytes += static_cast<uint64_t>(st.st_size);
    } else if (S_ISLNK(st.st_mode)) {
      std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
      ssize_t n = ::readlink(from.c_str(), target.data(), target.size());
      if (n < 0) return ErrnoError("readlink " + from);
      target.resize(static_cast<size_t>(n));
      if (::symlink(target.c_str(), to.c_str()) != 0) return ErrnoError("symlink " + to);
    } else {
      // Whiteouts (character devices 0:0), other device nodes, fifos and sockets.
      if (::mknod(to.c_str(), st.st_mode, st.st_rdev) != 0) return ErrnoError("mknod " + to);
    }
    return CopyAttributes(from, to, st);
  }

  const CopyStats& stats() const { return stats_; }

 private:
  const std::string from_, to_;
  std::map<std::pair<dev_t, ino_t>, std::string> links_;
  CopyStats stats_;
};

// Mounts the transfer disk's ext4 at a fresh directory; unmounts and removes it on exit.
class DiskMount {
 public:
  ~DiskMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }

  Status Mount(int disk_fd) {
    char dir[] = "/run/trybox-layer-XXXXXX";
    if (::mkdtemp(dir) == nullptr) return ErrnoError("make a mount point");
    dir_ = dir;
    RETURN_IF_ERROR(MountExt4(disk_fd, "/dev/.trybox-layer", dir_));
    mounted_ = true;
    return Status::Ok();
  }

  Status Unmount() {
    if (::umount2(dir_.c_str(), 0) != 0) return ErrnoError("unmount the layer disk");
    mounted_ = false;
    return Status::Ok();
  }

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

std::string FdPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

}  // namespace

Result<TreeUsage> MeasureTree(const std::string& dir) {
  TreeUsage u;
  RETURN_IF_ERROR(Measure(dir, &u, /*root=*/true));
  return u;
}

Result<CopyStats> CopyTree(const std::string& from, const std::string& to) {
  Copier c(from, to);
  RETURN_IF_ERROR(c.Tree(""));
  // The root's own attributes: "/." names the directory itself even where `from` is a
  // link to it (/proc/self/fd/N), which the l* calls would otherwise read.
  const std::string self = from + "/.";
  struct stat st;
  if (::lstat(self.c_str(), &st) != 0) return ErrnoError("stat " + from);
  RETURN_IF_ERROR(CopyAttributes(self, to, st));
  return c.stats();
}

void ServeLayerSize(channel::Stream& stream, int upper_fd) {
  if (upper_fd < 0) {
    (void)stream.End(Fail("no_upper", "this guest kept no upper dir"));
    return;
  }
  auto u = MeasureTree(FdPath(upper_fd));
  if (!u.ok()) {
    (void)stream.End(FailStatus(u.status()));
    return;
  }
  (void)stream.End({{"ok", true}, {"bytes", u->bytes}, {"inodes", u->inodes}});
}

void ServeLayerCapture(channel::Stream& stream, const Json& request, int upper_fd,
                       TransferDisk* disk) {
  const uint64_t bytes = DiskBytesField(request);
  if (bytes == 0) {
    (void)stream.End(Fail("bad_request", "'disk.bytes' must be a positive integer"));
    return;
  }
  if (upper_fd < 0 || disk == nullptr) {
    (void)stream.End(Fail("no_transfer_disk", "this guest has no transfer disk or upper dir"));
    return;
  }
  auto held = disk->Lock();
  if (!held) {
    (void)stream.End(Fail("disk_busy", "another transfer uses the disk"));
    return;
  }
  Status st = disk->AwaitCapacity(bytes);
  if (st.ok()) st = disk->Rewind();  // the host formatted it behind our back
  if (!st.ok()) {
    (void)stream.End(Fail("io", st.message()));
    return;
  }
  DiskMount mount;
  if (st = mount.Mount(disk->fd_for_io()); !st.ok()) {
    (void)stream.End(Fail("io", st.message()));
    return;
  }
  // The empty filesystem's lost+found is not part of the VM's writes.
  ::rmdir((mount.dir() + "/lost+found").c_str());
  auto copied = CopyTree(FdPath(upper_fd), mount.dir());
  if (!copied.ok()) {
    Status failed = copied.status();
    struct statvfs fs;
    if (failed.code() == Code::kResourceExhausted && ::statvfs(mount.dir().c_str(), &fs) == 0) {
      // Which of the two ran out: the host sized both from the measurement.
      failed = failed.Annotate("the layer disk had " + std::to_string(fs.f_bfree) + " of " +
                               std::to_string(fs.f_blocks) + " blocks and " +
                               std::to_string(fs.f_ffree) + " of " + std::to_string(fs.f_files) +
                               " inodes free");
    }
    (void)stream.End(FailStatus(failed));
    return;
  }
  if (st = mount.Unmount(); !st.ok()) {
    (void)stream.End(Fail("io", st.message()));
    return;
  }
  if (::fsync(disk->fd_for_io()) != 0 || ::ioctl(disk->fd_for_io(), BLKFLSBUF, 0) != 0) {
    (void)stream.End(Fail("io", ErrnoError("flush the layer disk").message()));
    return;
  }
  (void)stream.End({{"ok", true}, {"entries", copied->entries}, {"bytes", copied->bytes}});
}

}  // namespace trybox::guest
