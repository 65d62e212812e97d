#include "image/derive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "image/build.h"
#include "util/fd.h"
#include "util/names.h"
#include "util/process.h"
#include "util/sha256.h"

namespace trybox::image {
namespace {

// A hard link where the filesystem allows one (the parts are frozen, so sharing the inode
// is safe), else a copy that keeps holes.
Status LinkOrCopy(const std::string& from, const std::string& to) {
  if (::link(from.c_str(), to.c_str()) == 0) return Status::Ok();
  return RunChecked({"cp", "--reflink=auto", "--sparse=always", from, to}).Annotate("copy " + from);
}

Status SyncFs(const std::string& dir) {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(dir, O_RDONLY | O_DIRECTORY));
  if (::syncfs(fd.get()) != 0) return ErrnoError("sync " + dir);
  return Status::Ok();
}

Status Derive(const DeriveOptions& opts, Manifest* out) {
  const std::string final_dir = opts.images_root + "/" + opts.name;
  struct stat st;
  if (!opts.replace && ::stat((final_dir + "/manifest.json").c_str(), &st) == 0) {
    return Status(Code::kAlreadyExists,
                  "image '" + opts.name + "' exists (remove it first, or replace it)");
  }
  ASSIGN_OR_RETURN(std::string parent_dir, ImageDir(opts.images_root, opts.parent));
  RETURN_IF_ERROR(VerifyImage(parent_dir));
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(parent_dir));
  ASSIGN_OR_RETURN(std::string parent_sha, Sha256File(parent_dir + "/manifest.json"));
  if (m.layers.size() >= static_cast<size_t>(kMaxLayers)) {
    return FailedPrecondition("image '" + opts.parent + "' already has " +
                              std::to_string(kMaxLayers) + " layers, the most an image can have");
  }

  const std::string build_dir =
      opts.images_root + "/.build-" + opts.name + "-" + std::to_string(::getpid());
  RETURN_IF_ERROR(RemoveTree(build_dir));
  if (::mkdir(build_dir.c_str(), 0755) != 0) return ErrnoError("mkdir " + build_dir);
  RemoveOnExit cleanup(build_dir);
  for (const auto& [part, info] : m.files) {
    RETURN_IF_ERROR(LinkOrCopy(parent_dir + "/" + part, build_dir + "/" + part));
  }
  const std::string part = LayerPartName(static_cast<int>(m.layers.size() + 1));
  const std::string layer = build_dir + "/" + part;
  RETURN_IF_ERROR(opts.write_layer(layer));
  if (::stat(layer.c_str(), &st) != 0) return ErrnoError("stat " + layer);
  ASSIGN_OR_RETURN(std::string sha, Sha256File(layer));
  if (::chmod(layer.c_str(), 0444) != 0) return ErrnoError("chmod " + layer);

  if (m.format == kManifestFormat) m.base = {opts.parent, parent_sha};
  m.format = kDerivedManifestFormat;
  m.name = opts.name;
  m.created = NowUtc();
  m.parent = {opts.parent, parent_sha};
  m.layers.push_back({opts.name, part});
  m.env = MergeEnv(m.env, opts.env);
  m.vm = opts.vm;
  m.recipe = opts.recipe;
  m.recipe_sha256 = opts.recipe_sha256;
  m.checks_pending = opts.checks_pending;  // never inherited from the parent
  for (const std::string& p : opts.packages) {
    if (std::find(m.packages.begin(), m.packages.end(), p) == m.packages.end()) {
      m.packages.push_back(p);
    }
  }
  m.files[part] = PartInfo{sha, static_cast<uint64_t>(st.st_size)};
  RETURN_IF_ERROR(WriteFileAtomic(build_dir + "/manifest.json", ManifestToJson(m), 0444));
  RETURN_IF_ERROR(SyncFs(build_dir));
  if (::chmod(build_dir.c_str(), 0555) != 0) return ErrnoError("chmod " + build_dir);
  RETURN_IF_ERROR(InstallImageDir(opts.images_root, opts.name, build_dir, cleanup));
  ASSIGN_OR_RETURN(*out, ReadManifest(final_dir));
  return Status::Ok();
}

}  // namespace

uint64_t DiskBytes(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

Result<Manifest> DeriveImage(const DeriveOptions& opts) {
  RETURN_IF_ERROR(ValidateName("image name", opts.name));
  RETURN_IF_ERROR(ValidateName("image name", opts.parent));
  if (!opts.write_layer) return InvalidArgument("a derived image needs its layer");
  RETURN_IF_ERROR(MakeDirs(opts.images_root));
  ASSIGN_OR_RETURN(UniqueFd lock, LockImagesRoot(opts.images_root));
  (void)RemoveStaleBuilds(opts.images_root);
  Manifest m;
  RETURN_IF_ERROR(Derive(opts, &m));
  return m;
}

}  // namespace trybox::image
