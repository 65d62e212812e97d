#include "vmm/accel.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <sstream>

#include "util/fd.h"
#include "util/json.h"
#include "util/names.h"
#include "util/process.h"
#include "util/sha256.h"
#include "vmm/template.h"

namespace trybox::vmm {
namespace {

using Json = nlohmann::json;

std::string CpuFlags() {
  auto info = ReadFileToString("/proc/cpuinfo");
  if (!info.ok()) return "";
  size_t at = info->find("\nflags");
  if (at == std::string::npos) return "";
  size_t colon = info->find(':', at);
  size_t end = info->find('\n', colon);
  return colon == std::string::npos ? "" : info->substr(colon + 1, end - colon - 1);
}

std::string KvmDevice() {
  if (::access("/dev/kvm", F_OK) != 0) return "absent";
  int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) return "no access";
  ::close(fd);
  return "present";
}

}  // namespace

Result<Json> AccelKey(const std::string& qemu, const std::string& image_dir) {
  struct utsname u;
  if (::uname(&u) != 0) return ErrnoError("uname");
  ASSIGN_OR_RETURN(std::string version, QemuVersion(qemu));
  ASSIGN_OR_RETURN(std::string manifest, ReadFileToString(image_dir + "/manifest.json"));
  Json m = Json::parse(manifest, nullptr, false);
  std::string kernel_sha;
  if (m.is_object() && m.contains("files") && m["files"].is_object() &&
      m["files"].contains("vmlinux")) {
    kernel_sha = StrOr(m["files"]["vmlinux"], "sha256");
  }
  if (kernel_sha.empty()) return FailedPrecondition(image_dir + "/manifest.json names no kernel");
  return Json{{"host_kernel", std::string(u.sysname) + " " + u.release + " " + u.version},
              {"qemu_version", version},
              {"cpu_flags_sha256", Sha256Hex(CpuFlags())},
              {"kvm_device", KvmDevice()},
              {"probe_kernel_sha256", kernel_sha}};
}

std::optional<AccelChoice> LoadCachedAccel(const std::string& path, const Json& key) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return std::nullopt;
  Json j = Json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.contains("key") || j["key"] != key) return std::nullopt;
  std::string accel = StrOr(j, "accel");
  if (accel != "kvm" && accel != "tcg") return std::nullopt;
  return AccelChoice{accel, StrOr(j, "reason")};
}

Status SaveAccel(const std::string& path, const Json& key, const AccelChoice& choice) {
  char date[32];
  std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  Json j = {{"accel", choice.accel}, {"reason", choice.reason}, {"probed_at", date}, {"key", key}};
  return WriteFileAtomic(path, j.dump(2) + "\n", 0644);
}

namespace {

std::string ProbeName(const std::string& token) { return "trybox-probe-" + token; }

std::string FileTail(const std::string& path, size_t max) {
  auto s = ReadFileToString(path);
  if (!s.ok()) return "";
  return s->size() > max ? s->substr(s->size() - max) : *s;
}

bool IsProbe(pid_t pid, const std::string& token) {
  return pid > 0 && ProcessExists(pid) &&
         ProcessCmdline(pid).find(ProbeName(token)) != std::string::npos;
}

}  // namespace

AccelChoice ProbeAccel(const std::string& image_dir, const std::string& work_dir,
                       const std::string& qemu, std::chrono::milliseconds timeout) {
  if (::access("/dev/kvm", F_OK) != 0) return {"tcg", "/dev/kvm does not exist"};
  int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return {"tcg", "cannot open /dev/kvm: " + ErrnoError("open").message() +
                       " (add yourself to the kvm group for hardware acceleration)"};
  }
  ::close(fd);
  std::string log = work_dir + "/kvm-probe-console.log";
  std::string qemu_log = work_dir + "/kvm-probe-qemu.log";
  std::string pid_file = work_dir + "/" + kProbePidFile;
  ::unlink(log.c_str());
  std::string token = RandomHex(8);
  auto start = std::chrono::steady_clock::now();
  std::string why;
  Result<ExitInfo> exit = Internal("not started");
  {
    // Written before QEMU starts: a daemon killed between the spawn and the pid still left
    // the token, which names the process (ReapProbe).
    Status st = WriteFileAtomic(pid_file, "0 " + token + "\n", 0600);
    auto out = OpenFile(qemu_log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    SpawnOptions opts;
    opts.argv = {qemu,
                 "-name",
                 ProbeName(token),
                 "-machine",
                 "microvm,accel=kvm",
                 "-cpu",
                 "host",
                 "-m",
                 "128",
                 "-nodefaults",
                 "-no-user-config",
                 "-display",
                 "none",
                 "-no-reboot",
                 "-serial",
                 "file:" + log,
                 "-kernel",
                 image_dir + "/vmlinux",
                 "-initrd",
                 image_dir + "/initrd.cpio",
                 "-append",
                 "console=ttyS0 quiet panic=-1 trybox.probe=1"};
    if (out.ok()) opts.stdout_fd = opts.stderr_fd = out->get();
    opts.die_with_process = true;  // a killed daemon's probe goes with it
    auto child = st.ok() && out.ok() ? ChildProcess::Spawn(opts)
                                     : Result<ChildProcess>(st.ok() ? out.status() : st);
    if (child.ok()) {
      (void)WriteFileAtomic(pid_file, std::to_string(child->pid()) + " " + token + "\n", 0600);
      exit = child->WaitFor(timeout);
    } else {
      exit = child.status();
    }
    ::unlink(pid_file.c_str());
  }
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::string console = FileTail(log, 4096);
  std::string output = FileTail(qemu_log, 4096);
  ::unlink(log.c_str());
  ::unlink(qemu_log.c_str());
  if (exit.ok() && console.find("TRYBOX-PROBE-OK") != std::string::npos) {
    return {"kvm",
            "a probe guest booted under KVM in " + std::to_string(static_cast<int>(ms)) + " ms"};
  }
  if (!exit.ok()) {
    why = exit.status().message();
  } else {
    size_t nl = output.find('\n');
    why = "QEMU " + exit->Describe() + (output.empty() ? "" : ": " + output.substr(0, nl));
  }
  return {"tcg", "/dev/kvm exists but a standard guest does not run under it (" + why +
                     "); using TCG software emulation"};
}

pid_t ReapProbe(const std::string& work_dir) {
  std::string pid_file = work_dir + "/" + kProbePidFile;
  auto text = ReadFileToString(pid_file);
  if (!text.ok()) return 0;
  std::istringstream in(*text);
  int64_t recorded = 0;
  std::string token;
  in >> recorded >> token;
  pid_t killed = 0;
  if (ValidateName("probe token", token).ok()) {
    std::vector<pid_t> pids;
    if (recorded > 0) pids.push_back(static_cast<pid_t>(recorded));
    // Killed between the spawn and the pid's record: the token still names the process.
    if (recorded == 0) pids = FindProcesses(ProbeName(token) + " ");
    for (pid_t p : pids) {
      if (!IsProbe(p, token)) continue;
      // The probe led its own process group (ChildProcess::Spawn).
      ::kill(-p, SIGKILL);
      ::kill(p, SIGKILL);
      // Not our child: poll until it is gone (SIGKILL takes effect at once).
      for (int i = 0; i < 500 && IsProbe(p, token); ++i) ::usleep(10000);
      killed = p;
    }
  }
  ::unlink(pid_file.c_str());
  return killed;
}

}  // namespace trybox::vmm
