#include "workspace/tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <optional>
#include <set>

#include "util/fd.h"
#include "util/file_type.h"
#include "util/sha256.h"
#include "util/utf8.h"
#include "workspace/archive_ptr.h"
#include "workspace/git_path.h"

namespace trybox::workspace {
namespace {

// Why a relative tar path is unsafe, or "" if it is not.
std::string UnsafePathReason(const std::string& name) {
  if (name.empty()) return "an empty path";
  if (name[0] == '/') return "an absolute path";
  size_t start = 0;
  for (;;) {
    size_t slash = name.find('/', start);
    std::string comp = name.substr(start, slash == std::string::npos ? slash : slash - start);
    if (comp == "..") return "a '..' component";
    if (slash == std::string::npos) return "";
    start = slash + 1;
  }
}

std::string StripDotSlash(std::string name) {
  while (name.rfind("./", 0) == 0) name.erase(0, 2);
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  return name;
}

// archive_error_string is null when libarchive set no message.
std::string ErrorText(archive* a) {
  const char* m = archive_error_string(a);
  return m ? m : "unknown libarchive error";
}

// libarchive's messages name the full host path it was writing. A reason names entries as
// the tar did: the host directory (the daemon's state directory, say) never reaches a
// report or a commit message.
std::string WithoutDest(std::string msg, const std::string& dest) {
  for (const std::string& d : {dest + "/", dest}) {
    for (size_t at = msg.find(d); at != std::string::npos; at = msg.find(d, at))
      msg.erase(at, d.size());
  }
  return JsonSafe(msg);
}

// A failed write into the host's tree; a full disk is named as such, `no_space`, not as
// libarchive's "Write failed".
Status DiskWriteError(archive* disk, const std::string& what, const std::string& dest) {
  std::string msg = WithoutDest(ErrorText(disk), dest);
  int err = archive_errno(disk);
  if (err == ENOSPC || err == EDQUOT) {
    return ResourceExhausted("no_space: " + what + ": no space left on the host's disk (" + msg +
                             ")");
  }
  return Internal(what + ": " + msg);
}

// Makes the directories above `name` below `dest` as extraction would (0755), never through a
// symbolic link. False if one of them exists as something else: extraction refuses or
// replaces such an entry, so it is left to extraction.
bool MakeParentsNoFollow(const std::string& dest, const std::string& name) {
  UniqueFd dir(::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return false;
  size_t start = 0;
  for (size_t slash = name.find('/'); slash != std::string::npos;
       start = slash + 1, slash = name.find('/', start)) {
    std::string comp = name.substr(start, slash - start);
    if (comp.empty() || comp == ".") continue;
    if (::mkdirat(dir.get(), comp.c_str(), 0755) != 0 && errno != EEXIST) return false;
    UniqueFd next(
        ::openat(dir.get(), comp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid()) return false;
    dir = std::move(next);
  }
  return true;
}

// The paths of `m` strictly above `name` ("a" and "a/b" for "a/b/c") that are in it.
bool HasAncestorIn(const Manifest& m, const std::string& name) {
  for (size_t slash = name.find('/'); slash != std::string::npos;
       slash = name.find('/', slash + 1)) {
    if (m.count(name.substr(0, slash))) return true;
  }
  return false;
}

// Whether `m` holds a path strictly below `name`.
bool HasDescendantIn(const Manifest& m, const std::string& name) {
  const std::string prefix = name + "/";
  auto it = m.lower_bound(prefix);
  return it != m.end() && it->first.compare(0, prefix.size(), prefix) == 0;
}

// A data block of an entry read before deciding whether to write it: where it lies in the
// content already read, or (outside the declared size: a tar that lies) its own bytes.
struct Block {
  la_int64_t offset;
  size_t size;
  bool in_content;
  std::string outside;  // when not in_content
};

}  // namespace

int TarSink::Open(archive* a) {
  auto write_cb = [](archive*, void* ud, const void* buf, size_t len) -> la_ssize_t {
    auto* k = static_cast<TarSink*>(ud);
    k->st = (*k->fn)(std::string_view(static_cast<const char*>(buf), len));
    return k->st.ok() ? static_cast<la_ssize_t>(len) : -1;
  };
  return archive_write_open(a, this, nullptr, write_cb, nullptr);
}

Status WriteTar(const std::string& root, const Manifest& m,
                const std::function<Status(std::string_view)>& sink) {
  ArchivePtr out(archive_write_new());
  archive_write_set_format_pax_restricted(out.get());
  // Names are bytes and travel as bytes: without this, a name that is not ASCII cannot be
  // translated to UTF-8 in the daemon's C locale and the whole inject fails. GNU tar in the
  // guest ignores the keyword (with a warning) and takes the bytes as they are.
  if (archive_write_set_format_option(out.get(), "pax", "hdrcharset", "BINARY") != ARCHIVE_OK) {
    return Internal("tar: " + ErrorText(out.get()));
  }
  archive_write_set_bytes_per_block(out.get(), 0);
  TarSink s(sink);
  auto fail = [&](const std::string& what) {
    return s.st.ok() ? Internal(JsonSafe(what) + ": " + JsonSafe(ErrorText(out.get()))) : s.st;
  };
  if (s.Open(out.get()) != ARCHIVE_OK) return fail("tar");
  std::string buf(256 * 1024, '\0');
  for (const auto& [path, e] : m) {
    std::string full = root + "/" + path;
    EntryPtr ae(archive_entry_new());
    archive_entry_set_pathname(ae.get(), path.c_str());
    archive_entry_set_perm(ae.get(), e.mode);
    struct stat st;
    if (::lstat(full.c_str(), &st) != 0) {
      return ErrnoError(JsonSafe(full) + " vanished while being copied");
    }
    archive_entry_set_mtime(ae.get(), st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    if (e.symlink) {
      archive_entry_set_filetype(ae.get(), AE_IFLNK);
      archive_entry_set_symlink(ae.get(), e.target.c_str());
      if (archive_write_header(out.get(), ae.get()) != ARCHIVE_OK) return fail("tar " + path);
      continue;
    }
    UniqueFd fd(::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid()) return ErrnoError("open " + JsonSafe(full));
    if (::fstat(fd.get(), &st) != 0) return ErrnoError("stat " + JsonSafe(full));
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != e.size) {
      return FailedPrecondition(JsonSafe(full) +
                                " changed while being copied into the VM; try again");
    }
    archive_entry_set_filetype(ae.get(), AE_IFREG);
    archive_entry_set_size(ae.get(), static_cast<la_int64_t>(e.size));
    if (archive_write_header(out.get(), ae.get()) != ARCHIVE_OK) return fail("tar " + path);
    uint64_t left = e.size;
    while (left > 0) {
      ASSIGN_OR_RETURN(size_t n,
                       ReadSome(fd.get(), buf.data(), std::min<uint64_t>(left, buf.size())));
      if (n == 0) {
        return FailedPrecondition(JsonSafe(full) + " shrank while being copied into the VM");
      }
      if (archive_write_data(out.get(), buf.data(), n) < 0) return fail("tar " + path);
      left -= n;
    }
  }
  if (archive_write_close(out.get()) != ARCHIVE_OK) return fail("tar");
  return Status::Ok();
}

ExtractOptions ExtractOptions::ForCollect(const ExcludeList* excludes, uint64_t quota_bytes,
                                          uint64_t quota_entries) {
  ExtractOptions o;
  o.excludes = excludes;
  o.quota_bytes = quota_bytes;
  o.quota_entries = quota_entries;
  o.commit_paths_only = true;
  o.max_listed_skipped = kMaxListedSkipped;
  return o;
}

Status ExtractTar(const std::function<Result<std::string>()>& next_chunk, const std::string& dest,
                  const ExtractOptions& opts, ExtractReport* report) {
  RETURN_IF_ERROR(MakeDirs(dest, 0755));
  ArchivePtr in(archive_read_new());
  archive_read_support_format_tar(in.get());
  struct Source {
    const std::function<Result<std::string>()>* next;
    std::string chunk;
    Status st;
    uint64_t* bytes;
  } src{&next_chunk, "", Status::Ok(), &report->tar_bytes};
  auto read_cb = [](archive*, void* ud, const void** buf) -> la_ssize_t {
    auto* s = static_cast<Source*>(ud);
    auto c = (*s->next)();
    if (!c.ok()) {
      s->st = c.status();
      return -1;
    }
    s->chunk = std::move(*c);
    *s->bytes += s->chunk.size();
    *buf = s->chunk.data();
    return static_cast<la_ssize_t>(s->chunk.size());
  };
  auto read_fail = [&](const char* what) {
    return src.st.ok() ? Internal(std::string(what) + ": " + JsonSafe(ErrorText(in.get())))
                       : src.st;
  };
  if (archive_read_open(in.get(), &src, nullptr, read_cb, nullptr) != ARCHIVE_OK) {
    return read_fail("untar");
  }
  ArchivePtr disk(archive_write_disk_new());
  // No ARCHIVE_EXTRACT_UNLINK: with it, libarchive replaces a symlink met on the way with a
  // directory and goes on; without it, such an entry is refused, and so can be reported.
  archive_write_disk_set_options(disk.get(), ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_PERM |
                                                 ARCHIVE_EXTRACT_SECURE_SYMLINKS |
                                                 ARCHIVE_EXTRACT_SECURE_NODOTDOT);
  auto list = [&](const std::string& path, std::string reason) {
    if (!opts.max_listed_skipped || report->skipped.size() < opts.max_listed_skipped) {
      report->skipped.push_back({path, std::move(reason)});
    } else {
      ++report->skipped_unlisted;
    }
  };
  // Every entry the host writes or records counts: a flood of fifos is not free either.
  auto count_entry = [&]() -> Status {
    ++report->entries;
    if (opts.quota_entries && report->entries > opts.quota_entries) {
      return ResourceExhausted("the tree holds more than the workspace quota of " +
                               std::to_string(opts.quota_entries) +
                               " entries (files, directories and links)");
    }
    return Status::Ok();
  };
  auto count_bytes = [&](uint64_t n) -> Status {
    report->bytes += n;
    if (opts.quota_bytes && report->bytes > opts.quota_bytes) {
      return ResourceExhausted("over the workspace quota of " + std::to_string(opts.quota_bytes) +
                               " bytes");
    }
    return Status::Ok();
  };
  auto write_fail = [&](const std::string& name) {
    return DiskWriteError(disk.get(), "write " + JsonSafe(name), dest);
  };
  // Reads the current entry's data blocks, counted against the quota as they come (past
  // the declared size too), and hands each to `take`.
  auto read_blocks = [&](uint64_t& counted,
                         const std::function<Status(const void*, size_t, la_int64_t)>& take) {
    const void* buf;
    size_t size;
    la_int64_t off;
    for (;;) {
      int rr = archive_read_data_block(in.get(), &buf, &size, &off);
      if (rr == ARCHIVE_EOF) return Status::Ok();
      if (rr != ARCHIVE_OK) return read_fail("untar");
      uint64_t end_of_block = static_cast<uint64_t>(off) + size;
      if (end_of_block > counted) {
        RETURN_IF_ERROR(count_bytes(end_of_block - counted));
        counted = end_of_block;
      }
      RETURN_IF_ERROR(take(buf, size, off));
    }
  };
  std::set<std::string> refused_places;  // paths a commit cannot hold, named once each
  for (;;) {
    archive_entry* e;
    int r = archive_read_next_header(in.get(), &e);
    if (r == ARCHIVE_EOF) break;
    // ARCHIVE_WARN: a name that could not be converted to the locale; libarchive then keeps
    // the bytes as they are, which is what is wanted.
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return read_fail("untar");
    std::string raw = archive_entry_pathname(e) ? archive_entry_pathname(e) : "";
    std::string name = StripDotSlash(raw);
    if (name.empty() || name == ".") continue;
    const std::string& shown = raw[0] == '/' ? raw : name;
    std::string why = UnsafePathReason(raw[0] == '/' ? raw : name);
    auto type = archive_entry_filetype(e);
    const char* hard = archive_entry_hardlink(e);
    std::string hard_name;
    if (why.empty() && hard) {
      hard_name = StripDotSlash(hard);
      std::string hwhy = UnsafePathReason(hard[0] == '/' ? std::string(hard) : hard_name);
      if (!hwhy.empty()) why = "a hard link to " + hwhy;
    }
    if (why.empty() && !hard && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
      why = DescribeFileType(type);  // AE_IF* are the S_IF* values
    }
    if (!why.empty()) {
      list(shown, why);
      RETURN_IF_ERROR(count_entry());
      continue;
    }
    if (opts.excludes && opts.excludes->Excluded(name, type == AE_IFDIR)) {
      ++report->excluded;
      continue;
    }
    if (opts.commit_paths_only) {
      PathRefusal refusal = UnstorablePath(name, type == AE_IFLNK && !hard);
      if (!refusal.ok()) {
        std::string place = name.substr(0, refusal.prefix);
        if (refused_places.insert(place).second) {
          bool below = place.size() < name.size() || type == AE_IFDIR;
          list(place, below ? refusal.reason + " (and everything below it)" : refusal.reason);
        }
        RETURN_IF_ERROR(count_entry());
        continue;
      }
    }
    RETURN_IF_ERROR(count_entry());
    // The host's own walk (ManifestFromTree) must be able to reach what is written.
    if (opts.commit_paths_only && dest.size() + 1 + name.size() >= PATH_MAX) {
      list(name, "a path of " + std::to_string(name.size()) +
                     " bytes, longer than the host takes below the collect directory");
      continue;
    }
    // Permission bits only: a guest must not plant set-uid, set-gid or sticky files on the
    // host (the daemon may run as root). Ownership is never restored (no EXTRACT_OWNER).
    const uint32_t perm = archive_entry_perm(e) & 0777 & opts.perm_mask;
    archive_entry_set_perm(e, perm);
    // A file that came back as it went in is not written (ExtractOptions::unchanged_from).
    // Its content is read whole first; `stash` keeps it for writing if it differs.
    std::optional<std::vector<Block>> stash;
    std::string content;  // the stashed file's content, read whole
    uint64_t counted = 0;
    if (opts.unchanged_from) {
      // Left unwritten only where extraction would have written it: nothing there yet, no
      // unwritten file above it, and its directories made (or there) without a link.
      auto free_place = [&] {
        struct stat st;
        return ::lstat((dest + "/" + name).c_str(), &st) != 0 && errno == ENOENT &&
               !HasAncestorIn(report->unwritten, name) && MakeParentsNoFollow(dest, name);
      };
      auto same = hard ? report->unwritten.find(hard_name) : report->unwritten.end();
      auto before = opts.unchanged_from->find(name);
      if (hard && same != report->unwritten.end() && free_place()) {
        Entry copy = same->second;  // a hard link to an unwritten file is that file again
        copy.path = name;
        report->unwritten[name] = std::move(copy);
        continue;
      }
      if (!hard && type == AE_IFREG && before != opts.unchanged_from->end() &&
          !before->second.symlink && !before->second.blob.empty() && archive_entry_size_is_set(e) &&
          archive_entry_size(e) >= 0 &&
          static_cast<uint64_t>(archive_entry_size(e)) == before->second.size &&
          before->second.size <= kMaxUnwrittenBytes && free_place()) {
        counted = before->second.size;
        RETURN_IF_ERROR(count_bytes(counted));
        stash.emplace();
        content.assign(counted, '\0');
        bool fits = true;
        RETURN_IF_ERROR(read_blocks(counted, [&](const void* buf, size_t size, la_int64_t off) {
          if (off < 0 || static_cast<uint64_t>(off) + size > content.size()) {
            fits = false;
            stash->push_back({off, size, false, std::string(static_cast<const char*>(buf), size)});
          } else {
            std::memcpy(content.data() + off, buf, size);
            stash->push_back({off, size, true, ""});
          }
          return Status::Ok();
        }));
        std::string sha = fits ? Sha256Hex(content) : "";
        if (fits && sha == before->second.sha256) {
          ++report->files;
          Entry u;
          u.path = name;
          u.mode = perm;
          u.size = content.size();
          u.sha256 = std::move(sha);
          report->unwritten[name] = std::move(u);
          continue;
        }
      }
      // Written: what extraction would do to an unwritten file in its way. A file cannot
      // hold entries (libarchive: "Could not stat"); a directory with entries cannot become
      // something else; an entry replaces a file at its own path.
      if (HasAncestorIn(report->unwritten, name)) {
        list(shown, "refused: a parent of it is a file");
        continue;
      }
      if (type != AE_IFDIR && HasDescendantIn(report->unwritten, name)) {
        list(shown, "refused: Can't replace existing directory with non-directory");
        continue;
      }
      report->unwritten.erase(name);
    }
    if (hard) archive_entry_set_hardlink(e, (dest + "/" + hard_name).c_str());
    archive_entry_set_pathname(e, (dest + "/" + name).c_str());
    r = archive_write_header(disk.get(), e);
    if (r == ARCHIVE_FATAL) return write_fail(name);
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      // libarchive's secure checks: the entry would be written through a symbolic link.
      list(shown, "refused: " + WithoutDest(ErrorText(disk.get()), dest));
      continue;
    }
    if (type == AE_IFREG && !hard) ++report->files;
    if (stash) {
      for (const Block& b : *stash) {
        const char* data = b.in_content ? content.data() + b.offset : b.outside.data();
        if (archive_write_data_block(disk.get(), data, b.size, b.offset) != ARCHIVE_OK) {
          return write_fail(name);
        }
      }
      if (archive_write_finish_entry(disk.get()) != ARCHIVE_OK) return write_fail(name);
      continue;
    }
    // A file counts at its declared size: a sparse file holds little data but is read (and
    // hashed, and stored by git) at its full length.
    if (type == AE_IFREG && archive_entry_size_is_set(e) && archive_entry_size(e) > 0) {
      counted = static_cast<uint64_t>(archive_entry_size(e));
      RETURN_IF_ERROR(count_bytes(counted));
    }
    RETURN_IF_ERROR(read_blocks(counted, [&](const void* buf, size_t size, la_int64_t off) {
      if (archive_write_data_block(disk.get(), buf, size, off) != ARCHIVE_OK) {
        return write_fail(name);
      }
      return Status::Ok();
    }));
    if (archive_write_finish_entry(disk.get()) != ARCHIVE_OK) return write_fail(name);
  }
  if (archive_write_close(disk.get()) != ARCHIVE_OK) {
    return DiskWriteError(disk.get(), "untar", dest);
  }
  return Status::Ok();
}

}  // namespace trybox::workspace
