// Test support for the CLI's unit tests: a scripted tryboxd speaking the real channel
// protocol on a real unix socket. Not used by trybox itself.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "channel/mux.h"
#include "util/fd.h"
#include "util/mutex.h"
#include "util/paths.h"
#include "util/process.h"
#include "util/socket.h"
#include "util/status.h"
#include "util/thread_annotations.h"

namespace trybox::cli::testing {

// A private TRYBOX_HOME-like layout in a fresh temp dir under /tmp; nothing listens on its
// socket, and its runtime directory does not exist until a ScriptedDaemon makes it.
struct Home {
  Home();
  TempDir dir;
  Paths paths;
};

// The daemon's side of the channel protocol on a real unix socket at paths.socket() (the
// runtime directory is created private). Each verb stream is handed to `script` on its own
// thread, with the request. Thread-safe; the destructor shuts every connection down and
// waits for the scripts to return.
class ScriptedDaemon {
 public:
  using Script =
      std::function<void(std::shared_ptr<channel::Stream>, const nlohmann::json& request)>;

  static Result<std::unique_ptr<ScriptedDaemon>> Start(const Paths& paths, Script script);
  ~ScriptedDaemon();

  // Every request received so far, in order.
  std::vector<nlohmann::json> requests();

 private:
  ScriptedDaemon(UnixListener listener, Script script);

  Script script_;
  UnixListener listener_;
  std::thread acceptor_;
  Mutex mu_;
  CondVar done_;
  int handlers_ GUARDED_BY(mu_) = 0;
  std::vector<nlohmann::json> requests_ GUARDED_BY(mu_);
  std::vector<std::unique_ptr<channel::Mux>> muxes_ GUARDED_BY(mu_);
};

// The names in `dir` (not . and ..); empty if it cannot be read.
std::set<std::string> Entries(const std::string& dir);
// lstat(2)'s st_mode of `path`, or 0 if there is nothing there.
mode_t ModeOf(const std::string& path);

// Polls until some directory directly under `parent` holds at least `n` entries (a copy is
// under way, into its temporary directory or its destination). False after `limit`.
bool WaitForADirectoryWith(const std::string& parent, size_t n, std::chrono::seconds limit);

// Runs `body` in a grandchild whose parent is a subreaper (PR_SET_CHILD_SUBREAPER) that
// waits for every descendant, including what the grandchild leaves behind in another
// session when it dies: WaitForAll() returns once they are all gone. `body` runs after
// fork(2) in a process that has threads (exec, or do only what is safe there); _exit(0)
// follows it.
class Subreaper {
 public:
  static Result<std::unique_ptr<Subreaper>> Start(const std::function<void()>& body);
  ~Subreaper();  // kills the grandchild if it is still there, then waits for all
  pid_t child() const { return child_; }
  Status WaitForAll();

 private:
  Subreaper(pid_t reaper, pid_t child) : reaper_(reaper), child_(child) {}
  pid_t reaper_;
  pid_t child_;
};

// A listening unix socket at `path` that no daemon serves: it takes each connection and
// closes it at once (so an unchecked client fails rather than waits); connected() tells
// whether anyone connected. The destructor stops it; it does not unlink the path.
class Trap {
 public:
  explicit Trap(const std::string& path);
  ~Trap();
  bool connected() const { return connected_; }

 private:
  UniqueFd fd_;
  std::atomic<bool> connected_{false};
  std::thread thread_;
};

// A socket at `path` listened on by a child process running as uid and gid `uid` (needs
// root): SO_PEERCRED on a connection to it reports `uid`, as for a daemon of another user.
// The child reads once from the first connection it accepts, then exits.
class ForeignListener {
 public:
  static Result<std::unique_ptr<ForeignListener>> Start(const std::string& path, uid_t uid);
  ~ForeignListener();  // kills and reaps the child if it is still there
  // Waits for the child: how many bytes its connection carried (0: closed without one).
  Result<long> BytesHeard();

 private:
  ForeignListener(pid_t pid, UniqueFd heard) : pid_(pid), heard_(std::move(heard)) {}
  pid_t pid_;
  UniqueFd heard_;
};

// Runs the trybox binary (beside the running test binary, or in $TRYBOX_BIN_DIR to try
// another build) with `args` and TRYBOX_HOME set to `home`; its stdout and stderr are kept.
struct ProgramResult {
  ExitInfo exit;
  std::string out, err;
};
// The trybox binary beside this test binary (or in TRYBOX_BIN_DIR).
Result<std::string> TryboxBinary();
Result<ProgramResult> RunTryboxBinary(const Home& home, const std::vector<std::string>& args);

}  // namespace trybox::cli::testing
