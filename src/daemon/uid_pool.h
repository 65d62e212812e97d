// UidPool and UidLease: the uid each VM's QEMU runs as when the daemon is root (egress
// layer 1, docs/architecture.md), unique across every daemon on the host.
//
// A lease is a move-only value: it holds a flock on /run/trybox-qemu-uids/UID for as long as
// it lives (a flock dies with its process, so a crashed daemon's uids come free by
// themselves) and gives the uid back when destroyed. Thread-safe; the pool outlives its
// leases (the daemon destroys VMs before the pool).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "util/fd.h"
#include "util/mutex.h"
#include "util/status.h"

namespace trybox::daemon {

class UidPool;

class UidLease {
 public:
  UidLease() = default;
  UidLease(UidLease&& o) noexcept { *this = std::move(o); }
  UidLease& operator=(UidLease&& o) noexcept;
  UidLease(const UidLease&) = delete;
  UidLease& operator=(const UidLease&) = delete;
  ~UidLease() { Release(); }

  // Unset when QEMU runs as the daemon's own uid.
  std::optional<uid_t> uid() const { return uid_; }
  void Release();

 private:
  friend class UidPool;
  UidPool* pool_ = nullptr;
  std::optional<uid_t> uid_;
  UniqueFd lock_;
};

class UidPool {
 public:
  // `enabled`: the daemon is root and egress.json lets QEMU drop to its own uid.
  UidPool(bool enabled, uint32_t base, std::string lease_dir = "/run/trybox-qemu-uids")
      : enabled_(enabled), base_(base), dir_(std::move(lease_dir)) {}

  bool enabled() const { return enabled_; }
  // A free uid, or an empty lease when disabled.
  Result<UidLease> Acquire() EXCLUDES(mu_);

 private:
  friend class UidLease;
  void Return(uid_t uid) EXCLUDES(mu_);

  const bool enabled_;
  const uint32_t base_;
  const std::string dir_;
  Mutex mu_;
  std::set<uid_t> in_use_ GUARDED_BY(mu_);
};

}  // namespace trybox::daemon
