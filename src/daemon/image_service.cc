#include "daemon/image_service.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <regex>

#include "image/build.h"
#include "image/derive.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/process.h"
#include "util/sha256.h"

namespace trybox::daemon {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// The layer's capacity for what the guest measured: its blocks, a quarter more for ext4's
// own metadata, 256 bytes of inode table per inode (twice as many inodes as entries), and
// 32 MiB, in whole MiB. Unwritten blocks of the file stay holes.
uint64_t LayerCapacity(uint64_t bytes, uint64_t inodes) {
  uint64_t want = bytes + bytes / 4 + (inodes * 2 + 1024) * 256 + 32 * kMiB;
  return (want + kMiB - 1) / kMiB * kMiB;
}

// The guest's half of a commit, with the transfer disk held: the disk gets the host's empty
// ext4, the guest fills it, `layer` gets the disk's bytes. The disk is emptied afterwards
// whatever happened.
Status Capture(TransferDiskPort& port, const std::string& layer, uint64_t capacity, uint64_t inodes,
               GuestChannel& guest) {
  auto lock = port.TryLock();
  if (!lock) return Unavailable("the VM's transfer disk is busy with another transfer");
  {
    ASSIGN_OR_RETURN(UniqueFd f, OpenFile(layer, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (::ftruncate(f.get(), static_cast<off_t>(capacity)) != 0) return ErrnoError("size " + layer);
  }
  RETURN_IF_ERROR(RunChecked({"mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0", "-N",
                              std::to_string(inodes * 2 + 1024), "-O", "^has_journal", "-E",
                              "lazy_itable_init=1,root_owner=0:0", "-L", "trybox-layer", layer})
                      .Annotate("format the layer"));
  struct Emptied {
    TransferDiskPort& port;
    ~Emptied() { (void)port.Announce(0); }
  } emptied{port};
  RETURN_IF_ERROR(port.Announce(capacity));
  {
    ASSIGN_OR_RETURN(UniqueFd f, OpenFile(layer, O_RDONLY | O_CLOEXEC));
    RETURN_IF_ERROR(CopyDataExtents(f.get(), port.fd_for_io(), capacity));
    if (::fdatasync(port.fd_for_io()) != 0) return ErrnoError("flush the transfer disk");
  }
  RETURN_IF_ERROR(GuestCall(guest, {{"op", "layer_capture"}, {"disk", {{"bytes", capacity}}}},
                            "fill the layer disk")
                      .status());
  ASSIGN_OR_RETURN(UniqueFd f, OpenFile(layer, O_WRONLY | O_TRUNC | O_CLOEXEC));
  if (::ftruncate(f.get(), static_cast<off_t>(capacity)) != 0) return ErrnoError("size " + layer);
  RETURN_IF_ERROR(CopyDataExtents(port.fd_for_io(), f.get(), capacity));
  if (::fsync(f.get()) != 0) return ErrnoError("sync " + layer);
  return Status::Ok();
}

uint64_t TreeBytes(const std::string& dir) {
  uint64_t total = 0;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return image::DiskBytes(dir);
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    struct stat st;
    std::string p = dir + "/" + n;
    if (::lstat(p.c_str(), &st) != 0) continue;
    total += S_ISDIR(st.st_mode) ? TreeBytes(p) : static_cast<uint64_t>(st.st_blocks) * 512;
  }
  ::closedir(d);
  return total;
}

ImageError Named(Status st, const char* kind) { return {std::move(st), kind}; }

}  // namespace

ImageService::ImageService(const Paths& paths, VmRegistry& registry, vmm::TemplateStore& templates)
    : images_root_(paths.images),
      templates_root_(paths.templates()),
      cache_root_(paths.cache),
      registry_(registry),
      templates_(templates) {}

std::map<std::string, int> ImageService::InUse() const {
  std::map<std::string, int> out;
  for (const auto& vm : registry_.All()) {
    if (vm->alive()) out[vm->record().image] += 1;
  }
  return out;
}

Result<CommittedImage> ImageService::Commit(const CommitRequest& req, const Progress& progress,
                                            ImageError* error) {
  auto fail = [&](Status st, const char* kind) -> Status {
    *error = Named(st, kind);
    return st;
  };
  std::shared_ptr<VmEntry> vm = registry_.Find(req.vm);
  if (!vm || !vm->alive()) {
    return fail(FailedPrecondition("VM '" + req.vm + "' is not running"), "vm_not_running");
  }
  TransferDiskPort* port = vm->transfer_disk();
  if (port == nullptr) {
    return fail(FailedPrecondition("VM '" + req.vm + "' has no transfer disk to commit through"),
                "capture_failed");
  }
  struct stat st;
  const bool existed = ::stat((images_root_ + "/" + req.name + "/manifest.json").c_str(), &st) == 0;
  if (existed && !req.replace) {
    return fail(Status(Code::kAlreadyExists, "image '" + req.name + "' exists"), "image_exists");
  }
  if (progress) progress("size", "measuring what the VM wrote");
  auto size = GuestCall(*vm, {{"op", "layer_size"}}, "measure what the VM wrote");
  if (!size.ok()) return fail(size.status(), "capture_failed");
  const uint64_t inodes = size->value("inodes", uint64_t{0});
  const uint64_t capacity = LayerCapacity(size->value("bytes", uint64_t{0}), inodes);
  struct statvfs vfs;
  if (::statvfs(images_root_.c_str(), &vfs) == 0 &&
      static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < capacity) {
    return fail(ResourceExhausted("the images filesystem has less free space than the layer "
                                  "needs (" +
                                  std::to_string(capacity / kMiB) + " MiB)"),
                "no_space");
  }
  image::DeriveOptions o;
  o.images_root = images_root_;
  o.parent = vm->record().image;
  o.name = req.name;
  o.replace = req.replace;
  o.env = req.env;
  o.vm = req.vm;
  o.recipe = req.recipe;
  o.recipe_sha256 = req.recipe_sha256;
  o.checks_pending = req.checks_pending;
  o.packages = req.packages;
  o.write_layer = [&](const std::string& layer) {
    if (progress) progress("capture", "copying the VM's writes into a layer");
    Status s = Capture(*port, layer, capacity, inodes, *vm);
    if (s.ok() && progress) progress("freeze", "hashing and freezing the image");
    return s;
  };
  auto m = image::DeriveImage(o);
  if (!m.ok()) {
    const Status& s = m.status();
    const char* kind = s.code() == Code::kAlreadyExists       ? "image_exists"
                       : s.code() == Code::kResourceExhausted ? "no_space"
                       : s.message().find("layers, the most") != std::string::npos
                           ? "too_deep"
                           : "capture_failed";
    return fail(s, kind);
  }
  CommittedImage out;
  const std::string dir = images_root_ + "/" + req.name;
  out.manifest = std::move(m).value();
  ASSIGN_OR_RETURN(out.manifest_sha256, Sha256File(dir + "/manifest.json"));
  out.layer_bytes = image::DiskBytes(dir + "/" + out.manifest.layers.back().part);
  out.replaced = existed;
  // A replaced image's templates were built for the old manifest; the key check would
  // rebuild them anyway, so they go now.
  if (existed) {
    for (const auto& [dir_name, shape] : Templates()) {
      if (shape.image_name == req.name) templates_.Discard(shape, "its image was replaced");
    }
  }
  LogInfo("images", "committed VM " + req.vm + " as image " + req.name + " (layer " +
                        std::to_string(out.layer_bytes / 1024) + " KiB on disk)");
  return out;
}

std::vector<std::pair<std::string, vmm::TemplateShape>> ImageService::Templates() const {
  std::vector<std::pair<std::string, vmm::TemplateShape>> out;
  static const std::regex kName("^(.+)-([0-9]+)m-([0-9]+)c-(kvm|tcg)$");
  DIR* d = ::opendir(templates_root_.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = ::readdir(d)) {
    std::smatch m;
    std::string n = e->d_name;
    if (!std::regex_match(n, m, kName)) continue;
    vmm::TemplateShape shape;
    shape.image_name = m[1];
    shape.image_dir = images_root_ + "/" + shape.image_name;
    shape.memory_mib = std::stoi(m[2]);
    shape.cpus = std::stoi(m[3]);
    shape.accel = m[4];
    out.emplace_back(n, shape);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first < b.first; });
  return out;
}

Result<std::vector<ImageView>> ImageService::List() {
  return ListImageViews(images_root_, InUse());
}

Result<RemovedImage> ImageService::Remove(const std::string& name, ImageError* error) {
  auto fail = [&](Status st, const char* kind) -> Status {
    *error = Named(st, kind);
    return st;
  };
  ASSIGN_OR_RETURN(auto views, List());
  auto it = std::find_if(views.begin(), views.end(),
                         [&](const ImageView& v) { return v.entry.name == name; });
  if (it == views.end()) return fail(NotFound("image '" + name + "' does not exist"), "");
  if (it->in_use > 0) {
    return fail(
        FailedPrecondition("image '" + name + "' is in use by " + std::to_string(it->in_use) +
                           " running VM(s); destroy them first"),
        "image_in_use");
  }
  if (!it->derived.empty()) {
    std::string names;
    for (const auto& d : it->derived) names += (names.empty() ? "" : ", ") + d;
    return fail(FailedPrecondition("image '" + name + "' is the parent of " + names +
                                   "; remove those first"),
                "image_has_derived");
  }
  RemovedImage out;
  out.name = name;
  out.bytes = it->own_bytes;
  // Under the image lock, so that no build or commit is reading it as a parent.
  const std::string dir = images_root_ + "/" + name;
  const std::string gone = images_root_ + "/.old-" + name + "-" + std::to_string(::getpid());
  {
    ASSIGN_OR_RETURN(UniqueFd lock, image::LockImagesRoot(images_root_));
    if (::rename(dir.c_str(), gone.c_str()) != 0) return ErrnoError("move " + dir + " aside");
  }
  // Frozen parts and directory: open them up to unlink.
  (void)::chmod(gone.c_str(), 0755);
  Status removed = RemoveTree(gone);
  if (!removed.ok()) LogWarn("images", removed.message());
  for (const auto& [dir_name, shape] : Templates()) {
    if (shape.image_name != name) continue;
    templates_.Discard(shape, "its image was removed");
    out.templates.push_back(dir_name);
  }
  return out;
}

std::vector<std::string> ImageService::RemoveTemplates(const std::string& name) {
  return templates_.RemoveImageTemplates(name);
}

std::vector<Freed> ImageService::RemoveBuildLeftovers(bool dry_run) {
  std::vector<Freed> out;
  for (const std::string& dir : {images_root_, cache_root_ + "/tmp"}) {
    for (const image::StaleBuild& b : image::FindStaleBuilds(dir)) {
      if (!dry_run) {
        (void)::chmod(b.path.c_str(), 0755);  // a frozen `.build-` directory is 0555
        Status st = RemoveTree(b.path);
        if (!st.ok()) {
          LogWarn("images", "could not remove a dead build's leftover: " + st.message());
          continue;
        }
      }
      out.push_back({"build_leftover", b.path, b.bytes});
    }
  }
  return out;
}

Result<Pruned> ImageService::Prune(const PruneOptions& opts) {
  Pruned out;
  ASSIGN_OR_RETURN(auto images, image::ListImages(images_root_));
  auto valid = [&](const std::string& name) {
    return std::any_of(images.begin(), images.end(),
                       [&](const image::ImageEntry& e) { return e.name == name && e.valid; });
  };
  for (const auto& [dir_name, shape] : Templates()) {
    // A template of an image that is gone, or built for another manifest than the image's
    // (the image was replaced): no create would restore it.
    const std::string path = templates_root_ + "/" + dir_name;
    bool keep = valid(shape.image_name);
    if (keep) {
      auto sha = Sha256File(shape.image_dir + "/manifest.json");
      auto meta = ReadFileToString(path + "/meta.json");
      Json j = meta.ok() ? Json::parse(*meta, nullptr, false) : Json();
      const Json* inputs = j.is_object() && j.contains("inputs") ? &j["inputs"] : nullptr;
      keep =
          sha.ok() && inputs && inputs->is_object() && inputs->value("manifest_sha256", "") == *sha;
    }
    if (keep) continue;
    uint64_t bytes = TreeBytes(path);
    if (!opts.dry_run) templates_.Discard(shape, "pruned");
    out.freed.push_back({"template", path, bytes});
  }
  for (Freed& f : RemoveBuildLeftovers(opts.dry_run)) out.freed.push_back(std::move(f));
  // Staged images of recipe builds that never passed their checks (a build killed during
  // them); one that a VM still uses is a build's check in progress.
  ASSIGN_OR_RETURN(auto views, List());
  for (const ImageView& v : views) {
    if (!v.entry.valid || !v.entry.manifest.checks_pending || v.in_use > 0) continue;
    if (!v.derived.empty()) continue;
    if (!opts.dry_run) {
      ImageError error;
      auto removed = Remove(v.entry.name, &error);
      if (!removed.ok()) continue;
    }
    out.freed.push_back({"unchecked_image", v.entry.dir, v.own_bytes});
  }
  const std::string rootfs = cache_root_ + "/rootfs";
  if (DIR* d = ::opendir(rootfs.c_str())) {
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".ext4") == 0) names.push_back(n);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) {
      const std::string path = rootfs + "/" + n;
      uint64_t bytes = image::DiskBytes(path);
      if (!opts.rootfs_cache) {
        out.kept.push_back({"rootfs_cache", path, bytes});
      } else if (opts.dry_run || ::unlink(path.c_str()) == 0) {
        out.freed.push_back({"rootfs_cache", path, bytes});
      }
    }
  }
  return out;
}

}  // namespace trybox::daemon
