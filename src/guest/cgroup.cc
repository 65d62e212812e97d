#include "guest/cgroup.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

namespace trybox::guest {
namespace {

constexpr const char* kBackground = "background";
constexpr auto kEmptyWait = std::chrono::seconds(2);

// trybox/, read-write. Set once at boot and never closed; -1 until then.
std::atomic<int> g_root{-1};

Status WriteFileAt(int dir, const std::string& rel, std::string_view value) {
  UniqueFd fd(::openat(dir, rel.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError("open " + rel);
  return WriteFull(fd.get(), value).Annotate("write " + rel);
}

void WriteAt(const std::string& rel, std::string_view value) {
  (void)WriteFileAt(g_root, rel, value);
}

std::string ReadAt(const std::string& rel) {
  std::string out;
  UniqueFd fd(::openat(g_root, rel.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return out;
  char buf[4096];
  for (;;) {
    auto n = ReadSome(fd.get(), buf, sizeof buf);
    if (!n.ok() || *n == 0) return out;
    out.append(buf, *n);
  }
}

std::string Describe(const std::string& name) {
  return std::string(kCgroupRoot) + "/" + kCommandsCgroup + "/" + name;
}

// True once cgroup.events says "populated 0". Polls for its change notification.
bool WaitUnpopulated(const std::string& name, std::chrono::steady_clock::time_point deadline) {
  UniqueFd fd(::openat(g_root, (name + "/cgroup.events").c_str(), O_RDONLY | O_CLOEXEC));
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

// Keeps `name` (known empty) for reuse; false if the pool is full.
bool GiveBack(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (IdlePool().size() >= kMaxIdle) return false;
  IdlePool().push_back(name);
  return true;
}

}  // namespace

Status SetUpCommandCgroups(UniqueFd root) {
  const std::string where = std::string(kCgroupRoot) + "/" + kCommandsCgroup;
  if (::mkdirat(root.get(), kCommandsCgroup, 0755) != 0 && errno != EEXIST) {
    return ErrnoError("mkdir " + where);
  }
  int commands = ::openat(root.get(), kCommandsCgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (commands < 0) return ErrnoError("open " + where);
  g_root = commands;
  auto max = ReadFileToString("/proc/sys/kernel/threads-max");
  if (!max.ok()) return max.status();
  const long threads = std::atol(max->c_str());
  const long limit = threads - std::max<long>(kInitReservedTasks, threads / 8);
  if (limit <= 0) return Internal("kernel.threads-max is " + *max);
  RETURN_IF_ERROR(WriteFileAt(root.get(), "cgroup.subtree_control", "+pids")
                      .Annotate(std::string("enable pids in ") + kCgroupRoot));
  return WriteFileAt(commands, "pids.max", std::to_string(limit)).Annotate(where);
}

void PrewarmExecCgroups(size_t count) {
  for (size_t i = 0; i < count; ++i) {
    std::string name = "pool-" + std::to_string(i);
    if (::mkdirat(g_root, name.c_str(), 0755) != 0 && errno != EEXIST) return;
    if (!GiveBack(name)) return;
  }
}

Result<ExecCgroup> ExecCgroup::Open(std::string name) {
  int procs = ::openat(g_root, (name + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  if (procs < 0) return ErrnoError("open " + Describe(name) + "/cgroup.procs");
  int dir = ::openat(g_root, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    Status st = ErrnoError("open " + Describe(name));
    ::close(procs);
    return st;
  }
  return ExecCgroup(std::move(name), UniqueFd(procs), UniqueFd(dir));
}

Result<ExecCgroup> ExecCgroup::Create(const std::string& name) {
  if (g_root < 0) return FailedPrecondition("no command cgroups (set up at boot)");
  if (auto idle = TakeIdle()) {
    auto cg = Open(*idle);
    if (cg.ok()) return cg;
    ::unlinkat(g_root, idle->c_str(), AT_REMOVEDIR);
  }
  if (::mkdirat(g_root, name.c_str(), 0755) != 0) {
    return ErrnoError("mkdir " + Describe(name));
  }
  auto cg = Open(name);
  if (!cg.ok()) ::unlinkat(g_root, name.c_str(), AT_REMOVEDIR);
  return cg;
}

ExecCgroup::~ExecCgroup() {
  if (name_.empty()) return;
  Kill();
  Remove();
}

void ExecCgroup::Kill() const {
  if (!name_.empty()) WriteAt(name_ + "/cgroup.kill", "1");
}

void ExecCgroup::Signal(int sig) const {
  if (name_.empty()) return;
  if (sig == SIGKILL) {
    Kill();
    return;
  }
  std::string pids = ReadAt(name_ + "/cgroup.procs");
  for (size_t start = 0; start < pids.size();) {
    size_t nl = pids.find('\n', start);
    if (nl == std::string::npos) nl = pids.size();
    pid_t pid = static_cast<pid_t>(std::atoi(pids.substr(start, nl - start).c_str()));
    if (pid > 0) ::kill(pid, sig);
    start = nl + 1;
  }
}

void ExecCgroup::Release() {
  if (name_.empty()) return;
  ::mkdirat(g_root, kBackground, 0755);
  UniqueFd dest_procs(
      ::openat(g_root, (std::string(kBackground) + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  // A survivor can fork while we move it; a few rounds catch the children.
  for (int round = 0; round < 8 && dest_procs.valid(); ++round) {
    std::string pids = ReadAt(name_ + "/cgroup.procs");
    if (pids.empty()) break;
    size_t start = 0;
    while (start < pids.size()) {
      size_t nl = pids.find('\n', start);
      if (nl == std::string::npos) nl = pids.size();
      if (nl > start) {
        (void)!::write(dest_procs.get(), pids.data() + start, nl - start);
      }
      start = nl + 1;
    }
  }
  Remove();
}

void ExecCgroup::Remove() {
  procs_.Reset();
  dir_.Reset();
  bool empty = WaitUnpopulated(name_, std::chrono::steady_clock::now());
  if (!empty) {
    // Killed processes leave asynchronously; wait for them before reuse or removal.
    Kill();
    empty = WaitUnpopulated(name_, std::chrono::steady_clock::now() + kEmptyWait);
  }
  if (!empty || !GiveBack(name_)) ::unlinkat(g_root, name_.c_str(), AT_REMOVEDIR);
  name_.clear();
}

void KillAllExecCgroups() { WriteAt("cgroup.kill", "1"); }

}  // namespace trybox::guest
