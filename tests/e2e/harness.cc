#include "tests/e2e/harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "cli/client.h"
#include "util/paths.h"
#include "util/sha256.h"
#include "util/socket.h"

namespace trybox::e2e {

std::string BinDir() {
  const char* b = std::getenv("TRYBOX_BIN_DIR");
  return b && *b ? b : TRYBOX_BIN_DIR;
}

std::string Sha256OfFile(const std::string& path) {
  auto h = Sha256File(path);
  return h.ok() ? *h : "error: " + h.status().message();
}

namespace {
// Remembers a live harness for the atexit clean-up (below).
void Register(Harness* h);

// Every program that links the harness (the e2e suites, the benches) ignores SIGPIPE from
// its first instruction: a CLI that refused its arguments and exited before the harness fed
// its standard input, or a peer that closed a socket a test origin still writes to, is then
// EPIPE on that write, never a signal that kills the whole suite (TerminalE2E died so).
const bool kSigpipeIgnored = [] {
  ::signal(SIGPIPE, SIG_IGN);
  return true;
}();
}  // namespace

Result<std::unique_ptr<Harness>> Harness::Start(std::vector<std::string> extra_env) {
  std::unique_ptr<Harness> h(new Harness());
  h->extra_env_ = std::move(extra_env);
  // Short path: unix socket paths are limited to 108 bytes.
  char tmpl[] = "/tmp/tbx-XXXXXX";
  if (!::mkdtemp(tmpl)) return ErrnoError("mkdtemp");
  h->home_ = tmpl;
  h->images_ = Paths::FromEnvironment().images;
  Register(h.get());
  RETURN_IF_ERROR(h->SpawnDaemon());
  return h;
}

std::vector<std::string> Harness::Env() const {
  // extra_env wins over the harness's own settings, which win over ours.
  std::vector<std::string> own = {"TRYBOX_HOME=" + home_, "TRYBOX_IMAGES=" + images_};
  own.insert(own.end(), extra_env_.begin(), extra_env_.end());
  auto key = [](const std::string& kv) { return kv.substr(0, kv.find('=') + 1); };
  std::map<std::string, std::string> chosen;
  for (char** e = environ; *e; ++e) chosen[key(*e)] = *e;
  for (const auto& kv : own) chosen[key(kv)] = kv;
  std::vector<std::string> env;
  for (auto& [k, kv] : chosen) env.push_back(kv);
  return env;
}

Status Harness::SpawnDaemon() {
  auto log = OpenFile(home_ + "/tryboxd.log", O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (!log.ok()) return log.status();
  SpawnOptions o;
  o.argv = {BinDir() + "/tryboxd"};
  o.env = Env();
  o.stdout_fd = log->get();
  o.stderr_fd = log->get();
  // A test process killed outright (ctest's timeout, SIGKILL) runs no destructor and no
  // atexit handler: the daemon then gets SIGTERM, on which it destroys its VMs and spares
  // and exits, so neither it nor a QEMU of its outlives the test.
  o.die_with_parent = true;
  o.death_signal = SIGTERM;
  ASSIGN_OR_RETURN(daemon_, ChildProcess::Spawn(o));
  for (int i = 0; i < 1000; ++i) {
    if (ConnectUnix(socket()).ok()) return Status::Ok();
    auto done = daemon_.TryWait();
    if (done.ok() && done->has_value()) {
      return Internal("tryboxd exited: " + (*done)->Describe() +
                      "; log: " + ReadFileToString(home_ + "/tryboxd.log").value_or(""));
    }
    ::usleep(10000);
  }
  return DeadlineExceeded("tryboxd did not open its socket");
}

void Harness::CrashDaemon() {
  (void)daemon_.Signal(SIGKILL);
  (void)daemon_.Wait();
}

Status Harness::RestartDaemon() { return SpawnDaemon(); }

Status Harness::StopDaemon() {
  if (!daemon_.running()) return Status::Ok();
  ::kill(daemon_.pid(), SIGTERM);
  auto r = daemon_.WaitFor(std::chrono::seconds(60));
  return r.ok() ? Status::Ok() : r.status();
}

namespace {

// Harnesses alive now: a bench that fails with std::exit (bench::Die) never runs their
// destructors, so an atexit handler stops their daemons instead of leaving them running.
std::mutex g_live_mu;
std::set<Harness*> g_live;

void CleanUpLiveHarnesses() {
  std::set<Harness*> live;
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    live.swap(g_live);
  }
  for (Harness* h : live) h->CleanUp();
}

void Register(Harness* h) {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(CleanUpLiveHarnesses); });
  std::lock_guard<std::mutex> lock(g_live_mu);
  g_live.insert(h);
}

std::mutex g_reports_mu;
std::vector<std::string> g_reports;

// Where a sanitizer's report starts in `log`, or npos.
size_t FindSanitizerReport(const std::string& log) {
  size_t at = std::string::npos;
  for (const char* mark : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"}) {
    at = std::min(at, log.find(mark));
  }
  if (at == std::string::npos) return at;
  size_t line = log.rfind('\n', at);
  return line == std::string::npos ? 0 : line + 1;
}

}  // namespace

std::vector<std::string> Harness::SanitizerReports() {
  std::lock_guard<std::mutex> lock(g_reports_mu);
  return g_reports;
}

void Harness::CleanUp() {
  (void)StopDaemon();
  // After the stop: LeakSanitizer reports as the daemon exits.
  const std::string log = ReadFileToString(home_ + "/tryboxd.log").value_or("");
  if (size_t at = FindSanitizerReport(log); at != std::string::npos) {
    std::string report = "tryboxd in " + home_ + ":\n" + log.substr(at, 6000);
    std::fprintf(stderr, "%s\n", report.c_str());
    std::lock_guard<std::mutex> lock(g_reports_mu);
    g_reports.push_back(std::move(report));
  }
  for (pid_t p : QemuPids()) ::kill(p, SIGKILL);
  (void)RemoveTree(home_);
}

Harness::~Harness() {
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    g_live.erase(this);
  }
  CleanUp();
}

CliResult RunProgram(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                     const std::string& stdin_data) {
  CliResult r;
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC)) return r;
  UniqueFd in_r(in[0]), in_w(in[1]), out_r(out[0]), out_w(out[1]), err_r(err[0]), err_w(err[1]);
  SpawnOptions o;
  o.argv = argv;
  o.env = env;
  o.stdin_fd = in_r.get();
  o.stdout_fd = out_w.get();
  o.stderr_fd = err_w.get();
  auto child = ChildProcess::Spawn(o);
  if (!child.ok()) {
    r.err = child.status().ToString();
    return r;
  }
  in_r.Reset();
  out_w.Reset();
  err_w.Reset();
  std::thread writer([&] {
    (void)WriteFull(in_w.get(), stdin_data);
    in_w.Reset();
  });
  auto drain = [](int fd, std::string* s) {
    char buf[65536];
    for (;;) {
      auto n = ReadSome(fd, buf, sizeof buf);
      if (!n.ok() || *n == 0) return;
      s->append(buf, *n);
    }
  };
  std::thread eo([&] { drain(err_r.get(), &r.err); });
  drain(out_r.get(), &r.out);
  eo.join();
  writer.join();
  auto info = child->Wait();
  if (info.ok()) r.code = info->exited ? info->code : 128 + info->signal;
  return r;
}

CliResult Harness::Cli(const std::vector<std::string>& args, const std::string& stdin_data) const {
  std::vector<std::string> argv = {BinDir() + "/trybox"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProgram(argv, Env(), stdin_data);
}

Result<nlohmann::json> Harness::Call(const nlohmann::json& request) const {
  Paths paths = Paths::FromEnvironment();
  paths.runtime = home_ + "/run";
  ASSIGN_OR_RETURN(auto client, cli::Client::Connect(paths, /*autostart=*/false));
  return client->Call(request);
}

Status Harness::WaitForSparePoolIdle(std::chrono::seconds limit) const {
  auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    ASSIGN_OR_RETURN(auto d, Call({{"verb", "doctor"}}));
    bool idle = true;
    for (const auto& [shape, v] : d["spare_pool"]["shapes"].items()) {
      idle &= v.value("refilling", 0) == 0 && v.value("wanted", 0) == 0;
    }
    if (idle) return Status::Ok();
    if (std::chrono::steady_clock::now() > until) {
      return DeadlineExceeded("the spare pool is still busy: " + d["spare_pool"].dump());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::vector<pid_t> Harness::QemuPids() const { return QemuPidsOfHome(home_); }

std::vector<pid_t> QemuPidsOfHome(const std::string& home) {
  std::vector<pid_t> pids;
  DIR* d = ::opendir("/proc");
  if (!d) return pids;
  while (dirent* e = ::readdir(d)) {
    pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::string cmd = ProcessCmdline(pid);
    if (cmd.find("trybox-vm-") == std::string::npos) continue;
    // A sandboxed QEMU names its directories as /proc/self/fd/N; its environment says where
    // they are (TRYBOX_VM_DIR).
    std::string env = ReadFileToString("/proc/" + std::to_string(pid) + "/environ").value_or("");
    if (cmd.find(home) != std::string::npos ||
        env.find("TRYBOX_VM_DIR=" + home) != std::string::npos) {
      pids.push_back(pid);
    }
  }
  ::closedir(d);
  return pids;
}

}  // namespace trybox::e2e
