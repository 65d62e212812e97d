// ExecCgroup: one cgroup v2 directory per exec (/sys/fs/cgroup/trybox/exec-<id>), so the
// whole process tree an exec starts (daemons, setsid'ed grandchildren) can be killed at
// once with cgroup.kill, whatever it did to its sessions and process groups.
//
// Every command's cgroup lives under /sys/fs/cgroup/trybox, whose pids.max leaves tasks
// for trybox-init (in the root cgroup): a fork or thread bomb in a command cannot take the
// last task slots the server needs for its own threads.
//
// Move-only. The destructor kills what is left and returns the empty directory to a reuse
// pool (or removes it when the pool is full); Release() keeps
// survivors alive by moving them to the shared trybox/background cgroup first (commands
// may legitimately leave a server running for the next exec).
#pragma once

#include <string>
#include <utility>

#include "util/fd.h"
#include "util/status.h"

namespace trybox::guest {

inline constexpr const char* kCgroupRoot = "/sys/fs/cgroup";

inline constexpr const char* kCommandsCgroup = "trybox";
// Tasks (processes and threads) kept out of the commands' reach: the larger of this and an
// eighth of kernel.threads-max.
inline constexpr int kInitReservedTasks = 256;

// Creates /sys/fs/cgroup/trybox under `root` (the cgroup2 root as a read-write directory,
// opened before /sys/fs/cgroup was made read-only for commands: guest/lockdown.h), enables
// the pids controller for it and sets its pids.max. Every exec cgroup is then created
// through it. Call once, at boot; until then no exec cgroup can be created. An error in the
// pids limit leaves the cgroup usable (the error says what failed).
Status SetUpCommandCgroups(UniqueFd root);

class ExecCgroup {
 public:
  // Takes an empty cgroup from the reuse pool, or creates `name` (kAlreadyExists if it
  // exists), and opens its cgroup.procs for the child to join. kFailedPrecondition before
  // SetUpCommandCgroups.
  static Result<ExecCgroup> Create(const std::string& name);

  ExecCgroup(ExecCgroup&& o) noexcept
      : name_(std::exchange(o.name_, {})), procs_(std::move(o.procs_)), dir_(std::move(o.dir_)) {}
  ExecCgroup& operator=(ExecCgroup&&) = delete;
  ExecCgroup(const ExecCgroup&) = delete;
  ~ExecCgroup();

  // The open cgroup.procs, written "0" by the child (SpawnSpec::cgroup_procs_fd).
  int procs_fd_for_child() const { return procs_.get(); }
  // The cgroup directory, for clone3(CLONE_INTO_CGROUP).
  int dir_fd_for_clone() const { return dir_.get(); }
  // SIGKILLs every process in the cgroup (cgroup.kill). Safe to call repeatedly.
  void Kill() const;
  // Sends `sig` to every process in the cgroup (as listed by cgroup.procs; one forked
  // meanwhile may be missed: SIGKILL goes through Kill(), which misses none).
  void Signal(int sig) const;
  // Moves surviving processes to trybox/background, then removes the directory.
  void Release();

 private:
  ExecCgroup(std::string name, UniqueFd procs, UniqueFd dir)
      : name_(std::move(name)), procs_(std::move(procs)), dir_(std::move(dir)) {}
  static Result<ExecCgroup> Open(std::string name);
  // Waits (bounded) for the cgroup to empty, then rmdirs it.
  void Remove();

  std::string name_;  // relative to trybox/; empty once removed or moved from
  UniqueFd procs_;
  UniqueFd dir_;
};

// Creates `count` empty cgroups for the first execs to take (cgroup creation is slow under
// TCG). Call once the cgroup2 filesystem is mounted.
void PrewarmExecCgroups(size_t count);

// Kills every command's tree (everything under trybox/). For shutdown.
void KillAllExecCgroups();

}  // namespace trybox::guest
