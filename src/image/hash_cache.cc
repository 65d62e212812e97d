#include "image/hash_cache.h"

#include <sys/stat.h>
#include <time.h>

#include <algorithm>

#include "util/sha256.h"

namespace trybox::image {
namespace {

int64_t Nanos(const struct timespec& ts) {
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

Result<HashCache::Identity> HashCache::Stat(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError("stat " + path);
  return Identity{st.st_dev, st.st_ino, st.st_size, Nanos(st.st_mtim), Nanos(st.st_ctim)};
}

Result<std::string> HashCache::Sha256(const std::string& path) {
  ASSIGN_OR_RETURN(Identity before, Stat(path));
  {
    MutexLock lock(mu_);
    auto it = entries_.find(path);
    if (it != entries_.end() && it->second.id == before) return it->second.sha256;
  }
  ASSIGN_OR_RETURN(std::string sha, Sha256File(path));
  ASSIGN_OR_RETURN(Identity after, Stat(path));

  // Wall clock on purpose: file timestamps come from it.
  struct timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  bool settled = Nanos(now) - std::max(after.mtime_ns, after.ctime_ns) >= settle_.count();

  MutexLock lock(mu_);
  ++hashes_;
  if (after == before && settled) {
    entries_[path] = Entry{after, sha};
  } else {
    entries_.erase(path);
  }
  return sha;
}

uint64_t HashCache::hashes() const {
  MutexLock lock(mu_);
  return hashes_;
}

}  // namespace trybox::image
