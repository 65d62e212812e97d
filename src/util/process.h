// ChildProcess: a process we started, in its own process group. Move-only. The destructor
// kills the whole group with SIGKILL and reaps the leader, so no child outlives its owner
// by accident; call Wait() for an orderly end.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "util/fd.h"
#include "util/status.h"

namespace trybox {

// How a process ended, as waitpid(2) saw it.
struct ExitInfo {
  bool exited = false;  // true: `code` is valid; false: `signal` is valid
  int code = 0;
  int signal = 0;
  std::string Describe() const;
};

// Decodes a waitpid(2) status.
ExitInfo ExitInfoFromWaitStatus(int status);

struct SpawnOptions {
  std::vector<std::string> argv;
  // If set, the child's whole environment; otherwise it inherits ours.
  std::optional<std::vector<std::string>> env;
  std::string cwd;
  // -1 means /dev/null. Fds are dup'ed into 0/1/2 in the child; every other fd is closed.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // Detach from our session entirely (setsid) instead of only a new process group.
  bool new_session = false;
  // Fds the child keeps, as 3, 4, ... in this order (at most 16).
  std::vector<int> keep_fds;
  // A fresh network namespace (only a down `lo`). As root: unshare(CLONE_NEWNET). As anyone
  // else: a new user namespace mapping only our own uid and gid, plus the network namespace.
  bool new_netns = false;
  // Run as this uid and gid with no supplementary groups (needs root).
  std::optional<uid_t> uid;
  std::optional<gid_t> gid;
  std::vector<gid_t> groups;  // supplementary groups when uid/gid are set
  // The child's nice value, set before exec so that every thread it starts inherits it
  // (0: left as ours).
  int nice = 0;
  // The child gets `death_signal` when the thread that spawned it ends (PR_SET_PDEATHSIG),
  // so a killed parent leaves no orphan still writing: for helpers whose output only the
  // parent can use, run by a thread that waits for them. SIGKILL by default; SIGTERM for a
  // child that must clean up after itself (a test's daemon, which then destroys its VMs).
  bool die_with_parent = false;
  int death_signal = SIGKILL;
  // The child gets `death_signal` when this whole process ends, whichever thread asked for
  // it: the spawn runs on a thread that lives as long as the process (a QEMU started by a
  // worker thread that then ends must live on, and die with the daemon, killed or not).
  bool die_with_process = false;
};

class ChildProcess {
 public:
  static Result<ChildProcess> Spawn(const SpawnOptions& opts);

  ChildProcess() = default;
  ChildProcess(ChildProcess&& o) noexcept : pid_(o.pid_) { o.pid_ = -1; }
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // Signals the whole process group.
  Status Signal(int sig) const;
  // Blocks until the leader exits and reaps it.
  Result<ExitInfo> Wait();
  // Reaps if it has exited; nullopt if still running.
  Result<std::optional<ExitInfo>> TryWait();
  // Waits up to `timeout`; on expiry kills the group and reaps.
  Result<ExitInfo> WaitFor(std::chrono::milliseconds timeout);
  // Forgets the child without killing it (it is someone else's to reap now).
  pid_t Release();

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  void KillAndReap();
  pid_t pid_ = -1;
};

// Runs a command to completion, capturing stdout+stderr (capped at 64 KiB, the tail kept).
// Fails with the command's output if it exits non-zero.
struct CommandResult {
  ExitInfo exit;
  std::string output;
};
Result<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                 std::chrono::milliseconds timeout = std::chrono::minutes(30));
// RunCommand that turns a non-zero exit into an error naming the command and its output tail.
Status RunChecked(const std::vector<std::string>& argv,
                  std::chrono::milliseconds timeout = std::chrono::minutes(30));

// Sends `sig` to the process group of every ChildProcess still running in this process.
// For an interrupted command-line tool: killing the children makes the work in progress fail
// and unwind through its own clean-up, instead of leaving them running detached.
void SignalAllChildren(int sig);

// The executable `name` in the directory of the running binary, else `name` found on PATH,
// else `name` itself (for a clear exec error later).
std::string BinaryBesideSelf(const std::string& name);

// True if a process with this pid exists (signal 0 reaches it or EPERM).
bool ProcessExists(pid_t pid);
// /proc/PID/cmdline with NULs turned into spaces; empty if gone.
std::string ProcessCmdline(pid_t pid);
// CPU time (user + system, all threads) process `pid` has used, in ms; an error if it is gone
// or its /proc/PID/stat does not parse.
Result<double> ProcessCpuMs(pid_t pid);
// Pids of processes whose command line (as ProcessCmdline) contains `needle`.
std::vector<pid_t> FindProcesses(const std::string& needle);

// Sets the nice value of every thread of process `pid` (setpriority is per thread).
Status SetProcessNice(pid_t pid, int nice);
// True if this process may lower a nice value it raised (CAP_SYS_NICE or RLIMIT_NICE >= 20):
// tried for real on a thread of its own.
bool CanRestorePriority();

// Finds an executable by name in $PATH (or returns `name` if it contains a slash).
std::optional<std::string> FindInPath(const std::string& name);

}  // namespace trybox
