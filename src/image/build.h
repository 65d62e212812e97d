// Pieces of BuildImage (image.h) that touch the host, exposed for tests and shared with
// image derivation. Defined in build.cc; BuildImage itself is in base_image.cc.
#pragma once

#include <string>
#include <vector>

#include "util/fd.h"
#include "util/status.h"

namespace trybox::image {

struct AptSources {
  std::string path;
  std::string content;
};

// The host's apt sources file that serves `suite`, to hand to mmdebstrap whole (so the
// guest gets the same mirror, plus the updates and security entries beside it). Searches
// APT_DIR/sources.list.d/ in name order, reading only *.sources (deb822: a stanza with
// Types "deb" whose Suites include `suite`) and *.list (one-line: "deb ... URI SUITE ..."),
// then APT_DIR/sources.list. kNotFound if none mentions the suite.
Result<AptSources> FindAptSources(const std::string& apt_dir, const std::string& suite);

// The words of `s`, split at spaces, tabs and newlines.
std::vector<std::string> Words(const std::string& s);

// fsync(2) of the directory `dir`, or with `whole_fs` syncfs(2) of the file system it is on.
Status SyncDir(const std::string& dir, bool whole_fs);

// Removes a directory tree when it goes out of scope, unless released.
class RemoveOnExit {
 public:
  explicit RemoveOnExit(std::string path) : path_(std::move(path)) {}
  ~RemoveOnExit() {
    if (!path_.empty()) (void)RemoveTree(path_);
  }
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

// The scratch part (an empty 8 GiB ext4 as qcow2) at `out`, its raw file made in `tmp_dir`.
// The same bytes on every call (fixed UUID, hash seed and times): a rebuild of an unchanged
// image keeps its manifest.
Status MakeScratchImage(const std::string& tmp_dir, const std::string& out);

// The time now as a manifest's `created`: "2025-11-30T05:13:00Z".
std::string NowUtc();

// flock(images_root/.lock): one build (or commit) at a time per images_root, across
// processes. kFailedPrecondition if another holds it.
Result<UniqueFd> LockImagesRoot(const std::string& images_root);

// Puts the finished, frozen `build_dir` in place as images_root/NAME (docs/images.md rule
// 5): one renameat2(RENAME_EXCHANGE) with an existing image, whose old directory `cleanup`
// then removes. With the lock held.
Status InstallImageDir(const std::string& images_root, const std::string& name,
                       const std::string& build_dir, RemoveOnExit& cleanup);

// Removes leftovers of builds whose process is gone: DIR/.build-NAME-PID and
// DIR/.old-NAME-PID (images_root), DIR/rootfs-PID-* and DIR/scratch-PID-* (cache tmp).
// A directory with something still mounted under it (an interrupted mmdebstrap) is left
// alone with a warning rather than recursed into. Returns the paths removed.
std::vector<std::string> RemoveStaleBuilds(const std::string& dir);

// What RemoveStaleBuilds would remove in DIR, with the bytes each takes on disk (a
// killed commit's `.build-NAME-PID` holds a whole layer: 377 MB measured), nothing removed.
struct StaleBuild {
  std::string path;
  uint64_t bytes = 0;
};
std::vector<StaleBuild> FindStaleBuilds(const std::string& dir);

}  // namespace trybox::image
