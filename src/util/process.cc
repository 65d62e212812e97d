#include "util/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "util/sanitizer.h"

namespace trybox {
namespace {

std::mutex g_children_mu;
std::set<pid_t>& LiveChildren() {
  // Never destroyed: a child may be waited for by an exit handler (the e2e harness stops
  // its daemon from one), which runs after the static destructors of anything constructed
  // after the handler was registered, this set included; a destroyed set there was freed
  // twice ("double free or corruption" when a bench died through exit()).
  static auto* live = new std::set<pid_t>;
  return *live;
}
void Track(pid_t pid) {
  std::lock_guard<std::mutex> lock(g_children_mu);
  LiveChildren().insert(pid);
}
void Untrack(pid_t pid) {
  std::lock_guard<std::mutex> lock(g_children_mu);
  LiveChildren().erase(pid);
}

}  // namespace

void SignalAllChildren(int sig) {
  std::lock_guard<std::mutex> lock(g_children_mu);
  for (pid_t p : LiveChildren()) ::kill(-p, sig);
}

std::string ExitInfo::Describe() const {
  if (exited) return "exit code " + std::to_string(code);
  return std::string("signal ") + std::to_string(signal) + " (" + strsignal(signal) + ")";
}

ExitInfo ExitInfoFromWaitStatus(int status) {
  ExitInfo info;
  if (WIFEXITED(status)) {
    info.exited = true;
    info.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    info.signal = WTERMSIG(status);
  }
  return info;
}

namespace {

constexpr size_t kMaxKeep = 16;
constexpr int kHighFd = 100;  // temporary copies live above every target fd

// Everything the child needs, prepared before it exists: after the clone it makes system calls
// only, since it either shares the parent's memory (the vfork way) or is a copy of a process
// whose other threads may hold any lock.
struct ChildPlan {
  const SpawnOptions* opts;
  char* const* argv;
  char* const* envp;
  const char* cwd;
  int err_pipe;
  int devnull;
  bool userns;
  const char* uid_map;
  size_t uid_map_len;
  const char* gid_map;
  size_t gid_map_len;
  pid_t parent;
};

[[noreturn]] void ChildFail(int ep, int stage) {
  int e[2] = {stage, errno};
  (void)!::write(ep, e, sizeof e);
  ::_exit(127);
}

bool ChildWriteFile(const char* path, const char* text, size_t len) {
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, text, len) == static_cast<ssize_t>(len);
  ::close(fd);
  return ok;
}

// The child's side of Spawn; never returns. Ids are set by raw system calls: glibc's setresuid
// and friends would signal every thread of the parent's (shared) memory to change ids too.
int RunChild(void* arg) {
  const ChildPlan& p = *static_cast<const ChildPlan*>(arg);
  const SpawnOptions& opts = *p.opts;
  int ep = p.err_pipe;
  // Handlers first, then the mask: the parent blocked every signal before the clone, so none
  // can reach a handler of the parent's while this process runs on its memory.
  for (int s = 1; s < NSIG; ++s) ::signal(s, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (opts.die_with_parent || opts.die_with_process) {
    if (::prctl(PR_SET_PDEATHSIG, opts.death_signal) != 0) ChildFail(ep, 9);
    if (::getppid() != p.parent) ::_exit(127);  // the parent died before the line above
  }
  const size_t nkeep = opts.keep_fds.size();
  int keep_tmp[kMaxKeep];
  if (nkeep > 0) {
    ep = ::fcntl(p.err_pipe, F_DUPFD_CLOEXEC, kHighFd);
    if (ep < 0) ::_exit(127);
    for (size_t i = 0; i < nkeep; ++i) {
      keep_tmp[i] = ::fcntl(opts.keep_fds[i], F_DUPFD_CLOEXEC, kHighFd);
      if (keep_tmp[i] < 0) ChildFail(ep, 2);
    }
  }
  if (opts.new_netns) {
    if (::unshare(p.userns ? CLONE_NEWUSER | CLONE_NEWNET : CLONE_NEWNET) != 0) ChildFail(ep, 5);
    if (p.userns && (!ChildWriteFile("/proc/self/setgroups", "deny", 4) ||
                     !ChildWriteFile("/proc/self/uid_map", p.uid_map, p.uid_map_len) ||
                     !ChildWriteFile("/proc/self/gid_map", p.gid_map, p.gid_map_len))) {
      ChildFail(ep, 7);
    }
  }
  if (opts.new_session ? ::setsid() < 0 : ::setpgid(0, 0) != 0) ChildFail(ep, 1);
  int in = opts.stdin_fd >= 0 ? opts.stdin_fd : p.devnull;
  int out = opts.stdout_fd >= 0 ? opts.stdout_fd : p.devnull;
  int errfd = opts.stderr_fd >= 0 ? opts.stderr_fd : p.devnull;
  // dup everything above 2 first so a target fd of 0..2 is never clobbered mid-way.
  int fin = ::fcntl(in, F_DUPFD_CLOEXEC, 3), fout = ::fcntl(out, F_DUPFD_CLOEXEC, 3),
      ferr = ::fcntl(errfd, F_DUPFD_CLOEXEC, 3);
  if (fin < 0 || fout < 0 || ferr < 0) ChildFail(ep, 2);
  if (::dup2(fin, 0) < 0 || ::dup2(fout, 1) < 0 || ::dup2(ferr, 2) < 0) ChildFail(ep, 2);
  for (size_t i = 0; i < nkeep; ++i) {
    if (::dup2(keep_tmp[i], static_cast<int>(3 + i)) < 0) ChildFail(ep, 2);
  }
  // Close every other inherited fd except the error pipe (which is CLOEXEC).
  ::syscall(SYS_close_range, 3 + nkeep, ep - 1, 0);
  ::syscall(SYS_close_range, ep + 1, ~0U, 0);
  if (opts.gid || opts.uid) {
    if (::syscall(SYS_setgroups, opts.groups.size(), opts.groups.data()) != 0) ChildFail(ep, 6);
    if (opts.gid && ::syscall(SYS_setresgid, *opts.gid, *opts.gid, *opts.gid) != 0) {
      ChildFail(ep, 6);
    }
    if (opts.uid && ::syscall(SYS_setresuid, *opts.uid, *opts.uid, *opts.uid) != 0) {
      ChildFail(ep, 6);
    }
  }
  if (opts.nice != 0 && ::setpriority(PRIO_PROCESS, 0, opts.nice) != 0) ChildFail(ep, 8);
  // Again after the ids: a change of the effective uid or gid (or entering a user namespace)
  // clears the parent-death signal.
  if (opts.die_with_parent || opts.die_with_process) {
    if (::prctl(PR_SET_PDEATHSIG, opts.death_signal) != 0) ChildFail(ep, 9);
    if (::getppid() != p.parent) ::_exit(127);
  }
  if (p.cwd && ::chdir(p.cwd) != 0) ChildFail(ep, 3);
  // A bare name is looked up in PATH only, never in the working directory: a file of that
  // name there is not the program, and a directory the child may not search (the daemon
  // started from /root, QEMU run as a VM's uid) must not turn the lookup into EACCES.
  if (std::strchr(p.argv[0], '/') == nullptr) {
    ::execvpe(p.argv[0], p.argv, p.envp);
  } else {
    ::execve(p.argv[0], p.argv, p.envp);
  }
  ChildFail(ep, 4);
}

// Starts RunChild(plan) in a new process. Where it can, the vfork way: the child borrows this
// process's memory until its exec, so nothing is copied, and this thread waits meanwhile.
// fork() copied the daemon's page tables and left every page it then wrote to fault once more
// (copy on write), 20-28 ms from fork to the child's exec in this nested VM. Fork remains for
// a new user namespace (the kernel refuses one to a process that shares its memory) and under
// AddressSanitizer (whose bookkeeping would follow the child onto a stack it does not know).
pid_t CloneChild(ChildPlan* plan) {
#ifndef TRYBOX_ASAN
  if (!plan->userns) {
    constexpr size_t kChildStack = 256 * 1024;
    void* stack = ::mmap(nullptr, kChildStack, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) return -1;
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = ::clone(RunChild, static_cast<char*>(stack) + kChildStack,
                        CLONE_VM | CLONE_VFORK | SIGCHLD, plan);
    int saved = errno;
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    ::munmap(stack, kChildStack);
    errno = saved;
    return pid;
  }
#endif
  pid_t pid = ::fork();
  if (pid == 0) RunChild(plan);
  return pid;
}

// The thread that spawns the children that die with the process (die_with_process): the
// kernel sends the parent-death signal when the thread that made the child ends, so this one
// never does. Made on first use, never destroyed; it only waits for work.
class ProcessLongSpawner {
 public:
  static ProcessLongSpawner& Get() {
    static ProcessLongSpawner* s = new ProcessLongSpawner;
    return *s;
  }
  // Runs `job` on the spawner thread and waits for it.
  void Run(const std::function<void()>& job) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t mine = ++queued_;
    jobs_.push_back(&job);
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_ >= mine; });
  }

 private:
  ProcessLongSpawner() {
    // Every signal blocked: the spawner must never run a handler (the children reset theirs).
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    std::thread([this] { Loop(); }).detach();
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !jobs_.empty(); });
      const std::function<void()>* job = jobs_.front();
      jobs_.pop_front();
      lock.unlock();
      (*job)();
      lock.lock();
      ++done_;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<const std::function<void()>*> jobs_;
  uint64_t queued_ = 0;
  uint64_t done_ = 0;
};

}  // namespace

Result<ChildProcess> ChildProcess::Spawn(const SpawnOptions& opts) {
  if (opts.argv.empty()) return InvalidArgument("spawn: empty argv");
  if (opts.die_with_process) {
    std::optional<Result<ChildProcess>> out;
    ProcessLongSpawner::Get().Run([&] {
      SpawnOptions here = opts;
      here.die_with_process = false;
      here.die_with_parent = true;  // the spawner thread's death is the process's
      out.emplace(Spawn(here));
    });
    return std::move(*out);
  }
  std::vector<char*> argv;
  for (const auto& a : opts.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  if (opts.env) {
    for (const auto& e : *opts.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
  }
  if (opts.keep_fds.size() > kMaxKeep) return InvalidArgument("spawn: more than 16 fds to keep");
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0) {
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    return ErrnoError("open /dev/null");
  }
  // A user namespace (non-root netns) maps only our own ids; written by the child itself.
  const bool userns = opts.new_netns && ::geteuid() != 0;
  const std::string uid_map =
      std::to_string(::geteuid()) + " " + std::to_string(::geteuid()) + " 1\n";
  const std::string gid_map =
      std::to_string(::getegid()) + " " + std::to_string(::getegid()) + " 1\n";
  ChildPlan plan{&opts,
                 argv.data(),
                 opts.env ? envp.data() : environ,
                 opts.cwd.empty() ? nullptr : opts.cwd.c_str(),
                 err_pipe[1],
                 devnull,
                 userns,
                 uid_map.c_str(),
                 uid_map.size(),
                 gid_map.c_str(),
                 gid_map.size(),
                 ::getpid()};
  pid_t pid = CloneChild(&plan);
  if (pid < 0) {
    Status st = ErrnoError("fork");
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    ::close(devnull);
    return st;
  }
  ::close(err_pipe[1]);
  ::close(devnull);
  int e[2];
  ssize_t n;
  do {
    n = ::read(err_pipe[0], e, sizeof e);
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  ChildProcess child(pid);
  Track(pid);
  if (n == static_cast<ssize_t>(sizeof e)) {
    (void)child.Wait();
    static const char* kStage[] = {"",
                                   "setpgid",
                                   "dup2",
                                   "chdir",
                                   "execve",
                                   "unshare network namespace",
                                   "set ids",
                                   "map user namespace ids",
                                   "setpriority",
                                   "set the parent-death signal"};
    return ErrnoError(
        std::string(e[0] >= 1 && e[0] <= 9 ? kStage[e[0]] : "spawn") + " " + opts.argv[0], e[1]);
  }
  return child;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    KillAndReap();
    pid_ = o.pid_;
    o.pid_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() { KillAndReap(); }

void ChildProcess::KillAndReap() {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  int status;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  Untrack(pid_);
  pid_ = -1;
}

pid_t ChildProcess::Release() {
  pid_t p = pid_;
  Untrack(p);
  pid_ = -1;
  return p;
}

Status ChildProcess::Signal(int sig) const {
  if (pid_ <= 0) return FailedPrecondition("process already reaped");
  if (::kill(-pid_, sig) != 0 && ::kill(pid_, sig) != 0) return ErrnoError("kill");
  return Status::Ok();
}

Result<ExitInfo> ChildProcess::Wait() {
  if (pid_ <= 0) return FailedPrecondition("process already reaped");
  int status;
  while (::waitpid(pid_, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoError("waitpid");
  }
  Untrack(pid_);
  pid_ = -1;
  return ExitInfoFromWaitStatus(status);
}

Result<std::optional<ExitInfo>> ChildProcess::TryWait() {
  if (pid_ <= 0) return FailedPrecondition("process already reaped");
  int status;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r < 0) return ErrnoError("waitpid");
  if (r == 0) return std::optional<ExitInfo>();
  Untrack(pid_);
  pid_ = -1;
  return std::optional<ExitInfo>(ExitInfoFromWaitStatus(status));
}

Result<ExitInfo> ChildProcess::WaitFor(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return FailedPrecondition("process already reaped");
  // A pidfd makes the wait poll-able without a busy loop.
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd >= 0) {
    struct pollfd p = {pidfd, POLLIN, 0};
    int r;
    do {
      r = ::poll(&p, 1, static_cast<int>(timeout.count()));
    } while (r < 0 && errno == EINTR);
    ::close(pidfd);
    if (r == 0) {
      (void)Signal(SIGKILL);
      ASSIGN_OR_RETURN(ExitInfo info, Wait());
      (void)info;
      return DeadlineExceeded("timed out after " + std::to_string(timeout.count()) + " ms");
    }
  }
  return Wait();
}

Result<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                 std::chrono::milliseconds timeout) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  UniqueFd rd(p[0]), wr(p[1]);
  SpawnOptions opts;
  opts.argv = argv;
  opts.stdout_fd = wr.get();
  opts.stderr_fd = wr.get();
  ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Spawn(opts));
  wr.Reset();
  std::string out;
  std::thread reader([&] {
    char buf[8192];
    for (;;) {
      auto n = ReadSome(rd.get(), buf, sizeof buf);
      if (!n.ok() || *n == 0) break;
      out.append(buf, *n);
      if (out.size() > 128 * 1024) out.erase(0, out.size() - 64 * 1024);
    }
  });
  auto info = child.WaitFor(timeout);
  reader.join();
  if (!info.ok()) return info.status().Annotate(argv[0]);
  if (out.size() > 64 * 1024) out.erase(0, out.size() - 64 * 1024);
  return CommandResult{*info, std::move(out)};
}

Status RunChecked(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(CommandResult r, RunCommand(argv, timeout));
  if (r.exit.exited && r.exit.code == 0) return Status::Ok();
  std::string tail = r.output.size() > 2000 ? r.output.substr(r.output.size() - 2000) : r.output;
  return Internal(argv[0] + " failed (" + r.exit.Describe() + "): " + tail);
}

bool ProcessExists(pid_t pid) {
  if (pid <= 0) return false;
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

std::string ProcessCmdline(pid_t pid) {
  auto s = ReadFileToString("/proc/" + std::to_string(pid) + "/cmdline");
  if (!s.ok()) return "";
  std::string out = *s;
  for (char& c : out)
    if (c == '\0') c = ' ';
  return out;
}

Result<double> ProcessCpuMs(pid_t pid) {
  ASSIGN_OR_RETURN(std::string stat, ReadFileToString("/proc/" + std::to_string(pid) + "/stat"));
  // The command name may hold spaces and parentheses; the fields after its last ')' do not.
  // After it: state is field 3, utime 14, stime 15 (proc(5)).
  size_t at = stat.rfind(')');
  if (at == std::string::npos) return Internal("no command name in /proc/PID/stat: " + stat);
  std::istringstream in(stat.substr(at + 1));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int k = 3; k <= 15 && in >> field; ++k) {
    if (k == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (k == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  if (!in) return Internal("short /proc/PID/stat: " + stat);
  return static_cast<double>(utime + stime) * 1000.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

std::vector<pid_t> FindProcesses(const std::string& needle) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (struct dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    if (ProcessCmdline(static_cast<pid_t>(pid)).find(needle) != std::string::npos) {
      out.push_back(static_cast<pid_t>(pid));
    }
  }
  ::closedir(d);
  return out;
}

std::optional<std::string> FindInPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = ::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string cand = p.substr(start, end - start) + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return std::nullopt;
}

Status SetProcessNice(pid_t pid, int nice) {
  // Two passes: a thread started during the first by a thread not yet changed inherits the
  // old value.
  Status last;
  for (int pass = 0; pass < 2; ++pass) {
    DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/task").c_str());
    if (!d) return ErrnoError("list the threads of " + std::to_string(pid));
    int changed = 0;
    while (dirent* e = ::readdir(d)) {
      int tid = std::atoi(e->d_name);
      if (tid <= 0) continue;
      if (::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice) != 0) {
        if (errno != ESRCH) last = ErrnoError("setpriority of thread " + std::to_string(tid));
        continue;
      }
      ++changed;
    }
    ::closedir(d);
    if (changed == 0 && last.ok()) return NotFound("process " + std::to_string(pid) + " is gone");
  }
  return last;
}

bool CanRestorePriority() {
  bool ok = false;
  std::thread([&] {
    const id_t tid = static_cast<id_t>(::syscall(SYS_gettid));
    const int before = ::getpriority(PRIO_PROCESS, tid);
    if (::setpriority(PRIO_PROCESS, tid, before + 1) != 0) return;
    ok = ::setpriority(PRIO_PROCESS, tid, before) == 0;
  }).join();
  return ok;
}

std::string BinaryBesideSelf(const std::string& name) {
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    std::string beside = std::string(::dirname(self)) + "/" + name;
    if (::access(beside.c_str(), X_OK) == 0) return beside;
  }
  return FindInPath(name).value_or(name);
}

}  // namespace trybox
