#include "vmm/accel.h"

#include <fcntl.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <ctime>

#include "util/fd.h"
#include "util/json.h"
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

}  // namespace trybox::vmm
