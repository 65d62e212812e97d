#include "cli/tree_tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>

#include "workspace/archive_ptr.h"
#include "workspace/tar.h"

namespace trybox::cli {

using workspace::ArchivePtr;
using workspace::EntryPtr;

Status PackWorkingDirectory(const std::function<Status(std::string_view)>& write) {
  ArchivePtr disk(archive_read_disk_new());
  ArchivePtr out(archive_write_new());
  archive_read_disk_set_standard_lookup(disk.get());
  archive_read_disk_set_behavior(disk.get(), ARCHIVE_READDISK_NO_XATTR);
  archive_write_set_format_pax_restricted(out.get());
  archive_write_set_bytes_per_block(out.get(), 0);  // no padding to 10 KiB blocks
  workspace::TarSink sink(write);
  auto tar_error = [&]() -> Status {
    if (!sink.st.ok()) return sink.st;
    return Internal(std::string("tar: ") + archive_error_string(out.get()));
  };
  if (sink.Open(out.get()) != ARCHIVE_OK) return tar_error();
  if (archive_read_disk_open(disk.get(), ".") != ARCHIVE_OK) {
    return Internal(std::string("read the tree: ") + archive_error_string(disk.get()));
  }
  std::string buf(256 * 1024, '\0');
  for (;;) {
    EntryPtr e(archive_entry_new());
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
  workspace::ExtractOptions opts;
  opts.perm_mask = GuestPermissionMask();
  RETURN_IF_ERROR(workspace::ExtractTar(next_chunk, dest, opts, &report));
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
