// ExecCgroup: one cgroup v2 directory per exec (/sys/fs/cgroup/trybox-exec-<id>), so the
// whole process tree an exec starts (daemons, setsid'ed grandchildren) can be killed at
// once with cgroup.kill, whatever it did to its sessions and process groups.
//
// Move-only. The destructor kills what is left and returns the empty directory to a reuse
// pool (or removes it when the pool is full); Release() keeps
// survivors alive by moving them to the shared trybox-background cgroup first (commands
// may legitimately leave a server running for the next exec).
#pragma once

#include <string>
#include <utility>

#include "util/fd.h"
#include "util/status.h"

namespace trybox::guest {

inline constexpr const char* kCgroupRoot = "/sys/fs/cgroup";

class ExecCgroup {
 public:
  // Takes an empty cgroup from the reuse pool, or creates `name` (kAlreadyExists if it
  // exists), and opens its cgroup.procs for the child to join.
  static Result<ExecCgroup> Create(const std::string& name);

  ExecCgroup(ExecCgroup&& o) noexcept
      : path_(std::exchange(o.path_, {})), procs_(std::move(o.procs_)), dir_(std::move(o.dir_)) {}
  ExecCgroup& operator=(ExecCgroup&&) = delete;
  ExecCgroup(const ExecCgroup&) = delete;
  ~ExecCgroup();

  // The open cgroup.procs, written "0" by the child (SpawnSpec::cgroup_procs_fd).
  int procs_fd_for_child() const { return procs_.get(); }
  // The cgroup directory, for clone3(CLONE_INTO_CGROUP).
  int dir_fd_for_clone() const { return dir_.get(); }
  // SIGKILLs every process in the cgroup (cgroup.kill). Safe to call repeatedly.
  void Kill() const;
  // Moves surviving processes to trybox-background, then removes the directory.
  void Release();

 private:
  ExecCgroup(std::string path, UniqueFd procs, UniqueFd dir)
      : path_(std::move(path)), procs_(std::move(procs)), dir_(std::move(dir)) {}
  static Result<ExecCgroup> Open(std::string path);
  // Waits (bounded) for the cgroup to empty, then rmdirs it.
  void Remove();

  std::string path_;  // empty once removed or moved from
  UniqueFd procs_;
  UniqueFd dir_;
};

// Creates `count` empty cgroups for the first execs to take (cgroup creation is slow under
// TCG). Call once the cgroup2 filesystem is mounted.
void PrewarmExecCgroups(size_t count);

// Kills every exec's tree (trybox-exec-* and trybox-background). For shutdown.
void KillAllExecCgroups();

}  // namespace trybox::guest
