// HashCache: SHA-256 of files, remembered while the file provably has not changed.
//
// A file's identity is (path, st_dev, st_ino, size, mtime, ctime). A write changes mtime and
// ctime, a chmod or rename-over changes ctime or the inode, and ctime cannot be set from user
// space, so an unchanged identity means unchanged content, with one trap: timestamps
// have coarse granularity, so a file written again within the same tick as our hash keeps its
// identity. Files touched less than `settle` ago are therefore hashed but not remembered
// (git's "racy clean" rule).
//
// Thread-safe. Two threads asking for the same new file may both hash it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "util/mutex.h"
#include "util/status.h"
#include "util/thread_annotations.h"

namespace trybox::image {

class HashCache {
 public:
  explicit HashCache(std::chrono::nanoseconds settle = std::chrono::seconds(2)) : settle_(settle) {}
  HashCache(const HashCache&) = delete;
  HashCache& operator=(const HashCache&) = delete;

  // Lowercase hex SHA-256 of the file at `path`; reads it only if not remembered.
  Result<std::string> Sha256(const std::string& path);

  // How many times a file was actually read (for tests).
  uint64_t hashes() const;

 private:
  struct Identity {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    int64_t ctime_ns = 0;
    bool operator==(const Identity&) const = default;
  };
  struct Entry {
    Identity id;
    std::string sha256;
  };
  static Result<Identity> Stat(const std::string& path);

  const std::chrono::nanoseconds settle_;
  mutable Mutex mu_;
  std::map<std::string, Entry> entries_ GUARDED_BY(mu_);  // one per path: the latest hash
  uint64_t hashes_ GUARDED_BY(mu_) = 0;
};

}  // namespace trybox::image
