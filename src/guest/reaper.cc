#include "guest/reaper.h"

#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#if defined(__x86_64__)
// clone3 whose child runs fn(arg) on the stack named in `args`, then exits with what fn
// returned; the parent gets the child's pid, or -errno. The child of a CLONE_VM clone3
// resumes from the syscall on its new, empty stack, where no C++ frame can return to; so
// this is a few instructions, as glibc's own clone3.S (which it does not export).
extern "C" long trybox_clone3_run(struct clone_args* args, size_t size, int (*fn)(void*),
                                  void* arg);
asm(R"(
  .text
  .globl trybox_clone3_run
  .hidden trybox_clone3_run
  .type trybox_clone3_run, @function
trybox_clone3_run:
  mov %rdx, %r8
  mov %rcx, %r9
  mov $435, %eax
  syscall
  test %rax, %rax
  jz 1f
  ret
1:
  xor %ebp, %ebp
  and $-16, %rsp
  mov %r9, %rdi
  call *%r8
  mov %eax, %edi
  mov $60, %eax
  syscall
  hlt
  .size trybox_clone3_run, .-trybox_clone3_run
)");
#endif

namespace trybox::guest {
namespace {

// The child's stack while it borrows our address space (until its execve).
constexpr size_t kChildStack = 256 * 1024;

int RunInChild(void* arg) {
  (*static_cast<const std::function<void()>*>(arg))();
  ::_exit(127);
}

}  // namespace

bool ChildWatch::exited() const {
  MutexLock lock(mu_);
  return done_;
}

int ChildWatch::Wait() const {
  for (;;) {
    {
      MutexLock lock(mu_);
      if (done_) return status_;
    }
    struct pollfd p = {reaped_.fd_for_poll(), POLLIN, 0};
    (void)::poll(&p, 1, -1);
  }
}

std::chrono::steady_clock::time_point ChildWatch::exit_time() const {
  MutexLock lock(mu_);
  return exit_time_;
}

void ChildWatch::Complete(int status) {
  {
    MutexLock lock(mu_);
    done_ = true;
    status_ = status;
    exit_time_ = std::chrono::steady_clock::now();
  }
  reaped_.Signal();
}

void BlockChildSignal() {
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);
}

Reaper::~Reaper() {
  if (thread_.joinable()) thread_.detach();
}

void Reaper::Start() {
  thread_ = std::thread([this] { Loop(); });
}

Result<std::shared_ptr<ChildWatch>> Reaper::Fork(const std::function<void()>& in_child) {
  ASSIGN_OR_RETURN(Wakeup reaped, Wakeup::Make());
  std::shared_ptr<ChildWatch> watch(new ChildWatch(std::move(reaped)));
  // clone(CLONE_VM|CLONE_VFORK) on a stack of its own, as posix_spawn does: the child
  // borrows our address space until it execs, so no page tables are copied. Under TCG that
  // matters: every page-table copy and the TLB flushes that follow cost real time.
  std::unique_ptr<char[]> stack(new char[kChildStack]);
  MutexLock lock(mu_);
  pid_t pid = ::clone(RunInChild, stack.get() + kChildStack, CLONE_VM | CLONE_VFORK | SIGCHLD,
                      const_cast<std::function<void()>*>(&in_child));
  if (pid < 0) return ErrnoError("clone");
  watch->pid_ = pid;
  children_[pid] = watch;
  return watch;
}

Result<std::shared_ptr<ChildWatch>> Reaper::ForkIntoCgroup(const std::function<void()>& in_child,
                                                           int cgroup_dir_fd) {
  ASSIGN_OR_RETURN(Wakeup reaped, Wakeup::Make());
  std::shared_ptr<ChildWatch> watch(new ChildWatch(std::move(reaped)));
  // Joining a cgroup by writing cgroup.procs takes the cgroup write lock, an RCU grace
  // period: measured 18 ms of a 38 ms /bin/true under TCG. Being born in it does not.
  struct clone_args args;
  std::memset(&args, 0, sizeof args);
  args.exit_signal = SIGCHLD;
  args.cgroup = static_cast<uint64_t>(cgroup_dir_fd);
#if defined(__x86_64__)
  // As Fork: the child borrows our address space until it execs (CLONE_VM|CLONE_VFORK on
  // a stack of its own). A copy of trybox-init's page tables and the copy-on-write faults
  // after it were most of a /bin/true's spawn-to-exit under TCG.
  std::unique_ptr<char[]> stack(new char[kChildStack]);
  args.flags = CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP;
  args.stack = reinterpret_cast<uint64_t>(stack.get());
  args.stack_size = kChildStack;
  MutexLock lock(mu_);
  long pid = trybox_clone3_run(&args, sizeof args, RunInChild,
                               const_cast<std::function<void()>*>(&in_child));
  if (pid < 0) {
    errno = static_cast<int>(-pid);
    pid = -1;
  }
#else
  // CLONE_VFORK without CLONE_VM: fork semantics (the child returns here on its own copy),
  // and we are resumed once it has exec'd or exited.
  args.flags = CLONE_VFORK | CLONE_INTO_CGROUP;
  MutexLock lock(mu_);
  long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) RunInChild(const_cast<std::function<void()>*>(&in_child));
#endif
  if (pid < 0) {
    if (errno == ENOSYS || errno == EINVAL || errno == E2BIG) {
      return FailedPrecondition("clone3 into a cgroup is not supported here");
    }
    return ErrnoError("clone3");
  }
  watch->pid_ = static_cast<pid_t>(pid);
  children_[watch->pid_] = watch;
  return watch;
}

void Reaper::Deliver(pid_t pid, int status) {
  std::shared_ptr<ChildWatch> watch;
  {
    // Blocks while a Fork holds the lock, so a child reaped before it was registered is
    // looked up only after registration.
    MutexLock lock(mu_);
    auto it = children_.find(pid);
    if (it == children_.end()) return;  // an orphan: reaping it was the whole job
    watch = std::move(it->second);
    children_.erase(it);
  }
  watch->Complete(status);
}

void Reaper::Loop() {
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  for (;;) {
    // Drain before waiting: SIGCHLD coalesces, and children may predate this thread.
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG | __WALL);
      if (pid <= 0) {
        if (pid < 0 && errno == EINTR) continue;
        break;
      }
      Deliver(pid, status);
    }
    siginfo_t info;
    while (::sigwaitinfo(&chld, &info) < 0 && errno == EINTR) {
    }
  }
}

}  // namespace trybox::guest
