// Workspace tar streams, written and read on the host with libarchive.
//
// In: a tar of exactly the entries of a manifest, read from the user's tree with
// O_NOFOLLOW (symlinks travel as symlinks). Out: a tar from the guest unpacked into a
// host directory that nothing else writes to. Extraction never writes outside `dest`:
// absolute paths, ".." components, hard links that leave the tree and entries that would be
// written through a symbolic link are skipped and named in the report, as are devices,
// fifos and sockets. Nothing is written set-uid, set-gid or sticky, and ownership is never
// restored. Names are bytes, never converted: what the guest's tar holds is what lands on
// the host. Not thread-safe per call (plain functions, no shared state).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"
#include "workspace/exclude.h"
#include "workspace/manifest.h"

struct archive;  // libarchive's writer (archive.h)

namespace trybox::workspace {

// Where a libarchive writer's blocks go: Open(a) opens the writer `a` to hand each block to
// `fn`; the first failure of `fn` is kept in `st` (it names the cause, say a reader that went
// away, better than libarchive's own message). Must outlive the writer.
struct TarSink {
  explicit TarSink(const std::function<Status(std::string_view)>& f) : fn(&f) {}
  // Kept by address: a temporary (a lambda converted on the spot) would be gone.
  explicit TarSink(std::function<Status(std::string_view)>&&) = delete;
  const std::function<Status(std::string_view)>* fn;
  Status st = Status::Ok();
  // archive_write_open's result (ARCHIVE_OK when open).
  int Open(::archive* a);
};

// Writes the entries of `m` (relative to `root`) as a pax tar to `sink`. A file whose size
// no longer matches the manifest is an error naming it (it changed while being copied).
Status WriteTar(const std::string& root, const Manifest& m,
                const std::function<Status(std::string_view)>& sink);

struct ExtractOptions {
  const ExcludeList* excludes = nullptr;  // null: keep everything safe
  // Over either quota extraction stops with kResourceExhausted naming it. 0: no limit.
  uint64_t quota_bytes = 0;    // file content, each file at its full (declared) size
  uint64_t quota_entries = 0;  // entries written or skipped: files, directories, links, ...
  // Entries a commit cannot hold (UnstorablePath: names git refuses, names with a newline)
  // and paths too long for the host's own walk are skipped and named, a refused directory
  // once.
  bool commit_paths_only = false;
  // Skipped entries listed in the report; the rest are only counted. 0: all.
  size_t max_listed_skipped = 0;
  // What went in (a collect's manifest). A regular file that comes back with exactly the
  // content of this manifest's file at the same path (its SHA-256; an entry with a blob id)
  // is not written to `dest`: it goes into the report's `unwritten`, as ManifestFromTree
  // would list it, and the caller adds it to the manifest of `dest`. Files up to
  // kMaxUnwrittenBytes are read whole to decide; larger ones are always written. Null:
  // everything is written (`collect --into`, where the user gets the tree).
  const Manifest* unchanged_from = nullptr;
  // Permission bits kept from the tar (set-uid, set-gid and sticky are always dropped):
  // `trybox cp` drops group and other write too (cli::GuestPermissionMask).
  uint32_t perm_mask = 0777;

  // A workspace collect (docs/workspace.md): exclusions, both quotas, commit paths only, at
  // most kMaxListedSkipped entries listed.
  static ExtractOptions ForCollect(const ExcludeList* excludes, uint64_t quota_bytes,
                                   uint64_t quota_entries);
};

inline constexpr size_t kMaxListedSkipped = 1000;
inline constexpr uint64_t kMaxUnwrittenBytes = uint64_t{8} << 20;

struct ExtractReport {
  std::vector<Skipped> skipped;   // at most max_listed_skipped
  uint64_t skipped_unlisted = 0;  // skipped entries beyond those
  uint64_t files = 0;             // regular files written
  uint64_t bytes = 0;             // content bytes, as counted against quota_bytes
  uint64_t entries = 0;           // entries written or skipped, as counted against quota_entries
  uint64_t excluded = 0;          // entries dropped by the exclude list
  uint64_t tar_bytes = 0;         // bytes of tar stream read
  // With `unchanged_from`: the files left unwritten because their content came back as it
  // went in, each as ManifestFromTree would list it (no blob id). None of these paths exists
  // below `dest`, and no entry below `dest` lies under one of them.
  Manifest unwritten;
};

// Unpacks the tar stream from `next_chunk` ("" at the end) into `dest` (created). With
// `unchanged_from`, the manifest of what came back is ManifestFromTree(dest) plus
// `report->unwritten`, the same as without it.
Status ExtractTar(const std::function<Result<std::string>()>& next_chunk, const std::string& dest,
                  const ExtractOptions& opts, ExtractReport* report);

}  // namespace trybox::workspace
