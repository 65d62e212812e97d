#include "guest/cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

namespace trybox::guest {
namespace {

constexpr const char* kBackground = "trybox-background";
constexpr auto kEmptyWait = std::chrono::seconds(2);

void WriteTo(const std::string& path, std::string_view value) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.valid()) (void)WriteFull(fd.get(), value);
}

// True once cgroup.events says "populated 0". Polls for its change notification.
bool WaitUnpopulated(const std::string& dir, std::chrono::steady_clock::time_point deadline) {
  UniqueFd fd(::open((dir + "/cgroup.events").c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  for (;;) {
    char buf[256];
    ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
    if (n < 0) return false;
    buf[n] = '\0';
    if (std::string_view(buf, static_cast<size_t>(n)).find("populated 0") !=
        std::string_view::npos) {
      return true;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    struct pollfd p = {fd.get(), POLLPRI, 0};
    (void)::poll(&p, 1, static_cast<int>(left.count()));
  }
}

// Empty cgroups kept for reuse. Creating and removing a cgroup is the slowest step of an
// exec under TCG (measured in the guest: 59 ms per mkdir+rmdir pair, against 3 ms to join
// one), so finished execs hand theirs back here instead of removing it.
constexpr size_t kMaxIdle = 8;
std::mutex g_pool_mu;
std::vector<std::string>& IdlePool() {
  static std::vector<std::string> idle;
  return idle;
}

std::optional<std::string> TakeIdle() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (IdlePool().empty()) return std::nullopt;
  std::string p = std::move(IdlePool().back());
  IdlePool().pop_back();
  return p;
}

// Keeps `path` (known empty) for reuse; false if the pool is full.
bool GiveBack(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (IdlePool().size() >= kMaxIdle) return false;
  IdlePool().push_back(path);
  return true;
}

}  // namespace

void PrewarmExecCgroups(size_t count) {
  for (size_t i = 0; i < count; ++i) {
    std::string path = std::string(kCgroupRoot) + "/trybox-pool-" + std::to_string(i);
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return;
    if (!GiveBack(path)) return;
  }
}

Result<ExecCgroup> ExecCgroup::Open(std::string path) {
  int procs = ::open((path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  if (procs < 0) return ErrnoError("open " + path + "/cgroup.procs");
  int dir = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    Status st = ErrnoError("open " + path);
    ::close(procs);
    return st;
  }
  return ExecCgroup(std::move(path), UniqueFd(procs), UniqueFd(dir));
}

Result<ExecCgroup> ExecCgroup::Create(const std::string& name) {
  if (auto idle = TakeIdle()) {
    auto cg = Open(*idle);
    if (cg.ok()) return cg;
    ::rmdir(idle->c_str());
  }
  std::string path = std::string(kCgroupRoot) + "/" + name;
  if (::mkdir(path.c_str(), 0755) != 0) return ErrnoError("mkdir " + path);
  auto cg = Open(path);
  if (!cg.ok()) ::rmdir(path.c_str());
  return cg;
}

ExecCgroup::~ExecCgroup() {
  if (path_.empty()) return;
  Kill();
  Remove();
}

void ExecCgroup::Kill() const {
  if (!path_.empty()) WriteTo(path_ + "/cgroup.kill", "1");
}

void ExecCgroup::Release() {
  if (path_.empty()) return;
  std::string dest = std::string(kCgroupRoot) + "/" + kBackground;
  ::mkdir(dest.c_str(), 0755);
  UniqueFd dest_procs(::open((dest + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  // A survivor can fork while we move it; a few rounds catch the children.
  for (int round = 0; round < 8 && dest_procs.valid(); ++round) {
    auto pids = ReadFileToString(path_ + "/cgroup.procs");
    if (!pids.ok() || pids->empty()) break;
    size_t start = 0;
    while (start < pids->size()) {
      size_t nl = pids->find('\n', start);
      if (nl == std::string::npos) nl = pids->size();
      if (nl > start) {
        (void)!::write(dest_procs.get(), pids->data() + start, nl - start);
      }
      start = nl + 1;
    }
  }
  Remove();
}

void ExecCgroup::Remove() {
  procs_.Reset();
  dir_.Reset();
  bool empty = WaitUnpopulated(path_, std::chrono::steady_clock::now());
  if (!empty) {
    // Killed processes leave asynchronously; wait for them before reuse or removal.
    Kill();
    empty = WaitUnpopulated(path_, std::chrono::steady_clock::now() + kEmptyWait);
  }
  if (!empty || !GiveBack(path_)) ::rmdir(path_.c_str());
  path_.clear();
}

void KillAllExecCgroups() {
  DIR* d = ::opendir(kCgroupRoot);
  if (d == nullptr) return;
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind("trybox-", 0) == 0) {
      WriteTo(std::string(kCgroupRoot) + "/" + name + "/cgroup.kill", "1");
    }
  }
  ::closedir(d);
}

}  // namespace trybox::guest
