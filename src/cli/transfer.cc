#include "cli/transfer.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>

#include "cli/reply.h"
#include "cli/tree_tar.h"
#include "util/fd.h"
#include "util/names.h"
#include "util/process.h"
#include "util/socket.h"

namespace trybox::cli {
namespace {

using Kind = channel::Stream::Message::Kind;

// Reads the daemon's final reply for a stream after the data is done.
Status FinishReply(channel::Stream& s, Json* end_body) {
  for (;;) {
    auto m = s.Next();
    if (!m.ok()) return m.status().Annotate("tryboxd");
    if (m->kind == Kind::kEnd) {
      if (end_body) *end_body = m->body;
      return StatusFromReply(m->body);
    }
    if (m->kind == Kind::kReset) return StatusFromReset(m->body, "the transfer");
  }
}

Status SendFile(channel::Stream& s, const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  std::string buf(channel::kMaxDataChunk, '\0');
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, ReadSome(fd.get(), buf.data(), buf.size()));
    if (n == 0) break;
    RETURN_IF_ERROR(s.Write(channel::kChanIn, std::string_view(buf.data(), n)));
  }
  return s.CloseWrite(channel::kChanIn);
}

// Streams `dir` as a tar (pax) whose entries are relative to it, made by trybox-tar.
Status SendTree(channel::Stream& s, const std::string& dir) {
  ASSIGN_OR_RETURN(TreeTar tar, StartTreeTar("pack", dir));
  std::string buf(channel::kMaxDataChunk, '\0');
  Status sent = Status::Ok();
  for (;;) {
    auto n = ReadSome(tar.io.get(), buf.data(), buf.size());
    if (!n.ok()) sent = n.status();
    if (!n.ok() || *n == 0) break;
    sent = s.Write(channel::kChanIn, std::string_view(buf.data(), *n));
    if (!sent.ok()) break;
  }
  // A stream that failed names the cause (the helper then only saw its reader go away);
  // otherwise the helper's verdict names a tree it could not read.
  Status packed = FinishTreeTar(tar);
  RETURN_IF_ERROR(sent);
  RETURN_IF_ERROR(packed);
  return s.CloseWrite(channel::kChanIn);
}

// Pulls the next chunk of channel-1 data; "" at EOF. An END before EOF is an error.
Result<std::string> NextOutChunk(channel::Stream& s, bool* eof, Json* early_end) {
  if (*eof) return std::string();
  for (;;) {
    ASSIGN_OR_RETURN(auto m, s.Next());
    if (m.kind == Kind::kData && m.channel == channel::kChanOut) return std::move(m.data);
    if (m.kind == Kind::kEof) {
      *eof = true;
      return std::string();
    }
    if (m.kind == Kind::kEnd) {
      *early_end = m.body;
      RETURN_IF_ERROR(StatusFromReply(m.body));
      return Internal("transfer ended before its data did");
    }
    if (m.kind == Kind::kReset) return StatusFromReset(m.body, "the transfer");
  }
}

}  // namespace

Result<TransferStats> PutPath(Client& client, const std::string& vm, const std::string& src,
                              const std::string& guest_path) {
  struct stat st;
  if (::stat(src.c_str(), &st) != 0) return ErrnoError(src);
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    return InvalidArgument(src + " is neither a regular file nor a directory");
  }
  if (guest_path.empty() || guest_path[0] != '/') {
    return InvalidArgument("the VM path must be absolute, got " + guest_path);
  }
  TransferStats stats;
  stats.kind = S_ISDIR(st.st_mode) ? "tar" : "file";
  Json req = {
      {"verb", "put"},
      {"vm", vm},
      {"path", guest_path},
      {"kind", stats.kind},
      {"mode", st.st_mode & 07777},
      {"mtime_ns", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec}};
  ASSIGN_OR_RETURN(auto s, client.Open(req));
  Status sent = stats.kind == "tar" ? SendTree(*s, src) : SendFile(*s, src);
  Json end;
  Status fin = FinishReply(*s, &end);
  // The daemon's verdict names the real cause (disk full, missing dir) when both failed.
  if (!fin.ok()) return fin;
  if (!sent.ok()) return sent;
  ASSIGN_OR_RETURN(int64_t bytes, ReplyView(end).IntOr("bytes", 0, 0));
  stats.bytes = static_cast<uint64_t>(bytes);
  return stats;
}

namespace {

// Removes an entry of a directory from a separate process unless told to keep it, so that a
// copy killed part-way (even by SIGKILL) leaves nothing behind. The remover is /bin/sh in its
// own session (a terminal's Ctrl-C or a kill of our process group does not reach it); it
// holds the directory open as its fd 3 and works inside it, so it never follows a path that
// changed since. It waits on a socket: "keep" means the entry stays; end of file without it
// (we exited, or died) means remove it.
class RemoveUnlessKept {
 public:
  static Result<RemoveUnlessKept> Start(int dirfd, const std::string& name) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      return ErrnoError("socketpair");
    }
    UniqueFd ours(sv[0]), theirs(sv[1]);
    SpawnOptions o;
    o.argv = {"/bin/sh", "-c",
              "IFS= read -r word; [ \"$word\" = keep ] && exit 0; cd -P /proc/self/fd/3 || exit 1; "
              "[ -d \"$1\" ] && [ ! -L \"$1\" ] && chmod -R u+rwx -- \"$1\" 2>/dev/null; "
              "exec rm -rf -- \"$1\"",
              "trybox-cp-cleanup", name};
    o.env = std::vector<std::string>{"PATH=/usr/bin:/bin", "LC_ALL=C"};
    o.stdin_fd = theirs.get();
    o.keep_fds = {dirfd};
    o.new_session = true;
    ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Spawn(o));
    return RemoveUnlessKept(std::move(ours), std::move(child), name);
  }
  RemoveUnlessKept(RemoveUnlessKept&&) = default;
  RemoveUnlessKept& operator=(RemoveUnlessKept&&) = delete;
  ~RemoveUnlessKept() { (void)RemoveNow(); }

  // The entry stays (renamed into place, or never ours).
  Status Keep() { return Finish("keep\n"); }
  // Removes the entry now and waits until it is gone.
  Status RemoveNow() { return Finish(""); }

 private:
  RemoveUnlessKept(UniqueFd socket, ChildProcess child, std::string name)
      : socket_(std::move(socket)), child_(std::move(child)), name_(std::move(name)) {}

  Status Finish(std::string_view word) {
    if (!child_.running()) return Status::Ok();
    if (!word.empty()) (void)::send(socket_.get(), word.data(), word.size(), MSG_NOSIGNAL);
    socket_.Reset();
    ASSIGN_OR_RETURN(ExitInfo info, child_.Wait());
    if (!info.exited || info.code != 0) {
      return Internal("could not remove the temporary " + name_ + ": " + info.Describe());
    }
    return Status::Ok();
  }

  UniqueFd socket_;
  ChildProcess child_;
  std::string name_;
};

// Where a copy from the guest lands: the entry `name` of the directory `dir`, open as
// `dirfd`. Everything is created and renamed relative to `dirfd`.
struct Landing {
  std::string dir;   // as resolved by realpath(3): no symbolic link in it
  std::string name;  // one path component
  UniqueFd dirfd;
  std::string shown;  // the destination as the user will recognise it, for messages
};

std::string LastComponent(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string ParentOf(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

Status SymlinkRefused(const std::string& path) {
  return FailedPrecondition(path +
                            " is a symbolic link: trybox cp neither writes through a link nor "
                            "replaces it. Give the path it points to (or end it with / to copy "
                            "into the directory it points to), or remove the link");
}

// The rules (docs/security.md, "The CLI and the host"): DST an existing directory means
// DST/BASENAME-OF-SOURCE; DST itself, or that entry inside it, being a symbolic link is
// refused; a tree never merges into, or replaces, something that exists.
Result<Landing> ResolveLanding(const std::string& dst, const std::string& guest_path, bool tree) {
  if (dst.empty()) return InvalidArgument("the destination is empty");
  Landing l;
  std::string dir;
  struct stat st;
  if (::lstat(dst.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) return SymlinkRefused(dst);
    if (S_ISDIR(st.st_mode)) {
      dir = dst;
      l.name = LastComponent(guest_path);
    } else if (tree) {
      return FailedPrecondition(dst + " exists and is not a directory");
    } else if (!S_ISREG(st.st_mode)) {
      return FailedPrecondition(dst + " exists and is not a regular file");
    } else {
      dir = ParentOf(dst);
      l.name = LastComponent(dst);
    }
  } else if (errno == ENOENT) {
    if (!dst.empty() && dst.back() == '/' && !tree) {
      return NotFound("no directory " + dst + " to copy into");
    }
    dir = ParentOf(dst);
    l.name = LastComponent(dst);
  } else {
    return ErrnoError(dst);
  }
  if (l.name.empty() || l.name == "." || l.name == ".." || l.name == "/") {
    return InvalidArgument("name the destination in full: cannot copy " + guest_path + " into " +
                           dst + " under its own name");
  }
  char real[PATH_MAX];
  if (!::realpath(dir.c_str(), real)) return ErrnoError(dir);
  l.dir = real;
  l.dirfd.Reset(::open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!l.dirfd.valid()) return ErrnoError(l.dir);
  l.shown = (l.dir == "/" ? "" : l.dir) + "/" + l.name;
  if (::fstatat(l.dirfd.get(), l.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(st.st_mode)) return SymlinkRefused(l.shown);
    if (tree) {
      return Status(Code::kAlreadyExists,
                    l.shown + " already exists: trybox cp does not merge a tree into it");
    }
    if (!S_ISREG(st.st_mode)) {
      return FailedPrecondition(l.shown + " exists and is not a regular file");
    }
  } else if (errno != ENOENT) {
    return ErrnoError(l.shown);
  }
  return l;
}

// ".NAME.trybox-tmp-RANDOM": hidden, named for what it will become, never guessable.
std::string TempName(const std::string& name) {
  return "." + name.substr(0, 200) + ".trybox-tmp-" + RandomHex(6);
}

Status SetTimes(int fd, int64_t mtime_ns) {
  struct timespec ts[2] = {{mtime_ns / 1000000000, mtime_ns % 1000000000},
                           {mtime_ns / 1000000000, mtime_ns % 1000000000}};
  if (::futimens(fd, ts) != 0) return ErrnoError("futimens");
  return Status::Ok();
}

struct Meta {
  std::string kind;
  mode_t mode = 0;  // permission bits only: never set-uid, set-gid or sticky
  int64_t mtime_ns = 0;
  int64_t size = 0;
};

Result<Meta> ParseMeta(const Json& body) {
  ReplyView v(body);
  Meta m;
  ASSIGN_OR_RETURN(m.kind, v.String("kind"));
  ASSIGN_OR_RETURN(int64_t mode, v.IntOr("mode", 0644, 0, 07777));
  // Never set-uid, set-gid or sticky; never group or other write (docs/security.md).
  m.mode = static_cast<mode_t>(mode) & GuestPermissionMask();
  ASSIGN_OR_RETURN(m.mtime_ns, v.IntOr("mtime_ns", 0, 0));
  ASSIGN_OR_RETURN(m.size, v.IntOr("size", 0, 0));
  return m;
}

// Moves the finished temporary entry to its name; a tree never replaces anything.
Status RenameIntoPlace(const Landing& l, const std::string& tmp, bool tree) {
  unsigned flags = tree ? RENAME_NOREPLACE : 0;
  int rc = ::renameat2(l.dirfd.get(), tmp.c_str(), l.dirfd.get(), l.name.c_str(), flags);
  // A filesystem without RENAME_NOREPLACE: rename(2) still refuses to replace a non-empty
  // directory or a file by a directory.
  if (rc != 0 && errno == EINVAL && flags != 0) {
    rc = ::renameat(l.dirfd.get(), tmp.c_str(), l.dirfd.get(), l.name.c_str());
  }
  if (rc == 0) return Status::Ok();
  if (errno == EEXIST) {
    return Status(Code::kAlreadyExists, l.shown + " appeared while the copy was made; left as is");
  }
  return ErrnoError("rename into " + l.shown);
}

Status ReceiveFile(channel::Stream& s, const Meta& meta, const Landing& l, uint64_t* bytes) {
  std::string tmp = TempName(l.name);
  // The remover first: killed between the create and its start, the CLI would leave the
  // temporary entry behind for good.
  auto guard = RemoveUnlessKept::Start(l.dirfd.get(), tmp);
  if (!guard.ok()) return guard.status();
  // O_EXCL|O_NOFOLLOW: never an existing file, never through a symbolic link planted at the
  // name; 0600 until complete, and only this descriptor's mode is ever changed.
  UniqueFd fd(::openat(l.dirfd.get(), tmp.c_str(),
                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    Status st = ErrnoError("create " + l.dir + "/" + tmp);
    (void)guard->Keep();  // not ours: whatever is at that name stays
    return st;
  }
  bool eof = false;
  Json early;
  Status result = Status::Ok();
  for (;;) {
    auto c = NextOutChunk(s, &eof, &early);
    if (!c.ok()) {
      result = c.status();
      break;
    }
    if (c->empty()) break;
    *bytes += c->size();
    result = WriteFull(fd.get(), *c);
    if (!result.ok()) {
      (void)s.Reset("local write failed");
      break;
    }
  }
  if (result.ok()) result = FinishReply(s, nullptr);
  if (result.ok() && *bytes != static_cast<uint64_t>(meta.size)) {
    result = Internal("short transfer: got " + std::to_string(*bytes) + " of " +
                      std::to_string(meta.size) + " bytes");
  }
  if (result.ok() && ::fchmod(fd.get(), meta.mode) != 0) result = ErrnoError("fchmod " + tmp);
  if (result.ok()) result = SetTimes(fd.get(), meta.mtime_ns);
  if (result.ok()) result = fd.Close();
  if (result.ok()) result = RenameIntoPlace(l, tmp, /*tree=*/false);
  if (!result.ok()) {
    (void)guard->RemoveNow();
    return result;
  }
  return guard->Keep();
}

Status ReceiveTree(channel::Stream& s, const Meta& meta, const Landing& l, uint64_t* bytes) {
  std::string tmp = TempName(l.name);
  // The remover first, as for a file.
  auto guard = RemoveUnlessKept::Start(l.dirfd.get(), tmp);
  if (!guard.ok()) return guard.status();
  if (::mkdirat(l.dirfd.get(), tmp.c_str(), 0700) != 0) {
    Status st = ErrnoError("mkdir " + l.dir + "/" + tmp);
    (void)guard->Keep();
    return st;
  }
  auto tar = StartTreeTar("unpack", (l.dir == "/" ? "" : l.dir) + "/" + tmp);
  if (!tar.ok()) {
    (void)s.Reset("extract failed");
    (void)guard->RemoveNow();
    return tar.status();
  }
  bool eof = false;
  Json early;
  Status fed = Status::Ok();
  for (;;) {
    auto c = NextOutChunk(s, &eof, &early);
    if (!c.ok()) fed = c.status();
    if (!c.ok() || c->empty()) break;
    *bytes += c->size();
    // A helper that refused an entry stops reading: its verdict says why.
    if (!SendFull(tar->io.get(), *c).ok()) break;
  }
  // The end of the stream tells the helper the tar is complete, or cut short.
  Status unpacked = FinishTreeTar(*tar);
  Status result = !fed.ok() ? fed : unpacked;
  if (!result.ok()) {
    (void)s.Reset("extract failed");
  } else {
    result = FinishReply(s, nullptr);
  }
  if (result.ok()) {
    UniqueFd top(
        ::openat(l.dirfd.get(), tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!top.valid()) {
      result = ErrnoError("open " + tmp);
    } else if (::fchmod(top.get(), meta.mode) != 0) {
      result = ErrnoError("fchmod " + tmp);
    } else {
      result = SetTimes(top.get(), meta.mtime_ns);
    }
  }
  if (result.ok()) result = RenameIntoPlace(l, tmp, /*tree=*/true);
  if (!result.ok()) {
    (void)guard->RemoveNow();
    return result;
  }
  return guard->Keep();
}

}  // namespace

Result<TransferStats> GetPath(Client& client, const std::string& vm, const std::string& guest_path,
                              const std::string& dst) {
  ASSIGN_OR_RETURN(auto s, client.Open({{"verb", "get"}, {"vm", vm}, {"path", guest_path}}));
  // The first message is the meta event, or an END with the error (e.g. not found): in that
  // case nothing is created on the host.
  Json meta_body;
  for (;;) {
    ASSIGN_OR_RETURN(auto m, s->Next());
    if (m.kind == Kind::kEvent) {
      ASSIGN_OR_RETURN(std::string type, ReplyView(m.body).StringOr("type", ""));
      if (type != "meta") continue;
      meta_body = std::move(m.body);
      break;
    }
    if (m.kind == Kind::kEnd) {
      RETURN_IF_ERROR(StatusFromReply(m.body));
      return Internal("get ended without data");
    }
    if (m.kind == Kind::kReset) return StatusFromReset(m.body, "the transfer");
  }
  auto meta = ParseMeta(meta_body);
  if (!meta.ok() || (meta->kind != "tar" && meta->kind != "file")) {
    (void)s->Reset("malformed meta");
    return meta.ok() ? MalformedReply("kind", "must be \"file\" or \"tar\"") : meta.status();
  }
  TransferStats stats;
  stats.kind = meta->kind;
  bool tree = meta->kind == "tar";
  auto landing = ResolveLanding(dst, guest_path, tree);
  if (!landing.ok()) {
    (void)s->Reset("destination refused");
    return landing.status();
  }
  Status st = tree ? ReceiveTree(*s, *meta, *landing, &stats.bytes)
                   : ReceiveFile(*s, *meta, *landing, &stats.bytes);
  if (!st.ok()) return st;
  return stats;
}

}  // namespace trybox::cli
