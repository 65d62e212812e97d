// Workspace file systems: an ext4 image of a manifest, made on the host for the guest to
// mount at /workspace, and the guest's image read back as a tar stream for ExtractTar
// (workspace/tar.h), which stays the one place that writes into the host's tree.
//
// Both sides use libext2fs and never mount anything. Writing trusts its input (the user's
// tree, through a manifest the host built). Reading does not: the image comes back from a
// guest whose root may have written any bytes onto the block device, so a corrupt image is
// an error (a Status naming the path and the reason), never a crash, and trybox-ext4tar
// runs the reader in a sandboxed process of its own. Plain functions with no shared state
// beyond libext2fs's error table (registered once); not thread-safe per call.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"
#include "workspace/manifest.h"

namespace trybox::workspace {

// Sizing for a workspace image.
struct Ext4Geometry {
  uint64_t bytes = 0;   // the image file (sparse), a multiple of 4 KiB
  uint64_t inodes = 0;  // mke2fs -N
};

// The geometry for a workspace quota (bytes of file content, entries): room for the quota
// with a quarter to spare, each entry's last partial block, the inode tables and the journal.
// At least 64 MiB.
Ext4Geometry Ext4GeometryFor(uint64_t quota_bytes, uint64_t quota_entries);

// Replaces the contents of the open regular file `fd` (read-write; it stays the caller's)
// with a sparse image of geo.bytes holding an ext4 file system (made by the e2fsprogs binary
// `mke2fs`, found in $PATH) with exactly the entries of `m`, read from `root`: regular files
// (content, permission bits m.mode & 0777, the host file's mtime) and symlinks (target,
// mtime), their parent directories created 0755. Everything is owned by root:root. Each file
// is opened O_NOFOLLOW; a file whose size no longer matches the manifest is an error naming
// it (as WriteTar). On failure the file is cut to 0 bytes.
Status WriteExt4ImageToFd(const std::string& root, const Manifest& m, int fd,
                          const Ext4Geometry& geo);
// The same into a new file `image` (which must not exist); on failure it is removed.
Status WriteExt4Image(const std::string& root, const Manifest& m, const std::string& image,
                      const Ext4Geometry& geo);

// Limits for reading an untrusted image. 0: none.
struct Ext4ReadLimits {
  uint64_t max_entries = 0;  // names in directories (lost+found at the root excepted)
  uint64_t max_depth = 256;  // path components
  uint64_t max_bytes = 0;    // regular file content, each file at its declared size
};

// What a read left out of the tar.
struct Ext4ReadReport {
  uint64_t entries = 0;          // entries written to the tar
  uint64_t sockets = 0;          // sockets, which a tar cannot hold
  std::vector<Skipped> skipped;  // the first kMaxListedSockets of them, by path
  static constexpr size_t kMaxListedSockets = 1000;
};

// Reads the ext4 file system in the open file `image_fd` (read-only; the fd stays open and
// the caller's) and writes its whole tree to `sink` as a pax tar of the shape WriteTar
// writes (relative names as raw bytes, no "./"): directories, regular files (content, mode
// & 07777, mtime), symlinks, and character devices, block devices and fifos with no
// content, so that ExtractTar skips and names them. Sockets are left out and counted in
// `report` (if given). Hard links are written as a regular file each time. An empty
// lost+found at the root is left out.
//
// The image is never trusted: a directory met twice (a cycle, or a directory hard link), a
// path deeper than max_depth, more than max_entries names or max_bytes of content, an inode
// number out of range, a name holding '/' or NUL, a read that fails or comes back short, and
// a journal that still needs recovery (the guest did not unmount) are all errors naming the
// path and the reason. Bounded work: directory blocks read are capped at the image's block
// count, so a forged block map cannot make a directory endless.
Status WriteTarFromExt4(int image_fd, const Ext4ReadLimits& limits,
                        const std::function<Status(std::string_view)>& sink,
                        Ext4ReadReport* report = nullptr);

}  // namespace trybox::workspace
