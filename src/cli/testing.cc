#include "cli/testing.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "util/private_dir.h"

namespace trybox::cli::testing {

using Json = nlohmann::json;

Home::Home() : dir(TempDir::Make("/tmp", "cli-").value()) {
  paths.images = dir.path() + "/images";
  paths.state = dir.path() + "/state";
  paths.cache = dir.path() + "/cache";
  paths.runtime = dir.path() + "/run";
  paths.config = dir.path() + "/config";
}

Result<std::unique_ptr<ScriptedDaemon>> ScriptedDaemon::Start(const Paths& paths, Script script) {
  RETURN_IF_ERROR(MakePrivateDir(paths.runtime));
  ASSIGN_OR_RETURN(UnixListener listener, UnixListener::Listen(paths.socket()));
  return std::unique_ptr<ScriptedDaemon>(
      new ScriptedDaemon(std::move(listener), std::move(script)));
}

ScriptedDaemon::ScriptedDaemon(UnixListener listener, Script script)
    : script_(std::move(script)), listener_(std::move(listener)) {
  acceptor_ = std::thread([this] {
    for (;;) {
      auto fd = listener_.Accept();
      if (!fd.ok()) return;
      auto mux = std::make_unique<channel::Mux>(std::move(*fd), channel::Role::kGuest);
      // The Mux runs each handler on a detached thread; the destructor waits for them.
      mux->OnOpen([this](std::shared_ptr<channel::Stream> s, Json request) {
        {
          MutexLock lock(mu_);
          requests_.push_back(request);
          ++handlers_;
        }
        script_(std::move(s), request);
        MutexLock lock(mu_);
        --handlers_;
        done_.SignalAll();
      });
      mux->Start();
      MutexLock lock(mu_);
      muxes_.push_back(std::move(mux));
    }
  });
}

ScriptedDaemon::~ScriptedDaemon() {
  listener_.Shutdown();
  acceptor_.join();
  MutexLock lock(mu_);
  for (auto& m : muxes_) m->Shutdown();
  while (handlers_ != 0) done_.Wait(mu_);
}

std::vector<Json> ScriptedDaemon::requests() {
  MutexLock lock(mu_);
  return requests_;
}

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.insert(n);
  }
  ::closedir(d);
  return names;
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 ? st.st_mode : 0;
}

bool WaitForADirectoryWith(const std::string& parent, size_t n, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    for (const auto& e : Entries(parent)) {
      if (Entries(parent + "/" + e).size() >= n) return true;
    }
    ::usleep(500);
  }
  return false;
}

Result<std::unique_ptr<Subreaper>> Subreaper::Start(const std::function<void()>& body) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  UniqueFd report_r(report[0]), report_w(report[1]);
  pid_t reaper = ::fork();
  if (reaper < 0) return ErrnoError("fork");
  if (reaper == 0) {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    pid_t child = ::fork();
    if (child == 0) {
      body();
      ::_exit(0);
    }
    (void)!::write(report_w.get(), &child, sizeof child);
    while (::waitpid(-1, nullptr, 0) > 0 || errno == EINTR) {
    }
    ::_exit(0);
  }
  report_w.Reset();
  pid_t child = -1;
  if (::read(report_r.get(), &child, sizeof child) != static_cast<ssize_t>(sizeof child)) {
    ::waitpid(reaper, nullptr, 0);
    return Internal("the subreaper could not start its child");
  }
  return std::unique_ptr<Subreaper>(new Subreaper(reaper, child));
}

Subreaper::~Subreaper() {
  if (reaper_ <= 0) return;
  ::kill(child_, SIGKILL);
  (void)WaitForAll();
}

Status Subreaper::WaitForAll() {
  if (reaper_ <= 0) return Status::Ok();
  pid_t r = ::waitpid(reaper_, nullptr, 0);
  reaper_ = -1;
  if (r < 0) return ErrnoError("waitpid");
  return Status::Ok();
}

namespace {

Result<UniqueFd> BoundSocket(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket");
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return InvalidArgument("socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return ErrnoError("bind " + path);
  }
  return fd;
}

}  // namespace

Trap::Trap(const std::string& path) {
  auto fd = BoundSocket(path);
  if (!fd.ok() || ::listen(fd->get(), 8) != 0) return;  // then nothing can connect either
  fd_ = std::move(*fd);
  thread_ = std::thread([this] {
    for (;;) {
      int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;  // shut down
      connected_ = true;
      ::close(c);
    }
  });
}

Trap::~Trap() {
  if (!thread_.joinable()) return;
  ::shutdown(fd_.get(), SHUT_RDWR);  // wakes the accept
  thread_.join();
}

Result<std::unique_ptr<ForeignListener>> ForeignListener::Start(const std::string& path,
                                                                uid_t uid) {
  ASSIGN_OR_RETURN(UniqueFd sock, BoundSocket(path));
  int ready[2], heard[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  UniqueFd ready_r(ready[0]), ready_w(ready[1]);
  if (::pipe2(heard, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  UniqueFd heard_r(heard[0]), heard_w(heard[1]);
  pid_t pid = ::fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) {
    // Raw system calls only: the parent has threads. SO_PEERCRED reports the listener's
    // credentials as of listen(2), so the uid changes first.
    if (::syscall(SYS_setgroups, 0, nullptr) != 0 || ::syscall(SYS_setgid, uid) != 0 ||
        ::syscall(SYS_setuid, uid) != 0 || ::listen(sock.get(), 8) != 0) {
      ::_exit(1);
    }
    char one = 1;
    if (::write(ready_w.get(), &one, 1) != 1) ::_exit(1);
    int c = ::accept(sock.get(), nullptr, nullptr);
    char buf[4096];
    long n = c >= 0 ? ::read(c, buf, sizeof buf) : -1;
    if (::write(heard_w.get(), &n, sizeof n) != sizeof n) ::_exit(1);
    ::_exit(0);
  }
  std::unique_ptr<ForeignListener> l(new ForeignListener(pid, std::move(heard_r)));
  ready_w.Reset();
  heard_w.Reset();
  char one = 0;
  if (::read(ready_r.get(), &one, 1) != 1) {
    return Internal("the listener could not become uid " + std::to_string(uid));
  }
  return l;
}

ForeignListener::~ForeignListener() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

Result<long> ForeignListener::BytesHeard() {
  long n = -1;
  ssize_t got = ::read(heard_.get(), &n, sizeof n);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  if (got != static_cast<ssize_t>(sizeof n)) return Internal("the listener died");
  return n;
}

Result<std::string> TryboxBinary() {
  const char* dir = std::getenv("TRYBOX_BIN_DIR");
  if (dir && *dir) return std::string(dir) + "/trybox";
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return ErrnoError("readlink /proc/self/exe");
  std::string path(self, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/')) + "/trybox";
}

Result<ProgramResult> RunTryboxBinary(const Home& home, const std::vector<std::string>& args) {
  ASSIGN_OR_RETURN(std::string bin, TryboxBinary());
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  UniqueFd out_r(out[0]), out_w(out[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  UniqueFd err_r(err[0]), err_w(err[1]);
  SpawnOptions o;
  o.argv = {bin};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = std::vector<std::string>{"TRYBOX_HOME=" + home.dir.path(), "PATH=/usr/bin:/bin"};
  o.stdout_fd = out_w.get();
  o.stderr_fd = err_w.get();
  ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Spawn(o));
  out_w.Reset();
  err_w.Reset();
  ProgramResult r;
  auto drain = [](int fd, std::string* s) {
    char buf[4096];
    for (;;) {
      auto n = ReadSome(fd, buf, sizeof buf);
      if (!n.ok() || *n == 0) return;
      s->append(buf, *n);
    }
  };
  std::thread errors([&] { drain(err_r.get(), &r.err); });
  drain(out_r.get(), &r.out);
  errors.join();
  ASSIGN_OR_RETURN(r.exit, child.Wait());
  return r;
}

}  // namespace trybox::cli::testing
