// ImageService: images made from running VMs (commit), and the management of images (ls,
// rm, prune), which needs the daemon's knowledge of its running VMs (docs/images.md,
// "Derived images"; docs/protocol/daemon.md, the commit and image_* verbs).
//
// A commit measures the VM's own writes (the guest's layer_size), formats an empty ext4 of
// that size on the host, lets the guest copy its upper dir into it through the VM's
// transfer disk (layer_capture), copies the disk's bytes into the new image's layer and
// freezes the image (image/derive.h). The host never mounts or parses the guest's ext4.
//
// Thread-safe: no state of its own beyond what it is given; one commit at a time per
// images root (the image lock), one transfer at a time per VM (its disk's lock).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/image_listing.h"
#include "daemon/requests.h"
#include "daemon/vm_launcher.h"
#include "daemon/vm_registry.h"
#include "image/image.h"
#include "util/paths.h"
#include "vmm/template.h"

namespace trybox::daemon {

// A failure with its name (the error reply's `kind`): image_exists, vm_not_running,
// no_space, too_deep, capture_failed, image_in_use, image_has_derived; "" for the others.
struct ImageError {
  Status status;
  std::string kind;
};

struct CommittedImage {
  image::Manifest manifest;
  std::string manifest_sha256;
  uint64_t layer_bytes = 0;  // on disk
  bool replaced = false;
};

struct RemovedImage {
  std::string name;
  uint64_t bytes = 0;  // freed: its own parts
  std::vector<std::string> templates;
};

struct Freed {
  // "template", "rootfs_cache", "build_leftover" (a killed build's or commit's
  // `.build-NAME-PID`, `.old-NAME-PID` or cache/tmp directory, its process gone) or
  // "unchecked_image" (a recipe build's staged image whose checks never passed).
  std::string what;
  std::string path;
  uint64_t bytes = 0;
};

struct PruneOptions {
  bool dry_run = false;  // only say what would go
  // Also the cached root filesystems (CACHE/rootfs/*.ext4): the next base build then
  // takes the long path again (14 minutes here). Otherwise they are listed as kept.
  bool rootfs_cache = false;
};

struct Pruned {
  std::vector<Freed> freed;  // removed (or, in a dry run, would be)
  std::vector<Freed> kept;   // the rootfs cache when not asked for
};

class ImageService {
 public:
  ImageService(const Paths& paths, VmRegistry& registry, vmm::TemplateStore& templates);

  Result<CommittedImage> Commit(const CommitRequest& req, const Progress& progress,
                                ImageError* error);
  Result<std::vector<ImageView>> List();
  Result<RemovedImage> Remove(const std::string& name, ImageError* error);
  // Removes the image's templates, whatever their state (a broken one included): the
  // directory names removed. The image itself stays; the next create builds a template.
  std::vector<std::string> RemoveTemplates(const std::string& name);
  Result<Pruned> Prune(const PruneOptions& opts);
  // Leftovers of builds and commits whose process is gone (at start and in Prune).
  std::vector<Freed> RemoveBuildLeftovers(bool dry_run);

 private:
  // Running VMs per image name.
  std::map<std::string, int> InUse() const;
  // Templates under the template root: (directory name, shape it was built for).
  std::vector<std::pair<std::string, vmm::TemplateShape>> Templates() const;

  const std::string images_root_;
  const std::string templates_root_;
  const std::string cache_root_;
  VmRegistry& registry_;
  vmm::TemplateStore& templates_;
};

}  // namespace trybox::daemon
