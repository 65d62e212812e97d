#include "guest/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "guest/egress.h"
#include "util/names.h"

namespace trybox::guest {
namespace {

enum Stage : int {
  kStageSetsid = 1,
  kStageCgroup,
  kStageFds,
  kStageTty,
  kStageCredentials,
  kStageChdir,
  kStageExec
};

const char* StageName(int stage) {
  switch (stage) {
    case kStageSetsid:
      return "setsid";
    case kStageCgroup:
      return "join cgroup";
    case kStageFds:
      return "set up stdio";
    case kStageTty:
      return "take the controlling terminal";
    case kStageCredentials:
      return "drop privileges";
    case kStageChdir:
      return "chdir";
    case kStageExec:
      return "execve";
  }
  return "spawn";
}

constexpr const char* kNoProxy = "localhost,127.0.0.1,::1";

}  // namespace

std::vector<std::string> MergeEnv(const std::map<std::string, std::string>& overrides,
                                  const std::string& user, const std::string& home) {
  // The only way out of the guest is the host's egress proxy (guest/egress.h); tools that
  // honour the proxy variables find it without configuration. Loopback stays direct.
  std::map<std::string, std::string> env = {{"PATH", kDefaultPath},
                                            {"HOME", home},
                                            {"USER", user},
                                            {"LOGNAME", user},
                                            {"LANG", "C.UTF-8"},
                                            {"TERM", "dumb"},
                                            {"HTTPS_PROXY", kEgressProxyUrl},
                                            {"HTTP_PROXY", kEgressProxyUrl},
                                            {"https_proxy", kEgressProxyUrl},
                                            {"http_proxy", kEgressProxyUrl},
                                            {"NO_PROXY", kNoProxy},
                                            {"no_proxy", kNoProxy}};
  for (const auto& [k, v] : overrides) env[k] = v;
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::string EnvValue(const std::vector<std::string>& env, const std::string& key,
                     const std::string& fallback) {
  std::string prefix = key + "=";
  for (const auto& e : env) {
    if (e.compare(0, prefix.size(), prefix) == 0) return e.substr(prefix.size());
  }
  return fallback;
}

std::vector<std::string> ExecCandidates(const std::string& name, const std::string& path) {
  if (name.find('/') != std::string::npos) return {name};
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t end = path.find(':', start);
    std::string dir = path.substr(start, end == std::string::npos ? end : end - start);
    out.push_back(dir.empty() ? name : dir + "/" + name);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

bool ExecSearch::Failed(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return true;
    case EACCES:
      saw_eacces_ = true;
      return true;
    default:
      stopped_ = true;
      last_ = err;
      return false;
  }
}

const char* SpawnErrorName(SpawnError e) {
  switch (e) {
    case SpawnError::kNone:
      return "none";
    case SpawnError::kNotFound:
      return "not_found";
    case SpawnError::kNotExecutable:
      return "not_executable";
    case SpawnError::kBadCwd:
      return "bad_cwd";
    case SpawnError::kSpawnFailed:
      return "spawn_failed";
  }
  return "spawn_failed";
}

SpawnError ClassifyExecErrno(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return SpawnError::kNotFound;
    case EACCES:
    case ENOEXEC:
    case EPERM:
    case EISDIR:
      return SpawnError::kNotExecutable;
    default:
      return SpawnError::kSpawnFailed;
  }
}

Result<Pipe> MakePipe(int extra_flags) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC | extra_flags) != 0) return ErrnoError("pipe2");
  return Pipe{UniqueFd(p[0]), UniqueFd(p[1])};
}

SpawnOutcome Spawn(Reaper& reaper, const SpawnSpec& spec) {
  SpawnOutcome out;
  auto fail = [&](SpawnError e, std::string message) {
    out.error = e;
    out.message = std::move(message);
    return out;
  };
  if (spec.argv.empty() || spec.argv[0].empty()) {
    return fail(SpawnError::kSpawnFailed, "spawn: empty argv");
  }
  const std::string& name = spec.argv[0];

  // Everything the child touches is built here: after fork it may not allocate.
  std::vector<std::string> candidates =
      ExecCandidates(name, EnvValue(spec.env, "PATH", kDefaultPath));
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const char* cwd = spec.cwd.empty() ? "/" : spec.cwd.c_str();

  auto err_pipe = MakePipe();
  if (!err_pipe.ok()) return fail(SpawnError::kSpawnFailed, err_pipe.status().message());
  UniqueFd devnull(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!devnull.valid()) {
    return fail(SpawnError::kSpawnFailed, ErrnoError("open /dev/null").message());
  }
  const int errw = err_pipe->write.get();
  const int in = spec.stdin_fd >= 0 ? spec.stdin_fd : devnull.get();
  const int outfd = spec.stdout_fd >= 0 ? spec.stdout_fd : devnull.get();
  const int errfd = spec.stderr_fd >= 0 ? spec.stderr_fd : devnull.get();
  int cg = spec.cgroup_procs_fd;
  const bool tty = spec.controlling_tty;
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;

  auto in_child = [&] {
    auto die = [&](int stage) {
      int e[2] = {stage, errno};
      (void)!::write(errw, e, sizeof e);
      ::_exit(127);
    };
    if (::setsid() < 0) die(kStageSetsid);
    if (cg >= 0 && ::write(cg, "0", 1) != 1) die(kStageCgroup);
    // PID 1 ignores SIGPIPE/SIGTERM/... and blocks SIGCHLD; both would be inherited.
    for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // Lift the sources above 2 first so that dup2 onto 0..2 never clobbers one of them.
    int fin = ::fcntl(in, F_DUPFD_CLOEXEC, 3), fout = ::fcntl(outfd, F_DUPFD_CLOEXEC, 3),
        ferr = ::fcntl(errfd, F_DUPFD_CLOEXEC, 3);
    if (fin < 0 || fout < 0 || ferr < 0) die(kStageFds);
    if (::dup2(fin, 0) < 0 || ::dup2(fout, 1) < 0 || ::dup2(ferr, 2) < 0) die(kStageFds);
    if (tty && ::ioctl(0, TIOCSCTTY, 0) != 0) die(kStageTty);
    // Nothing else may leak into the command, whoever opened it without O_CLOEXEC.
    ::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
    if (int e = DropPrivileges(spec.credentials)) {
      errno = e;
      die(kStageCredentials);
    }
    if (::chdir(cwd) != 0) die(kStageChdir);
    ExecSearch search;
    for (const auto& c : candidates) {
      ::execve(c.c_str(), argv.data(), envp.data());
      if (!search.Failed(errno)) break;
    }
    errno = search.Result();
    die(kStageExec);
  };
  Result<std::shared_ptr<ChildWatch>> forked = FailedPrecondition("no cgroup");
  if (spec.cgroup_dir_fd >= 0) {
    const int join_fd = cg;
    cg = -1;  // born in the cgroup: nothing to join
    forked = reaper.ForkIntoCgroup(in_child, spec.cgroup_dir_fd);
    if (!forked.ok() && forked.status().code() == Code::kFailedPrecondition) cg = join_fd;
  }
  if (!forked.ok() && forked.status().code() == Code::kFailedPrecondition) {
    forked = reaper.Fork(in_child);
  }
  if (!forked.ok()) return fail(SpawnError::kSpawnFailed, forked.status().message());
  err_pipe->write.Reset();

  int e[2];
  ssize_t n;
  do {
    n = ::read(err_pipe->read.get(), e, sizeof e);
  } while (n < 0 && errno == EINTR);
  if (n == 0) {
    out.child = std::move(forked).value();
    return out;
  }
  // The child has _exit'ed (or is about to); the reaper collects it.
  if (n != static_cast<ssize_t>(sizeof e)) {
    return fail(SpawnError::kSpawnFailed,
                "spawn " + QuoteForMessage(name) + ": lost the child's setup report");
  }
  const int stage = e[0], err = e[1];
  if (stage == kStageChdir) {
    return fail(SpawnError::kBadCwd,
                "cwd " + QuoteForMessage(spec.cwd) + ": " + std::strerror(err));
  }
  if (stage == kStageExec) {
    SpawnError kind = ClassifyExecErrno(err);
    std::string what = QuoteForMessage(name);
    if (kind == SpawnError::kNotFound) {
      return fail(kind, name.find('/') == std::string::npos ? what + ": command not found in PATH"
                                                            : what + ": no such file");
    }
    if (kind == SpawnError::kNotExecutable) {
      return fail(kind, what + ": not executable (" + std::strerror(err) + ")");
    }
    return fail(kind, "execve " + what + ": " + std::strerror(err));
  }
  return fail(SpawnError::kSpawnFailed, std::string("spawn ") + QuoteForMessage(name) + ": " +
                                            StageName(stage) + ": " + std::strerror(err));
}

}  // namespace trybox::guest
