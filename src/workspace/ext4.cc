#include "workspace/ext4.h"

#include <archive.h>
#include <archive_entry.h>
#include <ext2fs/ext2fs.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <ctime>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "util/fd.h"
#include "util/process.h"
#include "util/utf8.h"
#include "workspace/archive_ptr.h"

// com_err's header has no extern "C" of its own (ext2fs.h wraps it when it comes first).
extern "C" {
#include <et/com_err.h>
}

namespace trybox::workspace {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;
constexpr uint64_t kBlockSize = 4096;
constexpr size_t kChunk = 1 << 20;  // bytes per read and write of file content

void RegisterErrorTable() {
  static std::once_flag once;
  std::call_once(once, [] { initialize_ext2_error_table(); });
}

std::string ErrorText(errcode_t code) { return error_message(code); }

// A libext2fs failure while building an image: running out of room is the quota's business.
Status WriteError(const std::string& what, errcode_t code) {
  std::string msg = what + ": " + ErrorText(code);
  if (code == ENOSPC || code == EXT2_ET_BLOCK_ALLOC_FAIL || code == EXT2_ET_INODE_ALLOC_FAIL ||
      code == EXT2_ET_DIR_NO_SPACE || code == EXT2_ET_TOOSMALL) {
    return ResourceExhausted(msg);
  }
  return Internal(msg);
}

// A libext2fs failure while reading a guest's image: the image is what is wrong.
Status CorruptError(const std::string& path, const std::string& reason) {
  return InvalidArgument("workspace image: " + (path.empty() ? "" : OneLine(path) + ": ") + reason);
}
Status ReadError(const std::string& path, const std::string& what, errcode_t code) {
  return CorruptError(path, what + ": " + ErrorText(code));
}

struct FsCloser {
  void operator()(ext2_filsys fs) const { ext2fs_free(fs); }  // no flush: a failed write
};
using FsPtr = std::unique_ptr<std::remove_pointer_t<ext2_filsys>, FsCloser>;

struct FileCloser {
  void operator()(ext2_file_t f) const { ext2fs_file_close(f); }
};
using FilePtr = std::unique_ptr<std::remove_pointer_t<ext2_file_t>, FileCloser>;

// An inode as this code reads and writes it: the large layout, zeroed past what the file
// system holds.
struct LargeInode {
  ext2_inode_large in{};
  ext2_inode* small() { return reinterpret_cast<ext2_inode*>(&in); }
};

bool HasExtraTime(const ext2_filsys fs, const ext2_inode_large& in) {
  return EXT2_INODE_SIZE(fs->super) > EXT2_GOOD_OLD_INODE_SIZE &&
         in.i_extra_isize >= offsetof(ext2_inode_large, i_mtime_extra) + sizeof(in.i_mtime_extra) -
                                 EXT2_GOOD_OLD_INODE_SIZE;
}

// ext4's encoding: the low 32 bits signed in i_mtime, two more epoch bits and the
// nanoseconds in i_mtime_extra (the kernel's ext4_encode_extra_time).
void SetMtime(ext2_inode_large* in, const timespec& t) {
  in->i_mtime = static_cast<uint32_t>(t.tv_sec);
  int64_t epoch = (static_cast<int64_t>(t.tv_sec) - static_cast<int32_t>(t.tv_sec)) >> 32;
  in->i_mtime_extra = (static_cast<uint32_t>(t.tv_nsec) << EXT4_EPOCH_BITS) |
                      (static_cast<uint32_t>(epoch) & EXT4_EPOCH_MASK);
}

timespec Mtime(const ext2_filsys fs, const ext2_inode_large& in) {
  timespec t{static_cast<int32_t>(in.i_mtime), 0};
  if (HasExtraTime(fs, in)) {
    t.tv_sec += static_cast<int64_t>(in.i_mtime_extra & EXT4_EPOCH_MASK) << 32;
    uint32_t nsec = in.i_mtime_extra >> EXT4_EPOCH_BITS;
    if (nsec < 1000000000) t.tv_nsec = nsec;
  }
  return t;
}

// ---- Writing an image ----------------------------------------------------------------

Status PwriteFull(int fd, const char* data, size_t len, uint64_t at) {
  while (len > 0) {
    ssize_t n = ::pwrite(fd, data, len, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoError("write the workspace image");
    data += n;
    len -= static_cast<size_t>(n);
    at += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// Fills a freshly made file system with the entries of a manifest.
class ImageWriter {
 public:
  // `image_fd`: the file `fs` is open on, for writing file content straight into the
  // blocks libext2fs allocated.
  ImageWriter(ext2_filsys fs, int image_fd, const std::string& root)
      : fs_(fs), image_fd_(image_fd), root_(root), buf_(kChunk), now_(::time(nullptr)) {
    dirs_[""] = EXT2_ROOT_INO;
  }
  Status Add(const Entry& e);

 private:
  // The directory holding `path`, made (0755) as needed; `name` gets the last component.
  Result<ext2_ino_t> Parent(const std::string& path, std::string* name);
  Result<ext2_ino_t> MakeDir(const std::string& path);
  Status AddFile(const Entry& e, ext2_ino_t dir, const std::string& name);
  Status AddSymlink(const Entry& e, ext2_ino_t dir, const std::string& name);
  // ext2fs_link, growing the directory by a block when it is full.
  errcode_t Link(ext2_ino_t dir, const std::string& name, ext2_ino_t ino, int type);
  // Allocates the blocks of `e`'s content and copies `src` (the host file `full`) into them.
  Status WriteContent(const Entry& e, const std::string& full, int src, ext2_ino_t ino,
                      ext2_inode_large* in);
  // Copies `len` bytes of `src` at `from` into the image at `to`.
  Status CopyRange(int src, const std::string& full, uint64_t from, uint64_t to, uint64_t len);

  ext2_filsys fs_;
  int image_fd_;
  bool copy_file_range_ = true;  // until the kernel refuses it for this pair of files
  const std::string& root_;
  std::vector<char> buf_;
  time_t now_;
  std::unordered_map<std::string, ext2_ino_t> dirs_;  // made so far, by path ("" the root)
};

errcode_t ImageWriter::Link(ext2_ino_t dir, const std::string& name, ext2_ino_t ino, int type) {
  errcode_t rc = ext2fs_link(fs_, dir, name.c_str(), ino, type);
  if (rc != EXT2_ET_DIR_NO_SPACE) return rc;
  rc = ext2fs_expand_dir(fs_, dir);
  return rc ? rc : ext2fs_link(fs_, dir, name.c_str(), ino, type);
}

Result<ext2_ino_t> ImageWriter::Parent(const std::string& path, std::string* name) {
  size_t slash = path.rfind('/');
  *name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name->empty() || *name == "." || *name == "..") {
    return InvalidArgument("a manifest path with an empty, '.' or '..' component: " +
                           JsonSafe(path));
  }
  return MakeDir(slash == std::string::npos ? "" : path.substr(0, slash));
}

Result<ext2_ino_t> ImageWriter::MakeDir(const std::string& path) {
  if (auto it = dirs_.find(path); it != dirs_.end()) return it->second;
  std::string name;
  ASSIGN_OR_RETURN(ext2_ino_t parent, Parent(path, &name));
  ext2_ino_t ino;
  errcode_t rc = ext2fs_new_inode(fs_, parent, LINUX_S_IFDIR | 0755, nullptr, &ino);
  if (!rc) rc = ext2fs_mkdir(fs_, parent, ino, name.c_str());
  // ext2fs_mkdir links without growing the parent; it undoes its allocations on failure.
  if (rc == EXT2_ET_DIR_NO_SPACE) {
    rc = ext2fs_expand_dir(fs_, parent);
    if (!rc) rc = ext2fs_mkdir(fs_, parent, ino, name.c_str());
  }
  if (rc) return WriteError("make directory " + JsonSafe(path), rc);
  dirs_[path] = ino;
  return ino;
}

Status ImageWriter::Add(const Entry& e) {
  std::string name;
  ASSIGN_OR_RETURN(ext2_ino_t dir, Parent(e.path, &name));
  return e.symlink ? AddSymlink(e, dir, name) : AddFile(e, dir, name);
}

Status ImageWriter::AddFile(const Entry& e, ext2_ino_t dir, const std::string& name) {
  const std::string full = root_ + "/" + e.path;
  UniqueFd fd(::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return ErrnoError("open " + JsonSafe(full));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("stat " + JsonSafe(full));
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != e.size) {
    return FailedPrecondition(JsonSafe(full) +
                              " changed while being copied into the VM; try again");
  }
  const std::string what = "write " + JsonSafe(e.path) + " into the workspace image";
  ext2_ino_t ino;
  errcode_t rc = ext2fs_new_inode(fs_, dir, LINUX_S_IFREG | 0644, nullptr, &ino);
  if (rc) return WriteError(what, rc);

  // Written in full here rather than by ext2fs_write_new_inode, which zeroes the extra
  // fields and so the mtime's nanoseconds.
  std::vector<char> raw(std::max<size_t>(EXT2_INODE_SIZE(fs_->super), sizeof(ext2_inode_large)));
  auto* in = reinterpret_cast<ext2_inode_large*>(raw.data());
  // Set-uid and set-gid bits are dropped: in the guest the file belongs to root.
  in->i_mode = LINUX_S_IFREG | (e.mode & 0777);
  in->i_links_count = 1;
  in->i_atime = in->i_ctime = static_cast<uint32_t>(now_);
  if (EXT2_INODE_SIZE(fs_->super) > EXT2_GOOD_OLD_INODE_SIZE) {
    in->i_extra_isize = sizeof(ext2_inode_large) - EXT2_GOOD_OLD_INODE_SIZE;
    in->i_crtime = static_cast<uint32_t>(now_);
  }
  SetMtime(in, st.st_mtim);
  ext2_extent_handle_t handle;  // sets up the empty extent tree in i_block
  rc = ext2fs_extent_open2(fs_, ino, reinterpret_cast<ext2_inode*>(in), &handle);
  if (rc) return WriteError(what, rc);
  ext2fs_extent_free(handle);
  rc = ext2fs_write_inode_full(fs_, ino, reinterpret_cast<ext2_inode*>(in),
                               EXT2_INODE_SIZE(fs_->super));
  if (rc) return WriteError(what, rc);
  ext2fs_inode_alloc_stats2(fs_, ino, +1, 0);
  rc = Link(dir, name, ino, EXT2_FT_REG_FILE);
  if (rc) return WriteError(what, rc);
  if (e.size == 0) return Status::Ok();
  return WriteContent(e, full, fd.get(), ino, in);
}

// ext2fs_file_write allocates and writes block by block (about 16 us a block here: 0.8 s
// for 200 MiB). Instead ext2fs_fallocate allocates the whole file as extents, and the
// content is copied into their blocks with copy_file_range (or pread/pwrite), several
// times faster.
Status ImageWriter::WriteContent(const Entry& e, const std::string& full, int src, ext2_ino_t ino,
                                 ext2_inode_large* in) {
  const std::string what = "write " + JsonSafe(e.path) + " into the workspace image";
  const uint64_t bs = fs_->blocksize;
  const uint64_t size = e.size;
  auto* small = reinterpret_cast<ext2_inode*>(in);
  errcode_t rc = ext2fs_inode_size_set(fs_, small, size);
  if (!rc) {
    rc = ext2fs_fallocate(fs_, EXT2_FALLOCATE_FORCE_INIT | EXT2_FALLOCATE_INIT_BEYOND_EOF, ino,
                          small, ~0ULL, 0, (size + bs - 1) / bs);
  }
  if (!rc) rc = ext2fs_write_inode_full(fs_, ino, small, EXT2_INODE_SIZE(fs_->super));
  if (rc) return WriteError(what, rc);
  ext2_extent_handle_t raw;
  rc = ext2fs_extent_open2(fs_, ino, small, &raw);
  if (rc) return WriteError(what, rc);
  std::unique_ptr<std::remove_pointer_t<ext2_extent_handle_t>, void (*)(ext2_extent_handle_t)>
      handle(raw, ext2fs_extent_free);
  uint64_t copied = 0;
  ext2fs_extent ex;
  for (rc = ext2fs_extent_get(handle.get(), EXT2_EXTENT_ROOT, &ex); !rc;
       rc = ext2fs_extent_get(handle.get(), EXT2_EXTENT_NEXT, &ex)) {
    if (!(ex.e_flags & EXT2_EXTENT_FLAGS_LEAF) || (ex.e_flags & EXT2_EXTENT_FLAGS_SECOND_VISIT)) {
      continue;
    }
    uint64_t from = ex.e_lblk * bs;
    if (from >= size) continue;
    uint64_t len = std::min<uint64_t>(ex.e_len * bs, size - from);
    RETURN_IF_ERROR(CopyRange(src, full, from, ex.e_pblk * bs, len));
    // The last block's tail: zeros, whatever a freed block held before.
    if (len % bs != 0) {
      std::string zeros(bs - len % bs, '\0');
      RETURN_IF_ERROR(PwriteFull(image_fd_, zeros.data(), zeros.size(), ex.e_pblk * bs + len));
    }
    copied += len;
  }
  if (rc != EXT2_ET_EXTENT_NO_NEXT) return WriteError(what, rc);
  if (copied != size) return Internal(what + ": the allocated blocks do not cover the file");
  return Status::Ok();
}

Status ImageWriter::CopyRange(int src, const std::string& full, uint64_t from, uint64_t to,
                              uint64_t len) {
  while (len > 0) {
    ssize_t n;
    if (copy_file_range_) {
      loff_t in = static_cast<loff_t>(from), out = static_cast<loff_t>(to);
      n = ::copy_file_range(src, &in, image_fd_, &out, len, 0);
      if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS ||
                    errno == EPERM)) {
        copy_file_range_ = false;  // across file systems, say: copy through user space
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("copy " + JsonSafe(full) + " into the workspace image");
    } else {
      n = ::pread(src, buf_.data(), std::min<uint64_t>(len, buf_.size()), static_cast<off_t>(from));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("read " + JsonSafe(full));
      if (n > 0) {
        RETURN_IF_ERROR(PwriteFull(image_fd_, buf_.data(), static_cast<size_t>(n), to));
      }
    }
    if (n == 0) {
      return FailedPrecondition(JsonSafe(full) + " shrank while being copied into the VM");
    }
    from += static_cast<uint64_t>(n);
    to += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status ImageWriter::AddSymlink(const Entry& e, ext2_ino_t dir, const std::string& name) {
  const std::string full = root_ + "/" + e.path;
  struct stat st;
  if (::lstat(full.c_str(), &st) != 0) {
    return ErrnoError(JsonSafe(full) + " vanished while being copied");
  }
  const std::string what = "write " + JsonSafe(e.path) + " into the workspace image";
  ext2_ino_t ino;
  errcode_t rc = ext2fs_new_inode(fs_, dir, LINUX_S_IFLNK | 0777, nullptr, &ino);
  if (rc) return WriteError(what, rc);
  rc = ext2fs_symlink(fs_, dir, ino, name.c_str(), e.target.c_str());
  // Like ext2fs_mkdir: no room in the directory is left to the caller.
  if (rc == EXT2_ET_DIR_NO_SPACE) {
    rc = ext2fs_expand_dir(fs_, dir);
    if (!rc) rc = ext2fs_symlink(fs_, dir, ino, name.c_str(), e.target.c_str());
  }
  if (rc) return WriteError(what, rc);
  LargeInode in;
  rc = ext2fs_read_inode_full(fs_, ino, in.small(), sizeof(in.in));
  if (rc) return WriteError(what, rc);
  SetMtime(&in.in, st.st_mtim);
  if (!HasExtraTime(fs_, in.in)) in.in.i_mtime_extra = 0;
  rc = ext2fs_write_inode_full(fs_, ino, in.small(), sizeof(in.in));
  return rc ? WriteError(what, rc) : Status::Ok();
}

// ---- Reading an image ----------------------------------------------------------------

// A pax tar written to a sink, as WriteTar writes it.
class TarOut {
 public:
  explicit TarOut(const std::function<Status(std::string_view)>& sink)
      : a_(archive_write_new()), sink_(&sink) {}

  Status Open() {
    archive_write_set_format_pax_restricted(a_.get());
    // Names are bytes (tar.cc says why).
    if (archive_write_set_format_option(a_.get(), "pax", "hdrcharset", "BINARY") != ARCHIVE_OK) {
      return Fail("tar");
    }
    archive_write_set_bytes_per_block(a_.get(), 0);
    auto write_cb = [](archive*, void* ud, const void* buf, size_t len) -> la_ssize_t {
      auto* self = static_cast<TarOut*>(ud);
      self->st_ = (*self->sink_)(std::string_view(static_cast<const char*>(buf), len));
      return self->st_.ok() ? static_cast<la_ssize_t>(len) : -1;
    };
    if (archive_write_open(a_.get(), this, nullptr, write_cb, nullptr) != ARCHIVE_OK) {
      return Fail("tar");
    }
    return Status::Ok();
  }
  Status Header(archive_entry* e, const std::string& path) {
    return archive_write_header(a_.get(), e) == ARCHIVE_OK ? Status::Ok() : Fail(path);
  }
  Status Data(const void* buf, size_t len, const std::string& path) {
    return archive_write_data(a_.get(), buf, len) == static_cast<la_ssize_t>(len) ? Status::Ok()
                                                                                  : Fail(path);
  }
  Status Close() {
    return archive_write_close(a_.get()) == ARCHIVE_OK ? Status::Ok() : Fail("tar");
  }

 private:
  Status Fail(const std::string& what) {
    if (!st_.ok()) return st_;
    const char* m = archive_error_string(a_.get());
    return Internal("tar " + OneLine(what) + ": " + (m ? m : "unknown libarchive error"));
  }
  ArchivePtr a_;
  const std::function<Status(std::string_view)>* sink_;
  Status st_;
};

// Walks a guest's file system depth first, names in byte order, into a tar.
class TreeReader {
 public:
  TreeReader(ext2_filsys fs, const Ext4ReadLimits& limits, TarOut* tar, Ext4ReadReport* report)
      : fs_(fs),
        limits_(limits),
        tar_(tar),
        report_(report),
        max_dir_blocks_(ext2fs_blocks_count(fs->super)),
        buf_(kChunk) {}

  Status Run() {
    dirs_.insert(EXT2_ROOT_INO);
    return Walk(EXT2_ROOT_INO, "", 0);
  }

 private:
  struct Name {
    std::string name;
    ext2_ino_t ino;
  };
  Result<std::vector<Name>> List(ext2_ino_t dir, const std::string& path);
  Result<bool> Empty(ext2_ino_t dir, const std::string& path);
  Status Walk(ext2_ino_t dir, const std::string& path, uint64_t depth);
  Status Emit(const std::string& path, ext2_ino_t ino, uint64_t depth, bool lost_found);
  Status CountEntry(const std::string& path);
  Result<std::string> InlineData(const std::string& path, ext2_ino_t ino, LargeInode& in);
  Status WriteContent(const std::string& path, ext2_ino_t ino, LargeInode& in, uint64_t size);
  Result<std::string> LinkTarget(const std::string& path, ext2_ino_t ino, LargeInode& in);

  ext2_filsys fs_;
  const Ext4ReadLimits& limits_;
  TarOut* tar_;
  Ext4ReadReport* report_;
  std::unordered_set<ext2_ino_t> dirs_;  // every directory met, so that none is met twice
  uint64_t entries_ = 0;
  uint64_t bytes_ = 0;
  // A forged block map can list one block endlessly: a directory cannot span more blocks
  // than the file system has, nor can all of them together.
  uint64_t dir_blocks_ = 0;
  const uint64_t max_dir_blocks_;
  std::vector<char> buf_;
};

Status TreeReader::CountEntry(const std::string& path) {
  if (limits_.max_entries && ++entries_ > limits_.max_entries) {
    return ResourceExhausted("workspace image: " + OneLine(path) + ": more than " +
                             std::to_string(limits_.max_entries) + " entries");
  }
  return Status::Ok();
}

Result<std::vector<TreeReader::Name>> TreeReader::List(ext2_ino_t dir, const std::string& path) {
  struct Listing {
    TreeReader* self;
    const std::string* path;
    bool root;
    std::vector<Name> names;
    Status st;
  } l{this, &path, dir == EXT2_ROOT_INO, {}, Status::Ok()};
  auto visit = [](ext2_ino_t, int, ext2_dir_entry* d, int offset, int, char*, void* priv) -> int {
    auto* l = static_cast<Listing*>(priv);
    // With DIRENT_FLAG_INCLUDE_EMPTY every block starts with an entry at offset 0.
    if (offset == 0 && ++l->self->dir_blocks_ > l->self->max_dir_blocks_) {
      l->st = CorruptError(*l->path, "directories span more blocks than the file system has");
      return DIRENT_ABORT;
    }
    if (d->inode == 0) return 0;
    std::string name(d->name, ext2fs_dirent_name_len(d));
    if (name == "." || name == "..") return 0;
    std::string shown = l->path->empty() ? name : *l->path + "/" + name;
    if (name.empty() || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos) {
      l->st = CorruptError(shown, "a name that is empty or holds '/' or NUL");
      return DIRENT_ABORT;
    }
    // mke2fs's lost+found is counted only if it holds something (Emit).
    if (!(l->root && name == "lost+found")) {
      l->st = l->self->CountEntry(shown);
      if (!l->st.ok()) return DIRENT_ABORT;
    }
    l->names.push_back({std::move(name), d->inode});
    return 0;
  };
  errcode_t rc = ext2fs_dir_iterate2(fs_, dir, DIRENT_FLAG_INCLUDE_EMPTY, nullptr, visit, &l);
  if (!l.st.ok()) return l.st;
  if (rc) return ReadError(path, "read directory", rc);
  std::sort(l.names.begin(), l.names.end(),
            [](const Name& a, const Name& b) { return a.name < b.name; });
  return std::move(l.names);
}

Result<bool> TreeReader::Empty(ext2_ino_t dir, const std::string& path) {
  struct Probe {
    TreeReader* self;
    bool empty;
  } p{this, true};
  auto visit = [](ext2_ino_t, int, ext2_dir_entry* d, int offset, int, char*, void* priv) -> int {
    auto* p = static_cast<Probe*>(priv);
    if (offset == 0 && ++p->self->dir_blocks_ > p->self->max_dir_blocks_) {
      p->empty = false;  // and List says why
      return DIRENT_ABORT;
    }
    if (d->inode == 0) return 0;
    int len = ext2fs_dirent_name_len(d);
    if ((len == 1 && d->name[0] == '.') || (len == 2 && d->name[0] == '.' && d->name[1] == '.')) {
      return 0;
    }
    p->empty = false;
    return DIRENT_ABORT;
  };
  errcode_t rc = ext2fs_dir_iterate2(fs_, dir, DIRENT_FLAG_INCLUDE_EMPTY, nullptr, visit, &p);
  if (rc) return ReadError(path, "read directory", rc);
  return p.empty;
}

Status TreeReader::Walk(ext2_ino_t dir, const std::string& path, uint64_t depth) {
  ASSIGN_OR_RETURN(std::vector<Name> names, List(dir, path));
  for (const Name& n : names) {
    bool lost_found = dir == EXT2_ROOT_INO && n.name == "lost+found";
    RETURN_IF_ERROR(
        Emit(path.empty() ? n.name : path + "/" + n.name, n.ino, depth + 1, lost_found));
  }
  return Status::Ok();
}

Status TreeReader::Emit(const std::string& path, ext2_ino_t ino, uint64_t depth, bool lost_found) {
  if (depth > limits_.max_depth) {
    return ResourceExhausted("workspace image: " + OneLine(path) + ": deeper than " +
                             std::to_string(limits_.max_depth) + " directories");
  }
  if (ino > fs_->super->s_inodes_count) {
    return CorruptError(path, "inode number " + std::to_string(ino) + " out of range");
  }
  if (ino < EXT2_FIRST_INO(fs_->super) && ino != EXT2_ROOT_INO) {
    return CorruptError(path, "a reserved inode (" + std::to_string(ino) + ")");
  }
  LargeInode in;
  errcode_t rc = ext2fs_read_inode_full(fs_, ino, in.small(), sizeof(in.in));
  if (rc) return ReadError(path, "read inode " + std::to_string(ino), rc);
  if (in.in.i_flags & EXT4_ENCRYPT_FL) return CorruptError(path, "encrypted (fscrypt)");
  const uint16_t mode = in.in.i_mode;
  const timespec mtime = Mtime(fs_, in.in);
  EntryPtr e(archive_entry_new());
  archive_entry_set_pathname(e.get(), path.c_str());
  archive_entry_set_perm(e.get(), mode & 07777);
  archive_entry_set_mtime(e.get(), mtime.tv_sec, mtime.tv_nsec);
  switch (mode & LINUX_S_IFMT) {
    case LINUX_S_IFDIR: {
      if (!dirs_.insert(ino).second) {
        return CorruptError(path, "a directory cycle: directory inode " + std::to_string(ino) +
                                      " was met before (a loop or a hard link to a directory)");
      }
      if (lost_found) {
        ASSIGN_OR_RETURN(bool empty, Empty(ino, path));
        if (empty) return Status::Ok();
        RETURN_IF_ERROR(CountEntry(path));
      }
      archive_entry_set_filetype(e.get(), AE_IFDIR);
      RETURN_IF_ERROR(tar_->Header(e.get(), path));
      if (report_) ++report_->entries;
      return Walk(ino, path, depth);
    }
    case LINUX_S_IFREG: {
      uint64_t size = EXT2_I_SIZE(&in.in);
      bytes_ += size;
      if (limits_.max_bytes && (bytes_ > limits_.max_bytes || size > limits_.max_bytes)) {
        return ResourceExhausted("workspace image: " + OneLine(path) + ": over " +
                                 std::to_string(limits_.max_bytes) + " bytes of files");
      }
      if (size > static_cast<uint64_t>(INT64_MAX)) return CorruptError(path, "an impossible size");
      archive_entry_set_filetype(e.get(), AE_IFREG);
      archive_entry_set_size(e.get(), static_cast<la_int64_t>(size));
      RETURN_IF_ERROR(tar_->Header(e.get(), path));
      RETURN_IF_ERROR(WriteContent(path, ino, in, size));
      break;
    }
    case LINUX_S_IFLNK: {
      ASSIGN_OR_RETURN(std::string target, LinkTarget(path, ino, in));
      archive_entry_set_filetype(e.get(), AE_IFLNK);
      archive_entry_set_symlink(e.get(), target.c_str());
      RETURN_IF_ERROR(tar_->Header(e.get(), path));
      break;
    }
    case LINUX_S_IFCHR:
    case LINUX_S_IFBLK:
    case LINUX_S_IFIFO:
      // LINUX_S_IF* are the S_IF* (and so the AE_IF*) values.
      archive_entry_set_filetype(e.get(), mode & LINUX_S_IFMT);
      RETURN_IF_ERROR(tar_->Header(e.get(), path));
      break;
    case LINUX_S_IFSOCK:
      if (report_) {
        ++report_->sockets;
        if (report_->skipped.size() < Ext4ReadReport::kMaxListedSockets) {
          report_->skipped.push_back({path, "a socket"});
        }
      }
      return Status::Ok();
    default:
      return CorruptError(path, "an unknown file type (mode " + std::to_string(mode) + ")");
  }
  if (report_) ++report_->entries;
  return Status::Ok();
}

// The inline data of an inode. ext2fs_file_read would copy it into a buffer of three
// blocks whatever size the image claims, and a size asked for first may have changed by
// the time the data is read (a guest's root can write to the disk while it is read): the
// buffer has room for the largest value libext2fs returns (64 KiB in an EA inode, a block
// in an EA block) after the 60 bytes in i_block.
Result<std::string> TreeReader::InlineData(const std::string& path, ext2_ino_t ino,
                                           LargeInode& in) {
  std::string data(EXT4_MIN_INLINE_DATA_SIZE + std::max<size_t>(64 * 1024, fs_->blocksize), '\0');
  size_t size = 0;
  errcode_t rc = ext2fs_inline_data_get(fs_, ino, in.small(), data.data(), &size);
  if (rc) return ReadError(path, "read inline data", rc);
  if (size > data.size()) return CorruptError(path, "inline data larger than it can be");
  data.resize(size);
  return data;
}

Status TreeReader::WriteContent(const std::string& path, ext2_ino_t ino, LargeInode& in,
                                uint64_t size) {
  if (size == 0) return Status::Ok();
  if (in.in.i_flags & EXT4_INLINE_DATA_FL) {
    ASSIGN_OR_RETURN(std::string data, InlineData(path, ino, in));
    if (data.size() < size) return CorruptError(path, "inline data shorter than the file");
    return tar_->Data(data.data(), size, path);
  }
  ext2_file_t raw;
  errcode_t rc = ext2fs_file_open2(fs_, ino, in.small(), 0, &raw);
  if (rc) return ReadError(path, "open", rc);
  FilePtr file(raw);
  for (uint64_t left = size; left > 0;) {
    unsigned int got = 0;
    rc = ext2fs_file_read(file.get(), buf_.data(),
                          static_cast<unsigned int>(std::min<uint64_t>(left, buf_.size())), &got);
    if (rc) return ReadError(path, "read", rc);
    if (got == 0) return CorruptError(path, "a read came back short");
    RETURN_IF_ERROR(tar_->Data(buf_.data(), got, path));
    left -= got;
  }
  return Status::Ok();
}

Result<std::string> TreeReader::LinkTarget(const std::string& path, ext2_ino_t ino,
                                           LargeInode& in) {
  uint64_t size = EXT2_I_SIZE(&in.in);
  if (size == 0 || size >= fs_->blocksize) {
    return CorruptError(path, "a symbolic link of " + std::to_string(size) + " bytes");
  }
  std::string target;
  if (in.in.i_flags & EXT4_INLINE_DATA_FL) {
    ASSIGN_OR_RETURN(target, InlineData(path, ino, in));
    if (target.size() < size) return CorruptError(path, "inline data shorter than the link");
    target.resize(size);
  } else if (ext2fs_is_fast_symlink(in.small())) {
    target.assign(reinterpret_cast<const char*>(in.in.i_block), size);  // the target's bytes
  } else {
    ext2_file_t raw;
    errcode_t rc = ext2fs_file_open2(fs_, ino, in.small(), 0, &raw);
    if (rc) return ReadError(path, "open", rc);
    FilePtr file(raw);
    target.resize(size);
    unsigned int got = 0;
    rc = ext2fs_file_read(file.get(), target.data(), static_cast<unsigned int>(size), &got);
    if (rc) return ReadError(path, "read link", rc);
    if (got != size) return CorruptError(path, "a read of the link came back short");
  }
  if (target.find('\0') != std::string::npos) {
    return CorruptError(path, "a symbolic link whose target holds NUL");
  }
  return target;
}

// An e2fsprogs binary: on PATH, else where Debian puts it (a user's PATH lacks /usr/sbin).
std::string E2fsprogsTool(const std::string& name) {
  if (auto found = FindInPath(name)) return *found;
  for (const char* dir : {"/usr/sbin/", "/sbin/"}) {
    if (::access((dir + name).c_str(), X_OK) == 0) return dir + name;
  }
  return name;
}

// mke2fs onto the open file `fd`, which the child holds as its fd 3.
Status Format(int fd, const Ext4Geometry& geo) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoError("pipe for mke2fs");
  UniqueFd rd(p[0]), wr(p[1]);
  SpawnOptions opts;
  // Lazy inode tables and journal: the file is all zeros (sparse) already.
  opts.argv = {E2fsprogsTool("mke2fs"), "-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0"};
  opts.argv.insert(
      opts.argv.end(),
      {"-N", std::to_string(geo.inodes), "-E",
       "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0,nodiscard", "/proc/self/fd/3"});
  opts.stdout_fd = opts.stderr_fd = wr.get();
  opts.keep_fds = {fd};
  ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Spawn(opts));
  wr.Reset();
  // mke2fs -q says little: its output fits in the pipe until it exits.
  ASSIGN_OR_RETURN(ExitInfo exit, child.WaitFor(std::chrono::minutes(2)));
  std::string out(4096, '\0');
  size_t n = 0;
  if (auto r = ReadSome(rd.get(), out.data(), out.size()); r.ok()) n = *r;
  out.resize(n);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  if (!exit.exited || exit.code != 0) {
    return Internal("format the workspace image: mke2fs failed (" + exit.Describe() + ")" +
                    (out.empty() ? "" : ": " + out));
  }
  return Status::Ok();
}

// Formats the sized, zeroed file `fd` and writes the manifest's entries into it.
Status Fill(const std::string& root, const Manifest& m, int fd, const Ext4Geometry& geo) {
  RETURN_IF_ERROR(Format(fd, geo));
  // unixfd_io_manager takes the fd's number as its name and closes the fd with the file
  // system: it gets a copy of its own.
  int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return ErrnoError("dup the workspace image fd");
  ext2_filsys raw = nullptr;
  errcode_t rc = ext2fs_open(std::to_string(own).c_str(), EXT2_FLAG_RW | EXT2_FLAG_64BITS, 0, 0,
                             unixfd_io_manager, &raw);
  if (rc) return WriteError("open the workspace image", rc);
  FsPtr fs(raw);
  // File content goes into its blocks behind libext2fs's back (ImageWriter::WriteContent),
  // so its write-back block cache must hold nothing: a block written there and freed (a
  // failed ext2fs_mkdir's directory block) could otherwise land over content later.
  rc = io_channel_set_options(fs->io, "cache=off");
  if (!rc) rc = ext2fs_read_bitmaps(fs.get());
  if (rc) return WriteError("open the workspace image", rc);
  if (!ext2fs_has_feature_extents(fs->super)) {
    return Internal("mke2fs made a workspace image without extents");
  }
  ImageWriter writer(fs.get(), fd, root);
  for (const auto& [path, e] : m) RETURN_IF_ERROR(writer.Add(e));
  // No fsync: the image goes to a VM on this host, through the same page cache.
  raw = fs.release();
  rc = ext2fs_close2(raw, EXT2_FLAG_FLUSH_NO_SYNC);
  if (rc) ext2fs_free(raw);  // ext2fs_close2 frees only on success
  return rc ? WriteError("write the workspace image", rc) : Status::Ok();
}

}  // namespace

Ext4Geometry Ext4GeometryFor(uint64_t quota_bytes, uint64_t quota_entries) {
  Ext4Geometry g;
  g.inodes = quota_entries * 5 / 4 + 1024;
  // Content with a quarter to spare; each entry's last block partly used; 256-byte inodes;
  // and 64 MiB for the journal (at most 32 MiB below 2 GiB), bitmaps and descriptors.
  uint64_t bytes = quota_bytes * 5 / 4 + quota_entries * kBlockSize + g.inodes * 256 + 64 * kMiB;
  g.bytes = std::max<uint64_t>((bytes + kBlockSize - 1) / kBlockSize * kBlockSize, 64 * kMiB);
  return g;
}

Status WriteExt4ImageToFd(const std::string& root, const Manifest& m, int fd,
                          const Ext4Geometry& geo) {
  RegisterErrorTable();
  if (geo.bytes == 0 || geo.bytes % kBlockSize != 0 || geo.inodes == 0) {
    return InvalidArgument("workspace image geometry: " + std::to_string(geo.bytes) + " bytes, " +
                           std::to_string(geo.inodes) + " inodes");
  }
  // Whatever was there goes; all zeros is what the lazy inode tables and journal rely on.
  if (::ftruncate(fd, 0) != 0 || ::ftruncate(fd, static_cast<off_t>(geo.bytes)) != 0) {
    return ErrnoError("size the workspace image");
  }
  Status st = Fill(root, m, fd, geo);
  if (!st.ok()) (void)::ftruncate(fd, 0);
  return st;
}

Status WriteExt4Image(const std::string& root, const Manifest& m, const std::string& image,
                      const Ext4Geometry& geo) {
  ASSIGN_OR_RETURN(UniqueFd f, OpenFile(image, O_RDWR | O_CREAT | O_EXCL, 0644));
  Status st = WriteExt4ImageToFd(root, m, f.get(), geo);
  if (!st.ok()) ::unlink(image.c_str());
  return st;
}

Status WriteTarFromExt4(int image_fd, const Ext4ReadLimits& limits,
                        const std::function<Status(std::string_view)>& sink,
                        Ext4ReadReport* report) {
  RegisterErrorTable();
  // unixfd_io_manager takes the fd's number as its name and closes the fd when the file
  // system is closed (or fails to open): it gets a copy of its own.
  int fd = ::fcntl(image_fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("dup the workspace image fd");
  ext2_filsys raw = nullptr;
  errcode_t rc =
      ext2fs_open(std::to_string(fd).c_str(), EXT2_FLAG_64BITS, 0, 0, unixfd_io_manager, &raw);
  if (rc) return ReadError("", "open the file system", rc);
  FsPtr fs(raw);
  // libext2fs does not replay a journal: what it would read is older than what the guest
  // last saw.
  if (ext2fs_has_feature_journal_needs_recovery(fs->super)) {
    return FailedPrecondition(
        "workspace image: the file system was not unmounted cleanly (its journal needs "
        "recovery)");
  }
  TarOut tar(sink);
  RETURN_IF_ERROR(tar.Open());
  TreeReader reader(fs.get(), limits, &tar, report);
  RETURN_IF_ERROR(reader.Run());
  return tar.Close();
}

}  // namespace trybox::workspace
