#include "daemon/workspace_disk.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "util/fd.h"
#include "util/utf8.h"

namespace trybox::daemon {
namespace {

namespace ws = trybox::workspace;
using Clock = std::chrono::steady_clock;

// How long the guest may take to flush /workspace and freeze it: everything the workload
// left dirty is written first.
constexpr auto kFreezeTimeout = std::chrono::minutes(2);
constexpr size_t kChunk = 1 << 20;
// What a reader may still write after the tar's end (libarchive pads to 10 KiB), and on
// stderr (one line per socket, at most 1,000 of them).
constexpr uint64_t kMaxTrailingBytes = uint64_t{16} << 20;
constexpr size_t kMaxStderrBytes = size_t{16} << 20;

}  // namespace

std::string DefaultExt4TarBinary() { return BinaryBesideSelf("trybox-ext4tar"); }

Status MountWorkspace(GuestChannel& guest, WorkspaceDiskPort& disk, const std::string& root,
                      const ws::Manifest& m, const ws::Ext4Geometry& geo, bool written) {
  if (!written) RETURN_IF_ERROR(ws::WriteExt4ImageToFd(root, m, disk.fd_for_io(), geo));
  RETURN_IF_ERROR(disk.Announce(geo.bytes));
  return GuestCall(guest, {{"op", "workspace_mount"}, {"disk", {{"bytes", geo.bytes}}}},
                   "mount the workspace disk")
      .status();
}

Result<std::unique_ptr<WorkspaceDiskReader>> WorkspaceDiskReader::Open(GuestChannel& guest,
                                                                       WorkspaceDiskPort& disk,
                                                                       const Options& opts) {
  ASSIGN_OR_RETURN(auto stream, guest.Open({{"op", "workspace_freeze"}}));
  std::unique_ptr<WorkspaceDiskReader> r(new WorkspaceDiskReader(guest, stream));
  // The file system is read only once the guest says it is frozen.
  const auto deadline = Clock::now() + kFreezeTimeout;
  for (;;) {
    auto msg = stream->Next(deadline);
    if (!msg.ok()) return GuestGone(guest, msg.status().Annotate("freeze /workspace"));
    using Kind = channel::Stream::Message::Kind;
    if (msg->kind == Kind::kEvent && msg->body.is_object() &&
        msg->body.value("type", "") == "frozen") {
      break;
    }
    if (msg->kind == Kind::kEnd) {
      r->thawed_ = true;
      return GuestRefusal(msg->body, "freeze /workspace");
    }
    if (msg->kind == Kind::kReset) {
      r->thawed_ = true;
      return GuestGone(guest, GuestAborted(msg->body));
    }
  }
  // A descriptor of its own, read-only, for the reader: never the path, which is in a
  // directory QEMU's uid owns.
  ASSIGN_OR_RETURN(UniqueFd image, OpenFile("/proc/self/fd/" + std::to_string(disk.fd_for_io()),
                                            O_RDONLY | O_CLOEXEC));
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return ErrnoError("pipe for trybox-ext4tar");
  r->out_ = UniqueFd(out[0]);
  UniqueFd out_w(out[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) return ErrnoError("pipe for trybox-ext4tar");
  r->err_ = UniqueFd(err[0]);
  UniqueFd err_w(err[1]);
  SpawnOptions so;
  so.argv = {opts.binary, std::to_string(opts.max_entries)};
  if (opts.max_bytes > 0) {
    so.argv.insert(so.argv.end(), {"--max-bytes", std::to_string(opts.max_bytes)});
  }
  std::optional<uid_t> uid = disk.reader_uid();
  // A root daemon without a uid pool still never reads a guest's file system as root.
  if (!uid && ::geteuid() == 0) uid = 65534;
  if (uid) so.argv.insert(so.argv.end(), {"--uid", std::to_string(*uid)});
  so.env = std::vector<std::string>{};
  so.stdout_fd = out_w.get();
  so.stderr_fd = err_w.get();
  so.keep_fds = {image.get()};
  so.die_with_parent = true;
  ASSIGN_OR_RETURN(r->child_, ChildProcess::Spawn(so));
  return r;
}

WorkspaceDiskReader::~WorkspaceDiskReader() {
  if (child_.running()) (void)child_.Signal(SIGKILL);
  if (!thawed_) (void)Thaw();
}

Result<std::string> WorkspaceDiskReader::Next() {
  std::string buf(kChunk, '\0');
  ASSIGN_OR_RETURN(size_t n, ReadSome(out_.get(), buf.data(), buf.size()));
  // A reader that failed part-way ends its output early: its own reason, not a cut tar's.
  if (n == 0) RETURN_IF_ERROR(Reap());
  buf.resize(n);
  return buf;
}

Status WorkspaceDiskReader::Finish() {
  Status reaped = Reap();
  Status thaw = Thaw();
  return reaped.ok() ? thaw : reaped;
}

Status WorkspaceDiskReader::Reap() {
  if (reaped_) return *reaped_;
  // The unpacking may stop at the tar's end-of-archive blocks: the rest of stdout (padding)
  // is drained, within a bound, so that the reader can exit; then all of stderr.
  std::string buf(kChunk, '\0');
  bool ended = false;
  for (uint64_t drained = 0; !ended && drained < kMaxTrailingBytes;) {
    auto n = ReadSome(out_.get(), buf.data(), buf.size());
    ended = !n.ok() || *n == 0;
    if (n.ok()) drained += *n;
  }
  // A reader that goes on writing past the tar is not one trybox built.
  if (!ended) (void)child_.Signal(SIGKILL);
  std::string err;
  while (err.size() < kMaxStderrBytes) {
    auto n = ReadSome(err_.get(), buf.data(), buf.size());
    if (!n.ok() || *n == 0) break;
    err.append(buf.data(), *n);
  }
  auto exit = child_.Wait();
  std::string why;
  for (size_t at = 0; at < err.size();) {
    size_t nl = err.find('\n', at);
    std::string line = err.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? err.size() : nl + 1;
    if (line.rfind("skipped\t", 0) == 0) {
      auto path = HexDecode(std::string_view(line).substr(8));
      if (path) skipped_.push_back({*path, "a socket (a tar cannot hold it)"});
    } else if (line.rfind("skipped_more\t", 0) == 0) {
      skipped_unlisted_ += std::strtoull(line.c_str() + 13, nullptr, 10);
    } else if (!line.empty()) {
      why = line;
    }
  }
  if (!exit.ok()) {
    reaped_ = exit.status().Annotate("wait for trybox-ext4tar");
  } else if (!exit->exited || exit->code != 0) {
    reaped_ = InvalidArgument("the workspace disk could not be read (" + exit->Describe() +
                              (why.empty() ? "" : ": " + why) + ")");
  } else {
    reaped_ = Status::Ok();
  }
  return *reaped_;
}

void WorkspaceDiskReader::Abort(const std::string& why) {
  if (child_.running()) (void)child_.Signal(SIGKILL);
  (void)child_.Wait();
  if (!thawed_) {
    thawed_ = true;
    (void)freeze_->Reset(why);
  }
}

Status WorkspaceDiskReader::Thaw() {
  thawed_ = true;
  RETURN_IF_ERROR(freeze_->CloseWrite(0));
  return AwaitGuestOk(guest_, *freeze_, "thaw /workspace").status();
}

}  // namespace trybox::daemon
