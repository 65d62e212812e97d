// BuildImage: kernel from the Debian archive, rootfs from mmdebstrap, both cached under
// cache_dir; assembled in a dot-directory and swapped into place. Layout: docs/images.md.
#include "image/build.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <sstream>

#include "image/image.h"
#include "image/kernel.h"
#include "util/ascii.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/names.h"
#include "util/process.h"
#include "util/sha256.h"

namespace trybox::image {
namespace {

struct Recipe {
  std::string name;
  std::string suite;
  std::string kernel_metapackage;
  std::vector<std::string> packages;
  std::vector<std::string> modules;  // wanted; their dependencies are added
};

const std::vector<Recipe>& Recipes() {
  static const std::vector<Recipe> kRecipes = {{
      "debian-12",
      "bookworm",
      "linux-image-amd64",
      // qemu-guest-agent is unused by trybox; the benchmarks compare against it.
      {"bash", "coreutils", "ca-certificates", "git", "python3", "curl", "tar", "procps",
       "iproute2", "qemu-guest-agent"},
      // crc32c_generic: ext4 and jbd2 request "crypto-crc32c" (a softdep, not in modules.dep)
      // when mounting a metadata_csum filesystem, and the guest has no modprobe to find it.
      {"virtio_mmio", "virtio_blk", "virtio_console", "virtio_rng", "crc32c_generic", "ext4",
       "overlay"},
  }};
  return kRecipes;
}

// Part of the rootfs cache key: bump when the steps after mmdebstrap change.
// 3: the unprivileged account "user" (kUserHook).
constexpr char kRootfsRevision[] = "trybox-rootfs-3";
constexpr uint64_t kMiB = 1024 * 1024;
constexpr uint64_t kScratchSize = uint64_t{8} << 30;
// The scratch file system's identity: the same for every image (it is empty, and each VM
// writes its own copy). 2025-01-01T00:00:00Z for its times.
constexpr const char* kScratchUuid = "7472796b-6f78-4000-8000-736372617463";
constexpr const char* kScratchHashSeed = "7472796b-6f78-4000-8000-686173687365";
constexpr time_t kScratchTime = 1735689600;
constexpr int kSteps = 6;
// The account commands run as when an exec asks for "user" (the supervisor's verification
// re-run, E2B's default): uid and gid 1000, home /home/user (from /etc/skel, owned by it),
// bash if the rootfs has it. Run by mmdebstrap inside the new tree (in unshare mode too,
// where the builder could not chown to 1000 itself); the ids are fixed, so every build
// makes the same account.
constexpr char kUserHook[] =
    "chroot \"$1\" useradd --create-home --uid 1000 --user-group "
    "--shell \"$(if [ -x \"$1/bin/bash\" ]; then echo /bin/bash; else echo /bin/sh; fi)\" user";

std::string Join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::vector<std::string> Tokens(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

bool StartsWith(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool EndsWith(const std::string& s, const std::string& x) {
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}
bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string Pid() { return std::to_string(::getpid()); }

// True if any deb822 stanza is enabled, has type "deb" and lists `suite`.
bool Deb822ServesSuite(const std::string& content, const std::string& suite) {
  std::istringstream in(content + "\n\n");
  std::map<std::string, std::string> fields;
  std::string last;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty() && line[0] == '#') continue;
    if (line.find_first_not_of(" \t") == std::string::npos) {
      if (Tokens(fields["enabled"]) != std::vector<std::string>{"no"} &&
          Contains(Tokens(fields["types"]), "deb") && Contains(Tokens(fields["suites"]), suite)) {
        return true;
      }
      fields.clear();
      last.clear();
    } else if (line[0] == ' ' || line[0] == '\t') {
      if (!last.empty()) fields[last] += " " + line;
    } else if (size_t colon = line.find(':'); colon != std::string::npos) {
      last = AsciiLower(line.substr(0, colon));
      fields[last] = line.substr(colon + 1);
    }
  }
  return false;
}

// True if a "deb [options] URI SUITE COMPONENTS..." line names `suite`.
bool OneLineServesSuite(const std::string& content, const std::string& suite) {
  std::istringstream in(content);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> t = Tokens(line.substr(0, line.find('#')));
    if (t.empty() || t[0] != "deb") continue;
    size_t i = 1;
    if (i < t.size() && StartsWith(t[i], "[")) {
      while (i < t.size() && !EndsWith(t[i], "]")) ++i;
      ++i;
    }
    if (i + 1 < t.size() && t[i + 1] == suite) return true;
  }
  return false;
}

std::optional<pid_t> ParsePid(const std::string& s) {
  if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), ::isdigit)) return {};
  pid_t pid = std::stoi(s);
  if (pid <= 0) return {};
  return pid;
}

// The pid encoded in a build leftover's name: ".build-NAME-PID", ".old-NAME-PID" or
// "STEP-PID-RANDOM" (a TempDir under cache_dir/tmp).
std::optional<pid_t> LeftoverPid(const std::string& name) {
  if (StartsWith(name, ".build-") || StartsWith(name, ".old-")) {
    return ParsePid(name.substr(name.rfind('-') + 1));
  }
  for (const char* step : {"kernel-", "rootfs-", "scratch-"}) {
    if (!StartsWith(name, step)) continue;
    std::string rest = name.substr(std::strlen(step));
    return ParsePid(rest.substr(0, rest.find('-')));
  }
  return {};
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string UnescapeMountPath(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool HasMountsUnder(const std::string& path) {
  char real[PATH_MAX];
  if (::realpath(path.c_str(), real) == nullptr) return false;
  std::string root = real;
  Result<std::string> info = ReadFileToString("/proc/self/mountinfo");
  if (!info.ok()) return true;  // cannot tell: do not recurse
  std::istringstream in(*info);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f = Tokens(line);
    if (f.size() < 5) continue;
    std::string mp = UnescapeMountPath(f[4]);
    if (mp == root || StartsWith(mp, root + "/")) return true;
  }
  return false;
}

// Removes a directory tree when dropped, unless released: for dot-directories whose name we
// choose (TempDir picks a random one).

// Runs a command and returns its combined output; a non-zero exit is an error with the tail.
Result<std::string> RunForOutput(const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(CommandResult r, RunCommand(argv));
  if (!r.exit.exited || r.exit.code != 0) {
    std::string tail = r.output.size() > 2000 ? r.output.substr(r.output.size() - 2000) : r.output;
    return Internal(Join(argv, " ") + " failed (" + r.exit.Describe() + "): " + tail);
  }
  return r.output;
}

// "Version: 6.1.192-3" from apt-cache show.
std::string ControlField(const std::string& text, const std::string& field) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (StartsWith(line, field + ":")) {
      std::vector<std::string> t = Tokens(line.substr(field.size() + 1));
      return t.empty() ? "" : t[0];
    }
  }
  return "";
}

// A name apt gave us that becomes a path component.
Status CheckPathComponent(const std::string& what, const std::string& s) {
  if (s.empty() || s[0] == '.' || s.find('/') != std::string::npos) {
    return Internal("unexpected " + what + " " + QuoteForMessage(s));
  }
  return Status::Ok();
}

Status CopyFile(const std::string& from, const std::string& to) {
  // cp keeps holes (the rootfs is sparse) and reflinks where the filesystem can.
  return RunChecked({"cp", "--reflink=auto", from, to});
}

Status SyncDir(const std::string& dir, bool whole_fs) {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(dir, O_RDONLY | O_DIRECTORY));
  if ((whole_fs ? ::syncfs(fd.get()) : ::fsync(fd.get())) != 0) return ErrnoError("sync " + dir);
  return Status::Ok();
}

struct Kernel {
  std::string package;  // linux-image-6.1.0-57-amd64
  std::string version;  // Debian version, 6.1.192-3
  std::string release;  // uname -r, 6.1.0-57-amd64
  std::string root;     // the extracted package
  std::string vmlinux;
};

class Builder {
 public:
  Builder(const BuildOptions& opts, const Recipe& recipe)
      : opts_(opts),
        recipe_(recipe),
        kernel_cache_(opts.cache_dir + "/kernel"),
        rootfs_cache_(opts.cache_dir + "/rootfs"),
        tmp_(opts.cache_dir + "/tmp") {}

  Status Run();

 private:
  void Step(const std::string& line) {
    if (opts_.progress)
      opts_.progress("[" + std::to_string(++step_) + "/" + std::to_string(kSteps) + "] " + line);
  }
  Result<UniqueFd> Lock();
  Status CheckTools();
  Result<Kernel> PrepareKernel();
  Result<std::string> PrepareRootfs();
  Status WriteInitrd(const Kernel& k, const std::string& init, const std::string& out,
                     std::vector<std::string>* modules);
  Status MakeScratch(const std::string& out);
  Status Install(const std::string& build_dir, RemoveOnExit& cleanup);

  const BuildOptions& opts_;
  const Recipe& recipe_;
  const std::string kernel_cache_, rootfs_cache_, tmp_;
  int step_ = 0;
};

Result<UniqueFd> Builder::Lock() { return LockImagesRoot(opts_.images_root); }

Status Builder::CheckTools() {
  static const std::pair<const char*, const char*> kTools[] = {
      {"apt-cache", "apt"},       {"apt-get", "apt"},           {"dpkg-deb", "dpkg"},
      {"depmod", "kmod"},         {"mmdebstrap", "mmdebstrap"}, {"mkfs.ext4", "e2fsprogs"},
      {"qemu-img", "qemu-utils"}, {"cp", "coreutils"},          {"du", "coreutils"},
      {"env", "coreutils"}};
  for (const auto& [tool, package] : kTools) {
    if (!FindInPath(tool)) {
      return FailedPrecondition(std::string("building an image needs ") + tool +
                                " in PATH (apt-get install " + package + ")");
    }
  }
  return Status::Ok();
}

Status Builder::Run() {
  RETURN_IF_ERROR(MakeDirs(opts_.images_root));
  for (const std::string& d : {kernel_cache_, rootfs_cache_, tmp_}) RETURN_IF_ERROR(MakeDirs(d));
  ASSIGN_OR_RETURN(UniqueFd lock, Lock());
  for (const std::string& d : {opts_.images_root, tmp_}) {
    for (const std::string& p : RemoveStaleBuilds(d)) {
      LogInfo("image", "removed the leftover of an interrupted build: " + p);
    }
  }
  Result<std::string> init = ReadFileToString(opts_.init_binary);
  if (!init.ok()) return init.status().Annotate("init binary");
  RETURN_IF_ERROR(CheckStaticElf(*init, "init binary " + opts_.init_binary));
  RETURN_IF_ERROR(CheckTools());

  const std::string build_dir = opts_.images_root + "/.build-" + opts_.name + "-" + Pid();
  RETURN_IF_ERROR(RemoveTree(build_dir));
  if (::mkdir(build_dir.c_str(), 0755) != 0) return ErrnoError("mkdir " + build_dir);
  RemoveOnExit cleanup(build_dir);

  auto interrupted = [&] { return opts_.cancelled && opts_.cancelled(); };
  const Status kInterrupted = FailedPrecondition("image build interrupted");
  ASSIGN_OR_RETURN(Kernel kernel, PrepareKernel());
  if (interrupted()) return kInterrupted;
  ASSIGN_OR_RETURN(std::string rootfs, PrepareRootfs());
  if (interrupted()) return kInterrupted;

  Manifest m;
  m.name = opts_.name;
  m.suite = recipe_.suite;
  m.kernel_version = kernel.release;
  m.kernel_package = kernel.package + "=" + kernel.version;
  m.packages = recipe_.packages;
  m.init_sha256 = Sha256Hex(*init);
  RETURN_IF_ERROR(WriteInitrd(kernel, *init, build_dir + "/initrd.cpio", &m.modules));
  RETURN_IF_ERROR(MakeScratch(build_dir + "/scratch.qcow2"));

  Step("manifest: hashing the parts");
  RETURN_IF_ERROR(CopyFile(kernel.vmlinux, build_dir + "/vmlinux"));
  RETURN_IF_ERROR(CopyFile(rootfs, build_dir + "/rootfs.ext4"));
  for (const char* part : kPartNames) {
    std::string path = build_dir + "/" + part;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoError("stat " + path);
    ASSIGN_OR_RETURN(std::string sha, Sha256File(path));
    m.files[part] = PartInfo{sha, static_cast<uint64_t>(st.st_size)};
    if (::chmod(path.c_str(), 0444) != 0) return ErrnoError("chmod " + path);
  }
  m.created = NowUtc();
  // A build that made the same image as the one installed keeps its creation time, so its
  // manifest, and with it the manifest's SHA-256, stays the same: the images derived from it
  // (which record that SHA-256) and the templates booted from it stay current instead of
  // being rebuilt (a recipe image took 23 min here for nothing).
  if (auto had = ReadManifest(opts_.images_root + "/" + opts_.name); had.ok()) {
    m.created = CreatedFor(m, *had);
  }
  RETURN_IF_ERROR(WriteFileAtomic(build_dir + "/manifest.json", ManifestToJson(m), 0444));
  // The parts were written by child processes that do not fsync; the swap below must not
  // become visible before their bytes are on disk.
  RETURN_IF_ERROR(SyncDir(build_dir, /*whole_fs=*/true));
  if (::chmod(build_dir.c_str(), 0555) != 0) return ErrnoError("chmod " + build_dir);

  if (interrupted()) return kInterrupted;
  Step("install: " + opts_.images_root + "/" + opts_.name);
  RETURN_IF_ERROR(Install(build_dir, cleanup));
  // Catches a manifest we cannot read back before anyone tries to boot it.
  return ReadManifest(opts_.images_root + "/" + opts_.name).status();
}

Result<Kernel> Builder::PrepareKernel() {
  Kernel k;
  Result<std::string> deps = RunForOutput({"apt-cache", "depends", recipe_.kernel_metapackage});
  if (!deps.ok()) return deps.status().Annotate("finding the kernel (is apt-get update done?)");
  std::istringstream in(*deps);
  for (std::string line; std::getline(in, line) && k.package.empty();) {
    std::vector<std::string> t = Tokens(line);
    if (t.size() >= 2 && (t[0] == "Depends:" || t[0] == "|Depends:") &&
        StartsWith(t[1], "linux-image-")) {
      k.package = t[1];
    }
  }
  if (k.package.empty()) {
    return FailedPrecondition("apt-cache depends " + recipe_.kernel_metapackage +
                              " names no linux-image-* package");
  }
  k.release = k.package.substr(std::strlen("linux-image-"));
  ASSIGN_OR_RETURN(std::string show,
                   RunForOutput({"apt-cache", "show", "--no-all-versions", k.package}));
  k.version = ControlField(show, "Version");
  std::string arch = ControlField(show, "Architecture");
  RETURN_IF_ERROR(CheckPathComponent("kernel package", k.package));
  RETURN_IF_ERROR(CheckPathComponent("kernel version", k.version));
  RETURN_IF_ERROR(CheckPathComponent("architecture", arch));

  std::string escaped = k.version;  // apt writes an epoch's ':' as %3a in file names
  for (size_t p; (p = escaped.find(':')) != std::string::npos;) escaped.replace(p, 1, "%3a");
  const std::string deb = kernel_cache_ + "/" + k.package + "_" + escaped + "_" + arch + ".deb";
  const std::string unpacked = kernel_cache_ + "/" + k.package + "_" + k.version;
  k.root = unpacked + "/root";
  k.vmlinux = unpacked + "/vmlinux";
  const std::string modules_dep = k.root + "/lib/modules/" + k.release + "/modules.dep";
  bool cached = Exists(deb) && Exists(modules_dep) && Exists(k.vmlinux);
  Step("kernel: " + k.package + " " + k.version + (cached ? " (cached)" : ""));

  if (!Exists(deb)) {
    // apt-get download writes to its working directory. As root it warns that the _apt
    // user cannot write there and downloads unsandboxed: harmless.
    RETURN_IF_ERROR(RunChecked(
        {"env", "-C", kernel_cache_, "apt-get", "download", k.package + "=" + k.version}));
    if (!Exists(deb)) return Internal("apt-get download did not produce " + deb);
  }
  if (!Exists(modules_dep)) {
    ASSIGN_OR_RETURN(TempDir tmp, TempDir::Make(tmp_, "kernel-" + Pid() + "-"));
    RETURN_IF_ERROR(RunChecked({"dpkg-deb", "-x", deb, tmp.path() + "/root"}));
    RETURN_IF_ERROR(RunChecked({"depmod", "-b", tmp.path() + "/root", k.release}));
    if (::chmod(tmp.path().c_str(), 0755) != 0) return ErrnoError("chmod " + tmp.path());
    int err = ::rename(tmp.path().c_str(), unpacked.c_str()) == 0 ? 0 : errno;
    if (err == 0) {
      tmp.Release();
    } else if (!((err == ENOTEMPTY || err == EEXIST) && Exists(modules_dep))) {
      // (A build sharing this cache_dir unpacking the same kernel may win the race: fine.)
      return ErrnoError(
          "rename " + tmp.path() + " -> " + unpacked + " (remove it if it is a broken cache entry)",
          err);
    }
  }
  if (!Exists(k.vmlinux)) {
    ASSIGN_OR_RETURN(std::string bzimage, ReadFileToString(k.root + "/boot/vmlinuz-" + k.release));
    ASSIGN_OR_RETURN(std::string vmlinux, ExtractVmlinux(bzimage));
    RETURN_IF_ERROR(WriteFileAtomic(k.vmlinux, vmlinux, 0644));
  }
  return k;
}

Result<std::string> Builder::PrepareRootfs() {
  ASSIGN_OR_RETURN(AptSources sources, FindAptSources("/etc/apt", recipe_.suite));
  ASSIGN_OR_RETURN(std::string mmdebstrap_version, RunForOutput({"mmdebstrap", "--version"}));
  const std::string packages = Join(recipe_.packages, ",");
  const std::string key = Sha256Hex(std::string(kRootfsRevision) + "\n" + recipe_.suite + "\n" +
                                    packages + "\n" + mmdebstrap_version + "\n" + sources.content);
  const std::string cached = rootfs_cache_ + "/" + key + ".ext4";
  if (!opts_.rebuild_rootfs && Exists(cached)) {
    Step("rootfs: mmdebstrap " + recipe_.suite + " (cached)");
    return cached;
  }
  Step("rootfs: mmdebstrap " + recipe_.suite + " from " + sources.path + " (takes a while)");

  ASSIGN_OR_RETURN(TempDir tmp, TempDir::Make(tmp_, "rootfs-" + Pid() + "-"));
  const std::string tree = tmp.path() + "/tree";
  const std::string image = tmp.path() + "/rootfs.ext4";
  RETURN_IF_ERROR(RunChecked({"mmdebstrap", ::geteuid() == 0 ? "--mode=root" : "--mode=unshare",
                              "--variant=minbase", "--include=" + packages,
                              std::string("--customize-hook=") + kUserHook, recipe_.suite, tree,
                              sources.path}));
  // mkfs.ext4 -d gives the filesystem root the tree's mode.
  if (::chmod(tree.c_str(), 0755) != 0) return ErrnoError("chmod " + tree);
  // mmdebstrap copies the host's resolv.conf and hostname in. The guest has no DNS, and
  // the host's name is none of its business.
  RETURN_IF_ERROR(WriteFileAtomic(tree + "/etc/resolv.conf", "", 0644));
  RETURN_IF_ERROR(WriteFileAtomic(tree + "/etc/hostname", "trybox\n", 0644));
  RETURN_IF_ERROR(MakeDirs(tree + "/workspace", 0755));

  ASSIGN_OR_RETURN(std::string du, RunForOutput({"du", "-s", "-x", "-B1", tree}));
  std::vector<std::string> t = Tokens(du);
  if (t.empty() || !std::all_of(t[0].begin(), t[0].end(), ::isdigit)) {
    return Internal("cannot parse du output: " + du);
  }
  // The rootfs is mounted read-only (guest writes go to the scratch overlay); 30% + 128 MiB
  // covers ext4's own metadata with room to spare.
  uint64_t used = std::stoull(t[0]);
  uint64_t mib = static_cast<uint64_t>(std::ceil((used * 1.3 + 128.0 * kMiB) / kMiB));
  // -b 4096: below 512 MiB mke2fs would pick 1 KiB blocks (its "small" type).
  RETURN_IF_ERROR(RunChecked({"mkfs.ext4", "-q", "-F", "-b", "4096", "-L", "trybox-root", "-d",
                              tree, image, std::to_string(mib) + "M"}));
  if (::rename(image.c_str(), cached.c_str()) != 0) {
    return ErrnoError("rename " + image + " -> " + cached);
  }
  return cached;
}

Status Builder::WriteInitrd(const Kernel& k, const std::string& init, const std::string& out,
                            std::vector<std::string>* modules) {
  const std::string mod_dir = k.root + "/lib/modules/" + k.release;
  ASSIGN_OR_RETURN(std::string dep_text, ReadFileToString(mod_dir + "/modules.dep"));
  ASSIGN_OR_RETURN(std::vector<std::string> order, ModuleLoadOrder(dep_text, recipe_.modules));
  Step("initramfs: /init and " + std::to_string(order.size()) + " modules");
  InitramfsSpec spec;
  spec.kernel_version = k.release;
  spec.init = init;
  modules->clear();
  for (const std::string& rel : order) {
    ASSIGN_OR_RETURN(std::string data, ReadFileToString(mod_dir + "/" + rel));
    std::string stored = StoredModulePath(rel);
    if (stored != rel) {
      std::string plain;
      RETURN_IF_ERROR(Decompress(data, &plain).Annotate("module " + rel));
      data = std::move(plain);
    }
    modules->push_back(stored);
    spec.modules.emplace_back(stored, std::move(data));
  }
  return WriteInitramfs(spec, out);
}

Status Builder::MakeScratch(const std::string& out) {
  Step("scratch: empty 8 GiB ext4 as qcow2");
  ASSIGN_OR_RETURN(TempDir tmp, TempDir::Make(tmp_, "scratch-" + Pid() + "-"));
  return MakeScratchImage(tmp.path(), out);
}

Status Builder::Install(const std::string& build_dir, RemoveOnExit& cleanup) {
  return InstallImageDir(opts_.images_root, opts_.name, build_dir, cleanup);
}

}  // namespace

Status MakeScratchImage(const std::string& tmp_dir, const std::string& out) {
  const std::string raw = tmp_dir + "/scratch.raw";
  {
    ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(raw, O_WRONLY | O_CREAT | O_EXCL, 0644));
    if (::ftruncate(fd.get(), static_cast<off_t>(kScratchSize)) != 0) {
      return ErrnoError("truncate " + raw);
    }
    RETURN_IF_ERROR(fd.Close());
  }
  // Byte for byte the same every time (a fixed UUID, directory hash seed and time), so a
  // rebuild that changes nothing else keeps the manifest, and the images derived from it and
  // the templates stay current. With mke2fs's random ones, every `image build debian-12`
  // made debian-12-dev stale (rebuilt: 8 min under TCG) and every template cold.
  RETURN_IF_ERROR(RunChecked({"env", "E2FSPROGS_FAKE_TIME=" + std::to_string(kScratchTime),
                              "mkfs.ext4", "-q", "-F", "-L", "trybox-scratch", "-U", kScratchUuid,
                              "-E", std::string("hash_seed=") + kScratchHashSeed, raw}));
  return RunChecked({"qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, out});
}

std::string NowUtc() {
  time_t now = ::time(nullptr);
  struct tm tm;
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Result<UniqueFd> LockImagesRoot(const std::string& images_root) {
  std::string path = images_root + "/.lock";
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDWR | O_CREAT, 0644));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return FailedPrecondition("another image build is running in " + images_root);
    }
    return ErrnoError("flock " + path);
  }
  return fd;
}

Status InstallImageDir(const std::string& images_root, const std::string& name,
                       const std::string& build_dir, RemoveOnExit& cleanup) {
  const std::string final_dir = images_root + "/" + name;
  // One atomic swap: a concurrent boot sees the old image or the new one, never neither.
  // build_dir then holds the old image, which `cleanup` removes.
  if (::renameat2(AT_FDCWD, build_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    return SyncDir(images_root, false);
  }
  if (errno == ENOENT) {
    if (::rename(build_dir.c_str(), final_dir.c_str()) != 0) {
      return ErrnoError("rename " + build_dir + " -> " + final_dir);
    }
    cleanup.Release();
    return SyncDir(images_root, false);
  }
  if (errno != EINVAL && errno != ENOSYS) {
    return ErrnoError("swap " + build_dir + " with " + final_dir);
  }
  // The filesystem cannot exchange: move the old image aside first.
  const std::string old_dir = images_root + "/.old-" + name + "-" + Pid();
  if (::rename(final_dir.c_str(), old_dir.c_str()) != 0) {
    return ErrnoError("rename " + final_dir + " -> " + old_dir);
  }
  if (::rename(build_dir.c_str(), final_dir.c_str()) != 0) {
    Status st = ErrnoError("rename " + build_dir + " -> " + final_dir);
    (void)::rename(old_dir.c_str(), final_dir.c_str());
    return st;
  }
  cleanup.Release();
  (void)RemoveTree(old_dir);
  return SyncDir(images_root, false);
}

Result<AptSources> FindAptSources(const std::string& apt_dir, const std::string& suite) {
  std::vector<std::string> names;
  const std::string list_dir = apt_dir + "/sources.list.d";
  if (DIR* d = ::opendir(list_dir.c_str())) {
    while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::vector<std::pair<std::string, bool>> candidates;  // (path, deb822)
  for (const std::string& n : names) {
    // Anything else ("x.sources.disabled-by-farm", editor backups) is ignored, as apt does.
    if (EndsWith(n, ".sources")) candidates.emplace_back(list_dir + "/" + n, true);
    if (EndsWith(n, ".list")) candidates.emplace_back(list_dir + "/" + n, false);
  }
  candidates.emplace_back(apt_dir + "/sources.list", false);
  for (const auto& [path, deb822] : candidates) {
    Result<std::string> content = ReadFileToString(path);
    if (!content.ok()) {
      if (content.status().code() == Code::kNotFound) continue;
      return content.status();
    }
    if (deb822 ? Deb822ServesSuite(*content, suite) : OneLineServesSuite(*content, suite)) {
      return AptSources{path, std::move(content).value()};
    }
  }
  return NotFound("no apt source for suite '" + suite + "' in " + list_dir +
                  "/*.sources, *.list or " + apt_dir + "/sources.list");
}

std::vector<std::string> RemoveStaleBuilds(const std::string& dir) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return removed;
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  for (const std::string& name : names) {
    std::optional<pid_t> pid = LeftoverPid(name);
    if (!pid || ProcessExists(*pid)) continue;
    std::string path = dir + "/" + name;
    if (HasMountsUnder(path)) {
      LogWarn("image", "not removing " + path + ": something is still mounted under it");
      continue;
    }
    if (RemoveTree(path).ok()) removed.push_back(path);
  }
  return removed;
}

std::vector<std::string> KnownRecipes() {
  std::vector<std::string> out;
  for (const Recipe& r : Recipes()) out.push_back(r.name);
  return out;
}

Status BuildImage(const BuildOptions& opts) {
  RETURN_IF_ERROR(ValidateName("image name", opts.name));
  const Recipe* recipe = nullptr;
  for (const Recipe& r : Recipes()) {
    if (r.name == opts.name) recipe = &r;
  }
  if (recipe == nullptr) {
    return NotFound("no recipe for image '" + opts.name +
                    "' (known: " + Join(KnownRecipes(), ", ") + ")");
  }
  if (opts.images_root.empty() || opts.cache_dir.empty() || opts.init_binary.empty()) {
    return InvalidArgument("image build needs images_root, cache_dir and init_binary");
  }
  try {
    return Builder(opts, *recipe).Run();
  } catch (const std::exception& e) {
    // Unwinding has already removed the build directory.
    return Internal(std::string("image build: ") + e.what());
  }
}

}  // namespace trybox::image
