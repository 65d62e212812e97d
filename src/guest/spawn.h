// Starting processes from PID 1: through the Reaper (never waitpid on a pid directly), in a
// new session, optionally inside a cgroup, with the caller's environment and PATH.
//
// The pure parts (environment merging, the PATH search and how its errors are classified)
// are separate functions so they can be tested on any host.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "guest/credentials.h"
#include "guest/reaper.h"
#include "util/fd.h"
#include "util/status.h"

namespace trybox::guest {

// The environment every exec starts from; request variables are merged over it.
inline constexpr const char* kDefaultPath =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// Defaults (PATH, LANG=C.UTF-8, TERM=dumb, the proxy variables; HOME, USER and LOGNAME of
// the account the command runs as) with `overrides` on top, as sorted "K=V" strings.
std::vector<std::string> MergeEnv(const std::map<std::string, std::string>& overrides,
                                  const std::string& user = kRootUser,
                                  const std::string& home = "/root");

// The value of `key` in "K=V" strings, or `fallback`.
std::string EnvValue(const std::vector<std::string>& env, const std::string& key,
                     const std::string& fallback);

// The paths execve is tried on, in order: `name` alone if it contains a '/', else each PATH
// entry joined with it (an empty entry is the working directory, as in execvp).
std::vector<std::string> ExecCandidates(const std::string& name, const std::string& path);

// execvp's rule for which errno a PATH search ends with: ENOENT/ENOTDIR go on to the next
// candidate, EACCES is remembered and the search goes on, anything else stops it.
// Allocation-free: the forked child runs it.
class ExecSearch {
 public:
  // Records one failed execve; returns false if the search must stop.
  bool Failed(int err);
  // The errno to report once the search is over.
  int Result() const { return stopped_ ? last_ : (saw_eacces_ ? EACCES : ENOENT); }

 private:
  bool saw_eacces_ = false;
  bool stopped_ = false;
  int last_ = 0;
};

// Why a process could not be started; names are the protocol's error strings.
enum class SpawnError { kNone, kNotFound, kNotExecutable, kBadCwd, kSpawnFailed };
const char* SpawnErrorName(SpawnError e);
// The class of an execve errno once the search is over.
SpawnError ClassifyExecErrno(int err);

struct SpawnSpec {
  std::vector<std::string> argv;
  // The child's whole environment ("K=V"); its PATH also drives the argv[0] search.
  std::vector<std::string> env;
  std::string cwd = "/";
  // Dup'ed onto 0/1/2 in the child; -1 means /dev/null. Every other fd is closed at exec.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // stdin is a terminal slave to become the controlling terminal of the child's new
  // session (TIOCSCTTY), as login(1) or sshd make it.
  bool controlling_tty = false;
  // If >= 0, an open cgroup.procs the child writes "0" to before anything else, so the
  // whole tree it starts lives in that cgroup.
  int cgroup_procs_fd = -1;
  // The same cgroup's directory: the child is created inside it when the kernel can
  // (clone3 CLONE_INTO_CGROUP); otherwise it joins through cgroup_procs_fd.
  int cgroup_dir_fd = -1;
  // Taken on after the stdio set-up and before chdir (so the cwd is entered with the
  // command's own permissions). The default is a root command's reduced set: nothing
  // trybox-init starts holds its full capabilities unless asked for.
  Credentials credentials;
};

struct SpawnOutcome {
  std::shared_ptr<ChildWatch> child;  // set iff error == kNone
  SpawnError error = SpawnError::kNone;
  std::string message;  // names argv[0] or the cwd
};

// Forks through `reaper`, and returns once execve succeeded or failed (learnt through a
// CLOEXEC pipe). The child leads a new session (setsid), so its pid is its process group.
SpawnOutcome Spawn(Reaper& reaper, const SpawnSpec& spec);

// A pipe as two owned ends, both O_CLOEXEC (plus `extra_flags`, e.g. O_NONBLOCK).
struct Pipe {
  UniqueFd read;
  UniqueFd write;
};
Result<Pipe> MakePipe(int extra_flags = 0);

}  // namespace trybox::guest
