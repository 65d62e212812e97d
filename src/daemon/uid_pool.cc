#include "daemon/uid_pool.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

namespace trybox::daemon {

UidLease& UidLease::operator=(UidLease&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = o.pool_;
    uid_ = o.uid_;
    lock_ = std::move(o.lock_);
    o.pool_ = nullptr;
    o.uid_.reset();
  }
  return *this;
}

void UidLease::Release() {
  if (uid_ && pool_) pool_->Return(*uid_);
  uid_.reset();
  pool_ = nullptr;
  lock_.Reset();
}

Result<UidLease> UidPool::Acquire() {
  UidLease lease;
  if (!enabled_) return lease;
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError("mkdir " + dir_);
  MutexLock lock(mu_);
  for (uint32_t i = 0; i < 65536; ++i) {
    uid_t uid = base_ + i;
    if (in_use_.count(uid)) continue;
    std::string path = dir_ + "/" + std::to_string(uid);
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoError("open " + path);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;  // another daemon's VM
    in_use_.insert(uid);
    lease.pool_ = this;
    lease.uid_ = uid;
    lease.lock_ = std::move(fd);
    return lease;
  }
  return ResourceExhausted("no free uid for QEMU in 65536 from the configured base");
}

void UidPool::Return(uid_t uid) {
  MutexLock lock(mu_);
  in_use_.erase(uid);
}

}  // namespace trybox::daemon
