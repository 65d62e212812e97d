#include "cli/testing.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cstdlib>

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
          std::lock_guard<std::mutex> lock(mu_);
          requests_.push_back(request);
          ++handlers_;
        }
        script_(std::move(s), request);
        std::lock_guard<std::mutex> lock(mu_);
        --handlers_;
        done_.notify_all();
      });
      mux->Start();
      std::lock_guard<std::mutex> lock(mu_);
      muxes_.push_back(std::move(mux));
    }
  });
}

ScriptedDaemon::~ScriptedDaemon() {
  listener_.Shutdown();
  acceptor_.join();
  std::unique_lock<std::mutex> lock(mu_);
  for (auto& m : muxes_) m->Shutdown();
  done_.wait(lock, [this] { return handlers_ == 0; });
}

std::vector<Json> ScriptedDaemon::requests() {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

Result<ProgramResult> RunTryboxBinary(const Home& home, const std::vector<std::string>& args) {
  std::string bin;
  const char* dir = std::getenv("TRYBOX_BIN_DIR");
  if (dir && *dir) {
    bin = std::string(dir) + "/trybox";
  } else {
    char self[PATH_MAX];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return ErrnoError("readlink /proc/self/exe");
    std::string path(self, static_cast<size_t>(n));
    bin = path.substr(0, path.rfind('/')) + "/trybox";
  }
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
