// The image list as `image_ls` gives it (docs/protocol/daemon.md): each image with its sizes,
// the images derived from it and its template's state. The daemon's verb and the CLI's
// listing without a daemon (`trybox image ls` never starts one) share it, so the CLI links
// this and not the daemon's services.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "image/image.h"
#include "util/status.h"

namespace trybox::daemon {

struct ImageView {
  image::ImageEntry entry;
  uint64_t own_bytes = 0;
  uint64_t total_bytes = 0;
  int in_use = 0;                    // running VMs of it
  std::vector<std::string> derived;  // images whose parent it is
};

// The images under `images_root` with their sizes and derived images; `in_use` gives the
// running VMs per image (empty where no daemon runs).
Result<std::vector<ImageView>> ListImageViews(const std::string& images_root,
                                              std::map<std::string, int> in_use);

// image_ls's `images` array (images whose checks are pending left out: image/image.h,
// Manifest::checks_pending): each image with its template's state as judged with the
// accelerator kept in state_dir/accel.json ("unknown" before any choice).
nlohmann::json ImageListJson(const std::vector<ImageView>& list, const std::string& state_dir);

}  // namespace trybox::daemon
