// BuildImage: kernel from the Debian archive, rootfs from mmdebstrap, both cached under
// cache_dir; assembled in a dot-directory and swapped into place. Layout: docs/images.md.
// Started by `trybox image build` as its own program, trybox-image-build
// (image/image_build_main.cc).
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>

#include "image/build.h"
#include "image/image.h"
#include "image/kernel.h"
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

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string Pid() { return std::to_string(::getpid()); }

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
    if (line.starts_with(field + ":")) {
      std::vector<std::string> t = Words(line.substr(field.size() + 1));
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
    std::vector<std::string> t = Words(line);
    if (t.size() >= 2 && (t[0] == "Depends:" || t[0] == "|Depends:") &&
        t[1].starts_with("linux-image-")) {
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
  std::vector<std::string> t = Words(du);
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
