// End-to-end harness: a private tryboxd (its own TRYBOX_HOME) driven through the real CLI
// binary, against the real image built by `trybox image build`. Shared by tests and bench.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/fd.h"
#include "util/process.h"
#include "util/status.h"

namespace trybox::e2e {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

class Harness {
 public:
  // Makes a fresh home and starts tryboxd in it. Images come from TRYBOX_IMAGES or the
  // user's default image directory, so a built image is shared with the developer's CLI.
  // `extra_env` (KEY=VALUE) is added to the daemon's and the CLI's environment.
  static Result<std::unique_ptr<Harness>> Start(std::vector<std::string> extra_env = {});
  ~Harness();

  // Runs build/bin/trybox with `args` in this harness's environment.
  CliResult Cli(const std::vector<std::string>& args, const std::string& stdin_data = "") const;
  // Environment entries (KEY=VALUE) for a child process that should talk to this daemon.
  std::vector<std::string> Env() const;

  const std::string& home() const { return home_; }
  std::string vms_dir() const { return home_ + "/run/vms"; }
  std::string socket() const { return home_ + "/run/tryboxd.sock"; }
  pid_t daemon_pid() const { return daemon_.pid(); }

  // Kills the daemon with SIGKILL (as if it crashed), leaving its VMs behind.
  void CrashDaemon();
  // Starts a daemon again in the same home.
  Status RestartDaemon();
  // SIGTERM and wait: the daemon destroys its VMs on the way out.
  Status StopDaemon();

  // Stops the daemon, kills this home's QEMUs and removes the home: the destructor, and at
  // exit for a harness never destroyed (a bench that failed with std::exit). A sanitizer's
  // report in the daemon's log (a sanitized build's daemon) is kept first.
  void CleanUp();
  // The sanitizer reports (ASan, LSan, UBSan) found in the logs of the daemons cleaned up so
  // far, each named by its home; e2e_tests fails on any (tests/e2e/sanitizer_check.cc).
  static std::vector<std::string> SanitizerReports();

  // PIDs of QEMU processes whose command line mentions this harness's home.
  std::vector<pid_t> QemuPids() const;

  // A unary verb through the daemon's socket: the END body, or the error it carries.
  Result<nlohmann::json> Call(const nlohmann::json& request) const;
  // Waits until the spare pool neither prepares nor wants a spare (doctor's spare_pool),
  // so that no refill starts a QEMU while a test counts them.
  Status WaitForSparePoolIdle(std::chrono::seconds limit = std::chrono::seconds(120)) const;

 private:
  Harness() = default;
  Status SpawnDaemon();
  std::string home_;
  std::string images_;
  std::vector<std::string> extra_env_;
  ChildProcess daemon_;
};

// Runs `argv` with exactly `env`, feeding it `stdin_data`; collects its output and exit
// code (128 + N if signal N killed it; -1 if it could not be started, the reason in `err`).
CliResult RunProgram(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                     const std::string& stdin_data = "");

std::string BinDir();
// PIDs of trybox QEMU processes whose command line or TRYBOX_VM_DIR names `home`.
std::vector<pid_t> QemuPidsOfHome(const std::string& home);
std::string Sha256OfFile(const std::string& path);

// The fixture of a suite whose tests share one daemon under its own TRYBOX_HOME, started
// once for the suite (`h_`) and stopped after it.
template <class Suite>
class SharedHarness : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto h = Harness::Start();
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    h_ = std::move(*h).release();
  }
  static void TearDownTestSuite() {
    delete h_;
    h_ = nullptr;
  }
  static inline Harness* h_ = nullptr;
};

}  // namespace trybox::e2e
