#include "guest/identity.h"

#include <fcntl.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "util/fd.h"
#include "util/log.h"

namespace trybox::guest {
namespace {

// The guest's disk layer is discarded with the VM; an fsync here only costs time (tens of
// milliseconds of emulated block I/O in a freshly restored clone).
constexpr bool kDurable = false;

// True if some line of an /etc/hosts text lists `name` as one of its names.
bool HostsFileNames(const std::string& text, const std::string& name) {
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(start, nl - start);
    start = nl + 1;
    line = line.substr(0, line.find('#'));
    size_t pos = line.find_first_of(" \t");  // skip the address
    while (pos != std::string::npos) {
      size_t b = line.find_first_not_of(" \t", pos);
      if (b == std::string::npos) break;
      size_t e = line.find_first_of(" \t", b);
      if (line.compare(b, e == std::string::npos ? std::string::npos : e - b, name) == 0) {
        return true;
      }
      pos = e;
    }
  }
  return false;
}

int64_t MonotonicUs() {
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

}  // namespace

Status SetNames(const std::string& hostname, const std::string& machine_id) {
  if (::sethostname(hostname.data(), hostname.size()) != 0) {
    return ErrnoError("sethostname " + hostname);
  }
  Status st = WriteFileAtomic("/etc/hostname", hostname + "\n", 0644, kDurable);
  if (!st.ok()) LogError("init", st.message());
  // Tools that resolve their own hostname (sudo, hostname -f) expect /etc/hosts to know it.
  auto hosts = ReadFileToString("/etc/hosts");
  std::string text = hosts.ok() ? *hosts : "127.0.0.1\tlocalhost\n";
  if (!HostsFileNames(text, hostname)) {
    if (!text.empty() && text.back() != '\n') text += '\n';
    st = WriteFileAtomic("/etc/hosts", text + "127.0.1.1\t" + hostname + "\n", 0644, kDurable);
    if (!st.ok()) LogError("init", st.message());
  }
  if (!machine_id.empty()) {
    // machine-id is 0444 in a Debian root; replace it rather than write through it.
    st = WriteFileAtomic("/etc/machine-id", machine_id + "\n", 0444, kDurable);
    if (!st.ok()) LogError("init", st.message());
  }
  return Status::Ok();
}

Status ReseedRandom(const std::vector<uint8_t>& seed) {
  UniqueFd fd(::open("/dev/random", O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError("open /dev/random");
  size_t words = (seed.size() + 3) / 4;
  std::unique_ptr<uint32_t[]> storage(new uint32_t[2 + words]());
  auto* info = reinterpret_cast<struct rand_pool_info*>(storage.get());
  info->entropy_count = static_cast<int>(seed.size() * 8);
  info->buf_size = static_cast<int>(seed.size());
  std::memcpy(info->buf, seed.data(), seed.size());
  if (::ioctl(fd.get(), RNDADDENTROPY, info) != 0) return ErrnoError("RNDADDENTROPY");
  if (::ioctl(fd.get(), RNDRESEEDCRNG) != 0) return ErrnoError("RNDRESEEDCRNG");
  return Status::Ok();
}

Result<int64_t> SetClock(int64_t time_ns) {
  struct timespec before;
  if (::clock_gettime(CLOCK_REALTIME, &before) != 0) return ErrnoError("clock_gettime");
  struct timespec ts = {static_cast<time_t>(time_ns / 1000000000),
                        static_cast<long>(time_ns % 1000000000)};
  if (::clock_settime(CLOCK_REALTIME, &ts) != 0) return ErrnoError("clock_settime");
  return time_ns - (static_cast<int64_t>(before.tv_sec) * 1000000000 + before.tv_nsec);
}

Status ApplyIdentity(const Identity& id, IdentityTimings* timings) {
  IdentityTimings unused;
  IdentityTimings& t = timings ? *timings : unused;
  int64_t start = MonotonicUs();
  if (!id.seed.empty()) RETURN_IF_ERROR(ReseedRandom(id.seed));
  t.reseed_us = MonotonicUs() - start;
  start = MonotonicUs();
  if (id.time_ns > 0) RETURN_IF_ERROR(SetClock(id.time_ns).status());
  t.clock_us = MonotonicUs() - start;
  start = MonotonicUs();
  Status st = SetNames(id.hostname, id.machine_id);
  t.names_us = MonotonicUs() - start;
  return st;
}

Result<std::string> ReadBootId() {
  ASSIGN_OR_RETURN(std::string s, ReadFileToString("/proc/sys/kernel/random/boot_id"));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace trybox::guest
