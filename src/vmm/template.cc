#include "vmm/template.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <regex>

#include "util/fd.h"
#include "util/json.h"
#include "util/log.h"
#include "util/names.h"
#include "util/process.h"
#include "util/sha256.h"

namespace trybox::vmm {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kMetaFormat = 1;
// How Check() begins the reason for a template whose timer proof failed.
constexpr const char* kTimerBroken = "it failed its timer check: ";

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  struct tm tm;
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The argv of a template VM for `shape` with the per-VM and per-directory parts replaced
// by placeholders: what stays the same for every template and clone of this shape.
std::vector<std::string> CanonicalArgv(const TemplateShape& shape) {
  VmConfig c;
  c.id = "ID";
  c.vm_dir = "VMDIR";
  c.template_dir = "TEMPLATEDIR";
  c.image_dir = shape.image_dir;
  c.layers = ImageLayers(shape.image_dir);
  c.memory_mib = shape.memory_mib;
  c.cpus = shape.cpus;
  c.accel = shape.accel;
  c.qemu = shape.qemu;
  c.mode = StartMode::kTemplate;
  return QemuArgv(c);
}

// Why a template's recorded timer proof does not let it be used ("" if it does).
std::string TimerProblem(const Json& meta) {
  if (!meta.contains("timer") || !meta["timer"].is_object()) {
    return "it never proved a working timer (built before templates were checked)";
  }
  const Json& t = meta["timer"];
  if (t.value("ok", false) == true) return "";
  return std::string(kTimerBroken) + StrOr(t, "reason", "no reason recorded");
}

Status WriteMeta(const std::string& dir, const Json& meta) {
  return WriteFileAtomic(dir + "/meta.json", meta.dump(2) + "\n", 0600);
}

}  // namespace

Result<std::string> QemuVersion(const std::string& qemu) {
  static Mutex mu;
  static std::map<std::string, std::string> cache;
  std::string path = qemu;
  if (qemu.find('/') == std::string::npos) {
    auto found = FindInPath(qemu);
    if (!found) return NotFound(qemu + " is not on PATH");
    path = *found;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError("stat " + path);
  std::string cache_key = path + "|" + std::to_string(st.st_size) + "|" +
                          std::to_string(st.st_mtim.tv_sec) + "." +
                          std::to_string(st.st_mtim.tv_nsec);
  {
    MutexLock lock(mu);
    auto it = cache.find(cache_key);
    if (it != cache.end()) return it->second;
  }
  ASSIGN_OR_RETURN(auto r, RunCommand({path, "--version"}, std::chrono::seconds(10)));
  if (!r.exit.exited || r.exit.code != 0) {
    return Unavailable(path + " --version " + r.exit.Describe());
  }
  std::string version = r.output.substr(0, r.output.find('\n'));
  MutexLock lock(mu);
  cache[cache_key] = version;
  return version;
}

Result<TemplateKey> ComputeTemplateKey(const TemplateShape& shape) {
  ASSIGN_OR_RETURN(std::string version, QemuVersion(shape.qemu));
  TemplateKey key;
  std::vector<std::string> argv = CanonicalArgv(shape);
  std::string cmdline;
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "-append") cmdline = argv[i + 1];
  }
  key.inputs = {{"image", shape.image_name},      {"manifest_sha256", shape.manifest_sha256},
                {"qemu_version", version},        {"cmdline", cmdline},
                {"memory_mib", shape.memory_mib}, {"cpus", shape.cpus},
                {"accel", shape.accel},           {"argv", argv}};
  key.hash = Sha256Hex(key.inputs.dump());
  return key;
}

std::string TemplateMismatch(const Json& meta, const TemplateKey& key) {
  if (IntOr(meta, "format") != kMetaFormat) return "its format is not this trybox's";
  if (StrOr(meta, "key") == key.hash) return "";
  const Json old =
      meta.contains("inputs") && meta["inputs"].is_object() ? meta["inputs"] : Json::object();
  auto differs = [&](const char* field) {
    return (old.contains(field) ? old[field] : Json()) != key.inputs[field];
  };
  if (differs("manifest_sha256")) return "the image changed";
  if (differs("qemu_version")) {
    return "QEMU changed (" + StrOr(old, "qemu_version", "?") + " -> " +
           key.inputs["qemu_version"].get<std::string>() + ")";
  }
  if (differs("cmdline")) return "the kernel command line changed";
  if (differs("qemu_own_uid")) return "QEMU's user changed (the daemon runs as another user)";
  if (differs("memory_mib") || differs("cpus") || differs("accel")) {
    return "the machine shape changed";
  }
  return "QEMU's device list changed";
}

std::string TemplateStore::DirFor(const TemplateShape& shape) const {
  return root_ + "/" + shape.image_name + "-" + std::to_string(shape.memory_mib) + "m-" +
         std::to_string(shape.cpus) + "c-" + shape.accel;
}

std::shared_mutex& TemplateStore::LockFor(const std::string& dir) {
  MutexLock lock(mu_);
  auto& m = locks_[dir];
  if (!m) m = std::make_unique<std::shared_mutex>();
  return *m;
}

std::string TemplateStore::Check(const std::string& dir, const TemplateKey& key, int memory_mib) {
  auto text = ReadFileToString(dir + "/meta.json");
  if (!text.ok()) return "there is none yet";
  Json meta = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object()) return "its meta.json is unreadable";
  std::string why = TemplateMismatch(meta, key);
  if (!why.empty()) return why;
  if (FileSize(dir + kTemplateMemory) != (static_cast<int64_t>(memory_mib) << 20)) {
    return "its memory file is missing or the wrong size";
  }
  if (FileSize(dir + kTemplateState) <= 0) return "its saved state is missing";
  if (FileSize(dir + kTemplateDisk) <= 0) return "its disk layer is missing";
  if (FileSize(dir + kTemplateCloneDisk) <= 0) return "its clone overlay is missing";
  return TimerProblem(meta);
}

Result<int64_t> FreeBytes(const std::string& path) {
  struct statvfs fs;
  if (::statvfs(path.c_str(), &fs) != 0) return ErrnoError("statvfs " + path);
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

Status TemplateStore::Build(const TemplateShape& shape, const Sandbox& sandbox,
                            const TemplateKey& key, const std::string& dir, double* build_ms) {
  auto start = Clock::now();
  RETURN_IF_ERROR(MakeDirs(root_, 0700));
  RETURN_IF_ERROR(MakeDirs(run_dir_, 0700));
  const std::string id = "tpl-" + NewId();
  const std::string building = root_ + "/.building-" + id;
  if (::mkdir(building.c_str(), 0700) != 0) return ErrnoError("mkdir " + building);
  auto cleanup = [&](Status st) {
    (void)RemoveTree(building);
    return st;
  };
  VmConfig c;
  c.id = id;
  c.image_dir = shape.image_dir;
  c.layers = ImageLayers(shape.image_dir);
  c.vm_dir = run_dir_ + "/" + id;
  c.memory_mib = shape.memory_mib;
  c.cpus = shape.cpus;
  c.accel = shape.accel;
  c.qemu = shape.qemu;
  c.mode = StartMode::kTemplate;
  c.template_dir = building;
  c.netns = sandbox.netns;
  c.qemu_uid = sandbox.uid;
  // QEMU maps the template's memory file sparse: on a full disk, a page the guest touches
  // cannot be allocated and QEMU dies of SIGBUS. Refuse first, naming the cause.
  const int64_t need = (static_cast<int64_t>(shape.memory_mib) << 20) + kTemplateSlackBytes;
  if (auto free = FreeBytes(root_); free.ok() && *free < need) {
    return cleanup(ResourceExhausted("no_space: a " + std::to_string(shape.memory_mib) +
                                     " MiB template needs about " + std::to_string(need >> 20) +
                                     " MiB free under " + root_ + "; " +
                                     std::to_string(*free >> 20) + " MiB are"));
  }
  auto vm = Vm::Boot(c, boot_timeout_);
  if (!vm.ok()) return cleanup(vm.status().Annotate("boot the template VM"));
  double boot_ms = (*vm)->boot_ms();
  Status st = (*vm)->SaveTemplate(boot_timeout_);
  vm->reset();
  if (!st.ok()) return cleanup(st);
  // Back to the daemon's user (the template VM may have run as its own uid). Clones, which
  // may each run as another uid, need to read the disk (through the directory's fd);
  // nobody else needs anything here.
  for (const char* f : {"", kTemplateDisk, kTemplateMemory, kTemplateState}) {
    if (::chown((building + f).c_str(), ::geteuid(), ::getegid()) != 0) {
      return cleanup(ErrnoError("chown " + building + f));
    }
  }
  if (::chmod(building.c_str(), 0711) != 0 || ::chmod((building + kTemplateDisk).c_str(), 0644) ||
      ::chmod((building + kTemplateMemory).c_str(), 0600) != 0) {
    return cleanup(ErrnoError("chmod the template"));
  }
  // Clones copy this overlay. It names the template's disk through the template directory's
  // inherited fd (kTemplateDirFd), so it does not depend on where the directory lives, and
  // nothing here could open that name: -u, with the size the disk has (the image's scratch
  // layer's, which it overlays).
  auto info = RunCommand({"qemu-img", "info", "--output=json", shape.image_dir + "/scratch.qcow2"},
                         std::chrono::seconds(30));
  Json disk_info = info.ok() ? Json::parse(info->output, nullptr, false) : Json();
  if (!disk_info.is_object() || !disk_info.contains("virtual-size")) {
    return cleanup(Internal("qemu-img info of the image's scratch layer gave no size: " +
                            (info.ok() ? info->output : info.status().message())));
  }
  const std::string overlay = building + kTemplateCloneDisk;
  st = RunChecked({"qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b",
                   "/proc/self/fd/" + std::to_string(kTemplateDirFd) + kTemplateDisk, "-F", "qcow2",
                   overlay, std::to_string(disk_info["virtual-size"].get<int64_t>())},
                  std::chrono::seconds(30));
  if (!st.ok()) return cleanup(st.Annotate("create the clone overlay"));
  *build_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  Json meta = {{"format", kMetaFormat},
               {"key", key.hash},
               {"inputs", key.inputs},
               {"created", UtcNow()},
               {"boot_ms", boot_ms},
               {"build_ms", *build_ms},
               {"state_bytes", FileSize(building + kTemplateState)}};
  st = WriteMeta(building, meta);
  if (!st.ok()) return cleanup(st);
  // Swap it in. Running clones keep the old files open; unlinking them is safe.
  (void)RemoveTree(dir);
  if (::rename(building.c_str(), dir.c_str()) != 0) {
    return cleanup(ErrnoError("rename " + building + " to " + dir));
  }
  return Status::Ok();
}

Result<TemplateStore::Lease> TemplateStore::Get(const TemplateShape& shape, const Sandbox& sandbox,
                                                const Prover& prove, const Progress& progress) {
  ASSIGN_OR_RETURN(TemplateKey key, ComputeTemplateKey(shape));
  const std::string dir = DirFor(shape);
  std::shared_mutex& m = LockFor(dir);
  Lease lease;
  lease.dir = dir;
  for (;;) {
    {
      std::shared_lock<std::shared_mutex> shared(m);
      if (Check(dir, key, shape.memory_mib).empty()) {
        ASSIGN_OR_RETURN(lease.memory_fd, MemoryFd(dir, key.hash, progress));
        lease.hold = std::move(shared);
        return lease;
      }
    }
    std::unique_lock<std::shared_mutex> exclusive(m);
    std::string why = Check(dir, key, shape.memory_mib);
    if (why.empty()) continue;  // another caller built it meanwhile
    LogInfo("templates", "building the " + shape.image_name + " template: " + why);
    if (progress) {
      progress("template", "building the " + shape.image_name + " template (" +
                               std::to_string(shape.memory_mib) + " MiB, " +
                               std::to_string(shape.cpus) + " cpu): " + why +
                               "; it boots once, then later VMs are restored from it");
    }
    Forget(dir);
    RETURN_IF_ERROR(Build(shape, sandbox, key, dir, &lease.build_ms));
    LogInfo("templates",
            "built " + dir + " in " + std::to_string(static_cast<int>(lease.build_ms)) + " ms");
    // Not handed out before it proved its timer: a guest kernel that calibrated its APIC
    // timer on a busy host may have switched it off, and every clone of it would hang on
    // its first sleep (issue 51.1).
    if (progress) progress("template", "checking the new template's timer and clock");
    Status proven = Prove(dir, key.hash, prove);
    if (!proven.ok()) return proven;
    lease.built = true;
    lease.built_why = why;
    // Downgrade: nobody can rebuild between here and the shared lock but another Get,
    // which would find this one valid.
  }
}

Status TemplateStore::Prove(const std::string& dir, const std::string& key, const Prover& prove) {
  auto text = ReadFileToString(dir + "/meta.json");
  Json meta = text.ok() ? Json::parse(*text, nullptr, false) : Json();
  if (!meta.is_object()) return Internal("the new template's meta.json is unreadable");
  Result<Json> proof = Internal("no timer check was given");
  if (prove) {
    auto memory = MemoryFd(dir, key, {});
    proof = memory.ok() ? prove(dir, *memory) : Result<Json>(memory.status());
  }
  if (proof.ok()) {
    Json timer = proof->is_object() ? *proof : Json::object();
    timer["ok"] = true;
    meta["timer"] = timer;
  } else {
    meta["timer"] = {{"ok", false}, {"reason", proof.status().message()}};
    Forget(dir);
  }
  Status written = WriteMeta(dir, meta);
  if (!proof.ok()) {
    LogWarn("templates", dir + " failed its timer check: " + proof.status().message());
    return Unavailable("the new template failed its timer check (" + proof.status().message() +
                       "); it is kept as broken (`trybox image ls`) and rebuilt by the next "
                       "create, or removed by `trybox image rm-template`");
  }
  if (!written.ok()) return written.Annotate("record the template's timer check");
  LogInfo("templates", dir + " proved its timer: " + meta["timer"].dump());
  return Status::Ok();
}

std::vector<std::string> TemplateStore::RemoveImageTemplates(const std::string& image_name) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(root_.c_str());
  if (d == nullptr) return removed;
  std::vector<std::string> names;
  // <image>-<mem>m-<cpus>c-<accel>: the image's own, not those of an image whose name
  // merely begins the same ("debian-12" and "debian-12-dev").
  static const std::regex kName("^(.+)-([0-9]+)m-([0-9]+)c-(kvm|tcg)$");
  while (struct dirent* e = ::readdir(d)) {
    std::smatch m;
    std::string n = e->d_name;
    if (std::regex_match(n, m, kName) && m[1] == image_name) names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    const std::string dir = root_ + "/" + n;
    std::unique_lock<std::shared_mutex> exclusive(LockFor(dir));
    Forget(dir);
    Status st = RemoveTree(dir);
    if (!st.ok()) {
      LogWarn("templates", st.message());
      continue;
    }
    LogInfo("templates", "removed " + dir + " (trybox image rm-template)");
    removed.push_back(n);
  }
  return removed;
}

void TemplateStore::Discard(const TemplateShape& shape, const std::string& why) {
  const std::string dir = DirFor(shape);
  std::unique_lock<std::shared_mutex> exclusive(LockFor(dir));
  LogWarn("templates", "discarding " + dir + ": " + why);
  Forget(dir);
  Status st = RemoveTree(dir);
  if (!st.ok()) LogWarn("templates", st.message());
}

void TemplateStore::Forget(const std::string& dir) {
  MutexLock lock(mu_);
  memory_.erase(dir);  // clones keep their own mappings
}

Result<int> TemplateStore::MemoryFd(const std::string& dir, const std::string& key,
                                    const Progress& progress) {
  MutexLock lock(mu_);
  auto it = memory_.find(dir);
  if (it != memory_.end() && it->second.key == key) return it->second.fd.get();
  if (progress) progress("memory", "loading the template's memory (first restore since start)");
  const std::string path = dir + kTemplateMemory;
  ASSIGN_OR_RETURN(UniqueFd in, OpenFile(path, O_RDONLY | O_CLOEXEC));
  UniqueFd mem(::memfd_create("trybox-template-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!mem.valid()) return ErrnoError("memfd_create");
  struct stat st;
  if (::fstat(in.get(), &st) != 0) return ErrnoError("stat " + path);
  if (::ftruncate(mem.get(), st.st_size) != 0) return ErrnoError("size the template memfd");
  // Only the pages the template touched hold data; the rest are holes and stay unallocated.
  std::unique_ptr<char[]> buf(new char[1 << 20]);
  off_t at = 0;
  while (at < st.st_size) {
    off_t data = ::lseek(in.get(), at, SEEK_DATA);
    if (data < 0) break;  // ENXIO: only a hole is left
    off_t hole = ::lseek(in.get(), data, SEEK_HOLE);
    if (hole < 0) hole = st.st_size;
    for (off_t off = data; off < hole;) {
      size_t want = static_cast<size_t>(std::min<off_t>(hole - off, 1 << 20));
      ssize_t n = ::pread(in.get(), buf.get(), want, off);
      if (n <= 0) return ErrnoError("read " + path);
      for (ssize_t done = 0; done < n;) {
        ssize_t w =
            ::pwrite(mem.get(), buf.get() + done, static_cast<size_t>(n - done), off + done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return ErrnoError("fill the template memfd");
        done += w;
      }
      off += n;
    }
    at = hole;
  }
  // Sealed: from here no process can change these pages, not the daemon and not a clone.
  // Clones may still map them privately and writably (copy on write).
  if (::fcntl(mem.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    return ErrnoError("seal the template memfd");
  }
  int fd = mem.get();
  memory_[dir] = Memory{key, std::move(mem)};
  return fd;
}

Json TemplateStore::Describe(const TemplateShape& shape) {
  const std::string dir = DirFor(shape);
  Json out = {{"dir", dir}, {"memory_mib", shape.memory_mib}, {"cpus", shape.cpus}};
  auto key = ComputeTemplateKey(shape);
  if (!key.ok()) {
    out["state"] = "unknown";
    out["reason"] = key.status().message();
    return out;
  }
  std::shared_lock<std::shared_mutex> shared(LockFor(dir));
  std::string why = Check(dir, *key, shape.memory_mib);
  if (why.empty()) {
    out["state"] = "valid";
    auto meta = ReadFileToString(dir + "/meta.json");
    Json m = meta.ok() ? Json::parse(*meta, nullptr, false) : Json();
    if (m.is_object()) {
      out["created"] = StrOr(m, "created");
      out["build_ms"] = NumOr(m, "build_ms");
    }
  } else {
    out["state"] = FileSize(dir + "/meta.json") < 0 ? "none"
                   : why.starts_with(kTimerBroken)  ? "broken"
                                                    : "stale";
    out["reason"] = why;
  }
  if (auto meta = ReadFileToString(dir + "/meta.json"); meta.ok()) {
    Json m = Json::parse(*meta, nullptr, false);
    if (m.is_object() && m.contains("timer")) out["timer"] = m["timer"];
  }
  return out;
}

Json DescribeImageTemplate(const std::string& templates_root, const std::string& image_name,
                           const std::string& image_dir, const std::string& accel,
                           const std::string& qemu, bool own_uid) {
  auto sha = Sha256File(image_dir + "/manifest.json");
  if (!sha.ok()) return {{"state", "unknown"}, {"reason", sha.status().message()}};
  TemplateShape shape{image_name, image_dir, *sha, kDefaultMemoryMib, 1, accel, qemu, own_uid};
  TemplateStore store(templates_root, "", std::chrono::milliseconds(0));
  return store.Describe(shape);
}

}  // namespace trybox::vmm
