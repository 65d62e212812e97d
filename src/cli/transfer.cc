#include "cli/transfer.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>

#include "util/fd.h"
#include "workspace/tar.h"

namespace trybox::cli {
namespace {

using Kind = channel::Stream::Message::Kind;

struct ArchiveDeleter {
  void operator()(archive* a) const { archive_free(a); }
};
using ArchivePtr = std::unique_ptr<archive, ArchiveDeleter>;

// Reads the daemon's final reply for a stream after the data is done.
Status FinishReply(channel::Stream& s, Json* end_body) {
  for (;;) {
    auto m = s.Next();
    if (!m.ok()) return m.status().Annotate("tryboxd");
    if (m->kind == Kind::kEnd) {
      if (end_body) *end_body = m->body;
      return StatusFromReply(m->body);
    }
    if (m->kind == Kind::kReset) {
      return Unavailable("tryboxd aborted the transfer: " + m->body.value("reason", ""));
    }
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

// Streams `dir` as a tar (pax) whose entries are relative to it.
Status SendTree(channel::Stream& s, const std::string& dir) {
  ArchivePtr disk(archive_read_disk_new());
  ArchivePtr out(archive_write_new());
  archive_read_disk_set_standard_lookup(disk.get());
  archive_read_disk_set_behavior(disk.get(), ARCHIVE_READDISK_NO_XATTR);
  archive_write_set_format_pax_restricted(out.get());
  archive_write_set_bytes_per_block(out.get(), 0);  // no padding to 10 KiB blocks
  struct Sink {
    channel::Stream* s;
    Status st;
  } sink{&s, Status::Ok()};
  auto write_cb = [](archive*, void* ud, const void* buf, size_t len) -> la_ssize_t {
    auto* k = static_cast<Sink*>(ud);
    k->st = k->s->Write(channel::kChanIn, std::string_view(static_cast<const char*>(buf), len));
    return k->st.ok() ? static_cast<la_ssize_t>(len) : -1;
  };
  if (archive_write_open(out.get(), &sink, nullptr, write_cb, nullptr) != ARCHIVE_OK) {
    return Internal(std::string("tar: ") + archive_error_string(out.get()));
  }
  if (::chdir(dir.c_str()) != 0) return ErrnoError("chdir " + dir);
  if (archive_read_disk_open(disk.get(), ".") != ARCHIVE_OK) {
    return Internal(std::string("read ") + dir + ": " + archive_error_string(disk.get()));
  }
  std::string buf(256 * 1024, '\0');
  for (;;) {
    archive_entry* e = archive_entry_new();
    int r = archive_read_next_header2(disk.get(), e);
    if (r == ARCHIVE_EOF) {
      archive_entry_free(e);
      break;
    }
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      std::string msg = archive_error_string(disk.get());
      archive_entry_free(e);
      return Internal("read " + dir + ": " + msg);
    }
    archive_read_disk_descend(disk.get());
    if (archive_write_header(out.get(), e) != ARCHIVE_OK) {
      archive_entry_free(e);
      if (!sink.st.ok()) return sink.st;
      return Internal(std::string("tar: ") + archive_error_string(out.get()));
    }
    if (archive_entry_filetype(e) == AE_IFREG && archive_entry_size(e) > 0) {
      UniqueFd fd(::open(archive_entry_sourcepath(e), O_RDONLY | O_CLOEXEC));
      if (!fd.valid()) {
        Status st = ErrnoError(std::string("open ") + archive_entry_sourcepath(e));
        archive_entry_free(e);
        return st;
      }
      for (;;) {
        auto n = ReadSome(fd.get(), buf.data(), buf.size());
        if (!n.ok()) {
          archive_entry_free(e);
          return n.status();
        }
        if (*n == 0) break;
        if (archive_write_data(out.get(), buf.data(), *n) < 0) {
          archive_entry_free(e);
          return sink.st.ok() ? Internal(std::string("tar: ") + archive_error_string(out.get()))
                              : sink.st;
        }
      }
    }
    archive_entry_free(e);
  }
  if (archive_write_close(out.get()) != ARCHIVE_OK) {
    return sink.st.ok() ? Internal(std::string("tar: ") + archive_error_string(out.get()))
                        : sink.st;
  }
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
    if (m.kind == Kind::kReset) {
      return Unavailable("tryboxd aborted the transfer: " + m.body.value("reason", ""));
    }
  }
}

}  // namespace

Status ExtractTarSafely(const std::function<Result<std::string>()>& next_chunk,
                        const std::string& dest) {
  workspace::ExtractReport report;
  RETURN_IF_ERROR(workspace::ExtractTar(next_chunk, dest, {}, &report));
  // Devices, fifos and sockets are not copied; an entry that tried to leave the tree is an
  // error (it was not written).
  for (const auto& sk : report.skipped) {
    if (sk.reason.find("device") != std::string::npos || sk.reason == "a fifo" ||
        sk.reason == "a socket") {
      continue;
    }
    return PermissionDenied("refusing tar entry " + sk.path + ": " + sk.reason);
  }
  return Status::Ok();
}

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
  char cwd[4096];
  bool have_cwd = ::getcwd(cwd, sizeof cwd) != nullptr;
  Status sent = stats.kind == "tar" ? SendTree(*s, src) : SendFile(*s, src);
  if (have_cwd) (void)!::chdir(cwd);
  Json end;
  Status fin = FinishReply(*s, &end);
  // The daemon's verdict names the real cause (disk full, missing dir) when both failed.
  if (!fin.ok()) return fin;
  if (!sent.ok()) return sent;
  stats.bytes = end.value("bytes", uint64_t{0});
  return stats;
}

Result<TransferStats> GetPath(Client& client, const std::string& vm, const std::string& guest_path,
                              const std::string& dst) {
  ASSIGN_OR_RETURN(auto s, client.Open({{"verb", "get"}, {"vm", vm}, {"path", guest_path}}));
  // The first message is the meta event, or an END with the error (e.g. not found): in that
  // case nothing is created on the host.
  Json meta;
  for (;;) {
    ASSIGN_OR_RETURN(auto m, s->Next());
    if (m.kind == Kind::kEvent && m.body.value("type", "") == "meta") {
      meta = m.body;
      break;
    }
    if (m.kind == Kind::kEnd) {
      RETURN_IF_ERROR(StatusFromReply(m.body));
      return Internal("get ended without data");
    }
    if (m.kind == Kind::kReset) return Unavailable("tryboxd aborted the transfer");
  }
  TransferStats stats;
  stats.kind = meta.value("kind", "");
  bool eof = false;
  Json early;
  if (stats.kind == "tar") {
    Status st = ExtractTarSafely(
        [&]() -> Result<std::string> {
          ASSIGN_OR_RETURN(std::string c, NextOutChunk(*s, &eof, &early));
          stats.bytes += c.size();
          return c;
        },
        dst);
    if (!st.ok()) {
      (void)s->Reset("extract failed");
      return st;
    }
    RETURN_IF_ERROR(FinishReply(*s, nullptr));
    return stats;
  }
  if (stats.kind != "file") return Internal("unknown transfer kind " + stats.kind);
  std::string target = dst;
  struct stat st;
  if (::stat(dst.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    target = dst + "/" + guest_path.substr(guest_path.rfind('/') + 1);
  }
  // Written beside the target and renamed only after the daemon confirms the whole file.
  std::string tmp = target + ".trybox-part-" + std::to_string(::getpid());
  {
    ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600));
    Status result = Status::Ok();
    for (;;) {
      auto c = NextOutChunk(*s, &eof, &early);
      if (!c.ok()) {
        result = c.status();
        break;
      }
      if (c->empty()) break;
      stats.bytes += c->size();
      result = WriteFull(fd.get(), *c);
      if (!result.ok()) {
        (void)s->Reset("local write failed");
        break;
      }
    }
    if (result.ok()) result = FinishReply(*s, nullptr);
    if (result.ok() && stats.bytes != meta.value("size", uint64_t{0})) {
      result = Internal("short transfer: got " + std::to_string(stats.bytes) + " of " +
                        std::to_string(meta.value("size", uint64_t{0})) + " bytes");
    }
    if (result.ok()) {
      ::fchmod(fd.get(), meta.value("mode", 0644) & 07777);
      int64_t ns = meta.value("mtime_ns", int64_t{0});
      struct timespec ts[2] = {{ns / 1000000000, ns % 1000000000},
                               {ns / 1000000000, ns % 1000000000}};
      ::futimens(fd.get(), ts);
      result = fd.Close();
    }
    if (!result.ok()) {
      ::unlink(tmp.c_str());
      return result;
    }
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    Status err = ErrnoError("rename to " + target);
    ::unlink(tmp.c_str());
    return err;
  }
  return stats;
}

}  // namespace trybox::cli
