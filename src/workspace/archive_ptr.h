// Owning pointers for libarchive's handles, shared by the workspace's tar writers and
// readers. Header-only; no state.
#pragma once

#include <archive.h>
#include <archive_entry.h>

#include <memory>

namespace trybox::workspace {

struct ArchiveDeleter {
  void operator()(archive* a) const { archive_free(a); }
};
using ArchivePtr = std::unique_ptr<archive, ArchiveDeleter>;

struct EntryDeleter {
  void operator()(archive_entry* e) const { archive_entry_free(e); }
};
using EntryPtr = std::unique_ptr<archive_entry, EntryDeleter>;

}  // namespace trybox::workspace
