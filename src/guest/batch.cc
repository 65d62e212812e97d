#include "guest/batch.h"

#include <sched.h>

#include <string>

#include "util/log.h"
#include "util/status.h"

namespace trybox::guest {

void RelayAsBatch(const char* what) {
  const struct sched_param batch = {};
  if (::sched_setscheduler(0, SCHED_BATCH, &batch) != 0) {
    LogWarn("init", ErrnoError(std::string("SCHED_BATCH for ") + what).message());
  }
}

}  // namespace trybox::guest
