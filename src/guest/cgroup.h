// ExecCgroup: one cgroup v2 directory per exec (/sys/fs/cgroup/trybox-exec-<id>), so the
// whole process tree an exec starts (daemons, setsid'ed grandchildren) can be killed at
// once with cgroup.kill, whatever it did to its sessions and process groups.
//
// Move-only. The destructor kills what is left and removes the directory; Release() keeps
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
  // Creates the directory (kAlreadyExists if it exists) and opens its cgroup.procs for the
  // child to join.
  static Result<ExecCgroup> Create(const std::string& name);

  ExecCgroup(ExecCgroup&& o) noexcept
      : path_(std::exchange(o.path_, {})), procs_(std::move(o.procs_)) {}
  ExecCgroup& operator=(ExecCgroup&&) = delete;
  ExecCgroup(const ExecCgroup&) = delete;
  ~ExecCgroup();

  // The open cgroup.procs, written "0" by the child (SpawnSpec::cgroup_procs_fd).
  int procs_fd_for_child() const { return procs_.get(); }
  // SIGKILLs every process in the cgroup (cgroup.kill). Safe to call repeatedly.
  void Kill() const;
  // Moves surviving processes to trybox-background, then removes the directory.
  void Release();

 private:
  explicit ExecCgroup(std::string path, UniqueFd procs)
      : path_(std::move(path)), procs_(std::move(procs)) {}
  // Waits (bounded) for the cgroup to empty, then rmdirs it.
  void Remove();

  std::string path_;  // empty once removed or moved from
  UniqueFd procs_;
};

// Kills every exec's tree (trybox-exec-* and trybox-background). For shutdown.
void KillAllExecCgroups();

}  // namespace trybox::guest
