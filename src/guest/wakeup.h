// Wakeup: a one-shot flag that threads can poll(2) on (an eventfd that, once signalled,
// stays readable). Thread-safe; move-only.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <utility>

#include "util/fd.h"
#include "util/status.h"

namespace trybox::guest {

class Wakeup {
 public:
  static Result<Wakeup> Make() {
    int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return ErrnoError("eventfd");
    return Wakeup(UniqueFd(fd));
  }
  void Signal() const {
    uint64_t one = 1;
    (void)!::write(fd_.get(), &one, sizeof one);
  }
  int fd_for_poll() const { return fd_.get(); }

 private:
  explicit Wakeup(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace trybox::guest
