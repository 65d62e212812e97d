#include "cli/tree_tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>

#include <memory>

#include "workspace/tar.h"

namespace trybox::cli {
namespace {

struct ArchiveDeleter {
  void operator()(archive* a) const { archive_free(a); }
};
using ArchivePtr = std::unique_ptr<archive, ArchiveDeleter>;
using EntryPtr = std::unique_ptr<archive_entry, decltype(&archive_entry_free)>;

}  // namespace

Status PackWorkingDirectory(const std::function<Status(std::string_view)>& write) {
  ArchivePtr disk(archive_read_disk_new());
  ArchivePtr out(archive_write_new());
  archive_read_disk_set_standard_lookup(disk.get());
  archive_read_disk_set_behavior(disk.get(), ARCHIVE_READDISK_NO_XATTR);
  archive_write_set_format_pax_restricted(out.get());
  archive_write_set_bytes_per_block(out.get(), 0);  // no padding to 10 KiB blocks
  struct Sink {
    const std::function<Status(std::string_view)>* write;
    Status st;
  } sink{&write, Status::Ok()};
  auto write_cb = [](archive*, void* ud, const void* buf, size_t len) -> la_ssize_t {
    auto* k = static_cast<Sink*>(ud);
    k->st = (*k->write)(std::string_view(static_cast<const char*>(buf), len));
    return k->st.ok() ? static_cast<la_ssize_t>(len) : -1;
  };
  // The sink's failure (the reader went away) names the cause better than libarchive's.
  auto tar_error = [&]() -> Status {
    if (!sink.st.ok()) return sink.st;
    return Internal(std::string("tar: ") + archive_error_string(out.get()));
  };
  if (archive_write_open(out.get(), &sink, nullptr, write_cb, nullptr) != ARCHIVE_OK) {
    return tar_error();
  }
  if (archive_read_disk_open(disk.get(), ".") != ARCHIVE_OK) {
    return Internal(std::string("read the tree: ") + archive_error_string(disk.get()));
  }
  std::string buf(256 * 1024, '\0');
  for (;;) {
    EntryPtr e(archive_entry_new(), archive_entry_free);
    int r = archive_read_next_header2(disk.get(), e.get());
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      return Internal(std::string("read the tree: ") + archive_error_string(disk.get()));
    }
    archive_read_disk_descend(disk.get());
    if (archive_write_header(out.get(), e.get()) != ARCHIVE_OK) return tar_error();
    if (archive_entry_filetype(e.get()) != AE_IFREG || archive_entry_size(e.get()) <= 0) continue;
    UniqueFd fd(::open(archive_entry_sourcepath(e.get()), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoError(std::string("open ") + archive_entry_sourcepath(e.get()));
    for (;;) {
      ASSIGN_OR_RETURN(size_t n, ReadSome(fd.get(), buf.data(), buf.size()));
      if (n == 0) break;
      if (archive_write_data(out.get(), buf.data(), n) < 0) return tar_error();
    }
  }
  if (archive_write_close(out.get()) != ARCHIVE_OK) return tar_error();
  return Status::Ok();
}

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

}  // namespace trybox::cli
