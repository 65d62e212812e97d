#include "guest/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "guest/requests.h"
#include "guest/spawn.h"
#include "util/file_type.h"
#include "util/names.h"

namespace trybox::guest {
namespace {

using channel::Stream;

constexpr size_t kChunk = 1 << 20;
constexpr int kPipeSize = 1 << 20;
// How much of tar's stderr an error message quotes.
constexpr size_t kTailBytes = 2048;
constexpr const char* kTar = "/bin/tar";

Json Fail(const char* error, const std::string& message) {
  return {{"ok", false}, {"error", error}, {"message", message}};
}

Json Ok(uint64_t bytes) { return {{"ok", true}, {"bytes", bytes}}; }

// "no such file or directory": strerror, in the lower case of the rest of a message.
std::string ErrnoText(int err) {
  std::string s = std::strerror(err);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

std::string Describe(const std::string& path, int err) { return path + ": " + ErrnoText(err); }

const char* ErrnoClass(int err) {
  switch (err) {
    case ENOENT:
      return "not_found";
    case ENOTDIR:
      return "not_a_directory";
    case ENOSPC:
    case EDQUOT:
      return "no_space";
    default:
      return "io";
  }
}

Json FailErrno(const std::string& path, int err) {
  return Fail(ErrnoClass(err), Describe(path, err));
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

std::string Tail(const std::string& s) {
  std::string t = s.size() > kTailBytes ? s.substr(s.size() - kTailBytes) : s;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t;
}

// mkdir -p; returns 0 or the errno of the component that failed (ENOTDIR if a component
// exists and is not a directory).
int MakeDirs(const std::string& path) {
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    std::string prefix = path.substr(0, pos);
    if (prefix.empty()) continue;
    if (::mkdir(prefix.c_str(), 0755) == 0) continue;
    if (errno != EEXIST) return errno;
    struct stat st;
    if (::stat(prefix.c_str(), &st) != 0) return errno;
    if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  }
  return 0;
}

// Writes all of `data`; returns 0 or errno.
int WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

// Collects a child's output (tar's stderr) on its own thread, keeping the tail, so the
// child never blocks on a full pipe while we are busy with its stdin or stdout.
class OutputTail {
 public:
  explicit OutputTail(UniqueFd fd)
      : thread_([this, fd = std::move(fd)] {
          char buf[4096];
          for (;;) {
            auto n = ReadSome(fd.get(), buf, sizeof buf);
            if (!n.ok() || *n == 0) return;
            std::lock_guard<std::mutex> lock(mu_);
            text_.append(buf, *n);
            if (text_.size() > 4 * kTailBytes) text_.erase(0, text_.size() - kTailBytes);
          }
        }) {}
  ~OutputTail() {
    if (thread_.joinable()) thread_.join();
  }
  // Waits for the writer to close its end, then returns the tail.
  std::string Take() {
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    return Tail(text_);
  }

 private:
  std::mutex mu_;
  std::string text_;
  std::thread thread_;
};

std::string DescribeTarFailure(int wait_status, const std::string& tail) {
  ExitInfo e = ExitInfoFromWaitStatus(wait_status);
  std::string what = e.exited ? "tar exited with code " + std::to_string(e.code)
                              : "tar was killed by signal " + std::to_string(e.signal);
  return tail.empty() ? what : what + ": " + tail;
}

// A tar child with the given stdio; stdout/stdin ends that are -1 go to /dev/null.
SpawnOutcome StartTar(Reaper& reaper, std::vector<std::string> argv, int in, int out, int err) {
  SpawnSpec spec;
  spec.argv = std::move(argv);
  spec.env = MergeEnv({});
  spec.stdin_fd = in;
  spec.stdout_fd = out;
  spec.stderr_fd = err;
  return Spawn(reaper, spec);
}

// ---- put ----

enum class Upload { kEof, kGone };

// Reads the upload until EOF on channel 0, handing each DATA chunk to `sink`. kGone if the
// host reset the stream or the connection died first (nobody is left to answer).
template <typename Sink>
Upload ReadUpload(Stream& s, uint64_t* bytes, Sink&& sink) {
  for (;;) {
    auto m = s.Next();
    if (!m.ok()) return Upload::kGone;
    switch (m->kind) {
      case Stream::Message::Kind::kData:
        if (m->channel != channel::kChanIn) break;
        *bytes += m->data.size();
        sink(std::string_view(m->data));
        break;
      case Stream::Message::Kind::kEof:
        if (m->channel == channel::kChanIn) return Upload::kEof;
        break;
      case Stream::Message::Kind::kEvent:
        break;
      case Stream::Message::Kind::kEnd:
      case Stream::Message::Kind::kReset:
        return Upload::kGone;
    }
  }
}

// Consumes the rest of the upload, then ENDs with `result`.
void DrainThenEnd(Stream& s, const Json& result) {
  uint64_t ignored = 0;
  if (ReadUpload(s, &ignored, [](std::string_view) {}) == Upload::kEof) (void)s.End(result);
}

// The temporary file a put writes before renaming it over the target; unlinked unless
// committed.
class TempFile {
 public:
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  // 0 or errno.
  int Create(const std::string& dir, const std::string& base) {
    // NAME_MAX is 255; keep room for the prefix and suffix.
    std::string tmpl = dir + (dir == "/" ? "" : "/") + "." + base.substr(0, 200) + ".trybox-XXXXXX";
    int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0) return errno;
    fd_.Reset(fd);
    path_ = std::move(tmpl);
    return 0;
  }
  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  UniqueFd& owned_fd() { return fd_; }
  void Commit() { path_.clear(); }

 private:
  UniqueFd fd_;
  std::string path_;
};

void PutFile(Stream& s, const PutRequest& req, TransferDisk* disk) {
  const size_t slash = req.path.rfind('/');
  const std::string dir = slash == 0 ? "/" : req.path.substr(0, slash);
  const std::string base = req.path.substr(slash + 1);
  if (req.mkdirs) {
    if (int e = MakeDirs(dir)) return DrainThenEnd(s, FailErrno(dir, e));
  }
  TempFile tmp;
  if (int e = tmp.Create(dir, base)) return DrainThenEnd(s, FailErrno(dir, e));

  uint64_t bytes = 0;
  int write_err = 0;
  if (req.disk_bytes) {
    // The host sends only the channel's EOF; the content is on the disk.
    uint64_t ignored = 0;
    if (ReadUpload(s, &ignored, [](std::string_view) {}) == Upload::kGone) return;
    CopyErrors copy = CopyDiskToFile(*disk, *req.disk_bytes, tmp.fd());
    if (copy.disk != 0) {
      (void)s.End(Fail("io", "read the transfer disk: " + ErrnoText(copy.disk)));
      return;
    }
    write_err = copy.file;
    bytes = *req.disk_bytes;
  } else if (ReadUpload(s, &bytes, [&](std::string_view data) {
               if (write_err == 0) write_err = WriteAll(tmp.fd(), data);
             }) == Upload::kGone) {
    return;
  }
  if (write_err != 0) {
    (void)s.End(FailErrno(req.path, write_err));
    return;
  }
  int e = 0;
  if (::fchmod(tmp.fd(), req.mode) != 0) e = errno;
  if (e == 0 && req.mtime_ns) {
    struct timespec times[2];
    times[0].tv_sec = 0;
    times[0].tv_nsec = UTIME_OMIT;
    // Floor division, so a time before 1970 keeps 0 <= tv_nsec < 1e9.
    int64_t sec = *req.mtime_ns / 1000000000, nsec = *req.mtime_ns % 1000000000;
    if (nsec < 0) {
      nsec += 1000000000;
      --sec;
    }
    times[1].tv_sec = static_cast<time_t>(sec);
    times[1].tv_nsec = static_cast<long>(nsec);
    if (::futimens(tmp.fd(), times) != 0) e = errno;
  }
  if (e == 0 && ::fsync(tmp.fd()) != 0) e = errno;
  if (e == 0 && !tmp.owned_fd().Close().ok()) e = EIO;
  if (e != 0) {
    (void)s.End(FailErrno(req.path, e));
    return;
  }
  if (::rename(tmp.path().c_str(), req.path.c_str()) != 0) {
    (void)s.End(FailErrno(req.path, errno));
    return;
  }
  tmp.Commit();
  (void)s.End(Ok(bytes));
}

// tar -x of the first `req.disk_bytes` of the transfer disk, which tar reads itself: no copy
// through trybox-init. The host sent only the channel's EOF.
void PutTarFromDisk(Reaper& reaper, Stream& s, const PutRequest& req, TransferDisk& disk) {
  uint64_t ignored = 0;
  if (ReadUpload(s, &ignored, [](std::string_view) {}) == Upload::kGone) return;
  if (int e = MakeDirs(req.path)) {
    (void)s.End(FailErrno(req.path, e));
    return;
  }
  if (Status st = disk.Rewind(); !st.ok()) {
    (void)s.End(Fail("io", st.message()));
    return;
  }
  auto err = MakePipe();
  if (!err.ok()) {
    (void)s.End(Fail("io", err.status().message()));
    return;
  }
  // A tar made by the host ends with its end-of-archive blocks within the bytes announced;
  // what follows on the disk is never read as members.
  SpawnOutcome tar =
      StartTar(reaper, {kTar, "-x", "-p", "-f", "-", "-C", req.path, "--no-same-owner"},
               disk.fd_for_io(), err->write.get(), err->write.get());
  err->write.Reset();
  if (tar.error != SpawnError::kNone) {
    (void)s.End(Fail("tar_failed", tar.message));
    return;
  }
  OutputTail tail(std::move(err->read));
  int status = tar.child->Wait();
  std::string text = tail.Take();
  if (status != 0) {
    (void)s.End(Fail("tar_failed", DescribeTarFailure(status, text)));
    return;
  }
  (void)s.End(Ok(*req.disk_bytes));
}

void PutTar(Reaper& reaper, Stream& s, const PutRequest& req) {
  if (int e = MakeDirs(req.path)) return DrainThenEnd(s, FailErrno(req.path, e));
  auto in = MakePipe();
  auto err = MakePipe();
  if (!in.ok() || !err.ok()) {
    return DrainThenEnd(s, Fail("io", (in.ok() ? err.status() : in.status()).message()));
  }
  ::fcntl(in->write.get(), F_SETPIPE_SZ, kPipeSize);
  SpawnOutcome tar =
      StartTar(reaper, {kTar, "-x", "-p", "-f", "-", "-C", req.path, "--no-same-owner"},
               in->read.get(), err->write.get(), err->write.get());
  in->read.Reset();
  err->write.Reset();
  if (tar.error != SpawnError::kNone) return DrainThenEnd(s, Fail("tar_failed", tar.message));
  OutputTail tail(std::move(err->read));

  uint64_t bytes = 0;
  Upload u = ReadUpload(s, &bytes, [&](std::string_view data) {
    // tar may stop reading early (a corrupt archive); the rest is consumed and dropped.
    if (in->write.valid() && WriteAll(in->write.get(), data) != 0) in->write.Reset();
  });
  in->write.Reset();
  if (u == Upload::kGone) {
    ::kill(-tar.child->pid(), SIGKILL);
    return;
  }
  int status = tar.child->Wait();
  std::string text = tail.Take();
  if (status != 0) {
    (void)s.End(Fail("tar_failed", DescribeTarFailure(status, text)));
    return;
  }
  (void)s.End(Ok(bytes));
}

// ---- get ----

// A get whose content is larger than the channel_max_bytes the host allowed (it then
// takes the transfer disk); `size` when it is known.
Json TooLarge(uint64_t max, std::optional<uint64_t> size = std::nullopt) {
  Json out = Fail("too_large", "the content is larger than the " + std::to_string(max) +
                                   " bytes allowed on the channel");
  if (size) out["size"] = *size;
  return out;
}

Json DiskFull(uint64_t max) {
  return Fail("disk_full", "the content is larger than the " + std::to_string(max) +
                               " bytes the transfer disk was given");
}

void GetFile(Stream& s, const std::string& path, TransferDisk* disk, std::optional<uint64_t> max,
             std::optional<uint64_t> channel_max) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  struct stat st;
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
    (void)s.End(FailErrno(path, errno));
    return;
  }
  if (!S_ISREG(st.st_mode)) {  // replaced since we looked
    (void)s.End(Fail("unsupported", path + ": is " + DescribeFileType(st.st_mode)));
    return;
  }
  Json meta = {{"type", "meta"},
               {"kind", "file"},
               {"mode", st.st_mode & 07777},
               {"mtime_ns", MtimeNs(st)},
               {"size", st.st_size}};
  const bool to_disk = disk != nullptr;
  if (!to_disk && channel_max && static_cast<uint64_t>(st.st_size) > *channel_max) {
    (void)s.End(TooLarge(*channel_max, static_cast<uint64_t>(st.st_size)));
    return;
  }
  if (to_disk && static_cast<uint64_t>(st.st_size) > *max) {
    (void)s.End(DiskFull(*max));
    return;
  }
  if (!s.SendEvent(meta).ok()) return;
  uint64_t bytes = 0;
  if (to_disk) {
    CopyErrors copy = CopyFileToDisk(fd.get(), *disk, *max, &bytes);
    if (copy.disk == ENOSPC) {
      (void)s.End(DiskFull(*max));  // the file grew since the stat
      return;
    }
    if (copy.file != 0) {
      (void)s.End(Fail("io", path + ": " + ErrnoText(copy.file)));
      return;
    }
    if (copy.disk != 0 || ::fsync(disk->fd_for_io()) != 0) {
      const int e = copy.disk != 0 ? copy.disk : errno;
      (void)s.End(Fail("io", "write the transfer disk: " + ErrnoText(e)));
      return;
    }
    (void)s.End(Ok(bytes));
    return;
  }
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<char[]> buf(new char[kChunk]);
  for (;;) {
    auto n = ReadSome(fd.get(), buf.get(), kChunk);
    if (!n.ok()) {
      (void)s.End(Fail("io", path + ": " + n.status().message()));
      return;
    }
    if (*n == 0) break;
    if (!s.Write(channel::kChanOut, std::string_view(buf.get(), *n)).ok()) return;
    bytes += *n;
  }
  if (!s.CloseWrite(channel::kChanOut).ok()) return;
  (void)s.End(Ok(bytes));
}

// tar -c straight onto the transfer disk (tar writes it itself), then flushed; the END
// says how many bytes it holds.
void GetDirToDisk(Reaper& reaper, Stream& s, const GetRequest& req, const struct stat& st,
                  TransferDisk& disk) {
  const uint64_t max = *req.disk_max_bytes;
  auto err = MakePipe();
  if (!err.ok()) {
    (void)s.End(Fail("io", err.status().message()));
    return;
  }
  if (Status r = disk.Rewind(); !r.ok()) {
    (void)s.End(Fail("io", r.message()));
    return;
  }
  if (!s.SendEvent({{"type", "meta"},
                    {"kind", "tar"},
                    {"mode", st.st_mode & 07777},
                    {"mtime_ns", MtimeNs(st)}})
           .ok()) {
    return;
  }
  std::vector<std::string> argv = {kTar, "-c", "-f", "-"};
  for (const auto& x : req.exclude) argv.push_back("--exclude=" + x);
  for (const char* a : {"-C", req.path.c_str(), "."}) argv.push_back(a);
  SpawnOutcome tar = StartTar(reaper, argv, -1, disk.fd_for_io(), err->write.get());
  err->write.Reset();
  if (tar.error != SpawnError::kNone) {
    (void)s.End(Fail("tar_failed", tar.message));
    return;
  }
  OutputTail tail(std::move(err->read));
  int status = tar.child->Wait();
  std::string text = tail.Take();
  // tar's stdout shared our file offset: where it stopped is how much it wrote.
  off_t end = ::lseek(disk.fd_for_io(), 0, SEEK_CUR);
  if (status != 0) {
    bool full = end >= 0 && static_cast<uint64_t>(end) + (20 << 10) > max;
    (void)s.End(full ? DiskFull(max) : Fail("tar_failed", DescribeTarFailure(status, text)));
    return;
  }
  if (end < 0 || ::fsync(disk.fd_for_io()) != 0) {
    (void)s.End(Fail("io", "flush the transfer disk: " + ErrnoText(errno)));
    return;
  }
  Json ok = Ok(static_cast<uint64_t>(end));
  if (!text.empty()) ok["warnings"] = text;
  (void)s.End(ok);
}

void GetDir(Reaper& reaper, Stream& s, const GetRequest& req, const struct stat& st) {
  const std::string& path = req.path;
  auto out = MakePipe();
  auto err = MakePipe();
  if (!out.ok() || !err.ok()) {
    (void)s.End(Fail("io", (out.ok() ? err.status() : out.status()).message()));
    return;
  }
  ::fcntl(out->read.get(), F_SETPIPE_SZ, kPipeSize);
  const Json meta = {
      {"type", "meta"}, {"kind", "tar"}, {"mode", st.st_mode & 07777}, {"mtime_ns", MtimeNs(st)}};
  // With channel_max_bytes the archive is held here until it is known to fit, so that a
  // tree too large for the channel has sent nothing when it says so.
  const std::optional<uint64_t> cap = req.channel_max_bytes;
  if (!cap && !s.SendEvent(meta).ok()) return;
  std::vector<std::string> argv = {kTar, "-c", "-f", "-"};
  for (const auto& x : req.exclude) argv.push_back("--exclude=" + x);
  for (const char* a : {"-C", path.c_str(), "."}) argv.push_back(a);
  SpawnOutcome tar = StartTar(reaper, argv, -1, out->write.get(), err->write.get());
  out->write.Reset();
  err->write.Reset();
  if (tar.error != SpawnError::kNone) {
    (void)s.End(Fail("tar_failed", tar.message));
    return;
  }
  OutputTail tail(std::move(err->read));
  std::unique_ptr<char[]> buf(new char[kChunk]);
  std::string held;
  uint64_t bytes = 0;
  for (;;) {
    auto n = ReadSome(out->read.get(), buf.get(), kChunk);
    if (!n.ok() || *n == 0) break;
    bytes += *n;
    if (cap) {
      if (bytes > *cap) {
        ::kill(-tar.child->pid(), SIGKILL);
        (void)tar.child->Wait();
        (void)s.End(TooLarge(*cap));
        return;
      }
      held.append(buf.get(), *n);
      continue;
    }
    if (!s.Write(channel::kChanOut, std::string_view(buf.get(), *n)).ok()) {
      ::kill(-tar.child->pid(), SIGKILL);
      return;
    }
  }
  int status = tar.child->Wait();
  std::string text = tail.Take();
  if (status != 0) {
    (void)s.End(Fail("tar_failed", DescribeTarFailure(status, text)));
    return;
  }
  if (cap && (!s.SendEvent(meta).ok() || !s.Write(channel::kChanOut, held).ok())) return;
  if (!s.CloseWrite(channel::kChanOut).ok()) return;
  Json ok = Ok(bytes);
  // What tar left out on its own (sockets) is only in its warnings.
  if (!text.empty()) ok["warnings"] = text;
  (void)s.End(ok);
}

}  // namespace

void ServePut(Reaper& reaper, Stream& stream, const Json& request, TransferDisk* disk) {
  auto req = ParsePutRequest(request);
  if (!req.ok()) return DrainThenEnd(stream, Fail("bad_request", req.status().message()));
  std::unique_lock<std::timed_mutex> held;
  if (req->disk_bytes) {
    if (!disk) return DrainThenEnd(stream, Fail("no_transfer_disk", "this guest has none"));
    held = disk->Lock();
    if (!held) return DrainThenEnd(stream, Fail("disk_busy", "another transfer uses the disk"));
    if (Status st = disk->AwaitCapacity(*req->disk_bytes); !st.ok()) {
      return DrainThenEnd(stream, Fail("io", st.message()));
    }
    if (req->kind == PutKind::kTar) return PutTarFromDisk(reaper, stream, *req, *disk);
  }
  if (req->kind == PutKind::kTar) return PutTar(reaper, stream, *req);
  PutFile(stream, *req, disk);
}

void ServeGet(Reaper& reaper, Stream& stream, const Json& request, TransferDisk* disk) {
  auto req = ParseGetRequest(request);
  if (!req.ok()) {
    (void)stream.End(Fail("bad_request", req.status().message()));
    return;
  }
  std::unique_lock<std::timed_mutex> held;
  if (req->disk_max_bytes) {
    if (!disk) {
      (void)stream.End(Fail("no_transfer_disk", "this guest has none"));
      return;
    }
    held = disk->Lock();
    if (!held) {
      (void)stream.End(Fail("disk_busy", "another transfer uses the disk"));
      return;
    }
    if (Status st = disk->AwaitCapacity(*req->disk_max_bytes); !st.ok()) {
      (void)stream.End(Fail("io", st.message()));
      return;
    }
  } else {
    disk = nullptr;
  }
  const std::string& path = req->path;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    int e = errno;
    (void)stream.End(FailErrno(path, e == ENOTDIR ? ENOENT : e));
    return;
  }
  if (S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0) {
    (void)stream.End(
        Fail("unsupported", path + ": is a symbolic link to nowhere (" + ErrnoText(errno) + ")"));
    return;
  }
  if (S_ISREG(st.st_mode)) {
    return GetFile(stream, path, disk, req->disk_max_bytes, req->channel_max_bytes);
  }
  if (S_ISDIR(st.st_mode)) {
    if (disk) return GetDirToDisk(reaper, stream, *req, st, *disk);
    return GetDir(reaper, stream, *req, st);
  }
  (void)stream.End(Fail("unsupported", path + ": is " + DescribeFileType(st.st_mode)));
}

}  // namespace trybox::guest
