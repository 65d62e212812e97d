// Derived images (docs/images.md, "Derived images"): a new image made of an existing one
// (its parent) plus one read-only layer on top, frozen like a base build.
//
// A derived image is self-contained: its directory holds hard links to every part of its
// parent (the base's four parts and the parent's layers; a copy where the filesystem cannot
// link), its own layer-N.ext4, and a format-2 manifest naming the parent, the base and the
// chain. The parent can later be replaced without changing what its children boot.
//
// Ownership: the only writer of derived images; it holds the images_root lock (build.h)
// from its checks to the rename, so it never races a base build or another commit.
// Thread-safe (no state); one derive per images_root at a time (a second one fails).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "image/image.h"

namespace trybox::image {

struct DeriveOptions {
  std::string images_root;
  std::string parent;  // an existing image's name
  std::string name;    // the new image's
  bool replace = false;
  std::map<std::string, std::string> env;  // the commit's own; merged over the parent's
  std::string vm;
  nlohmann::json recipe;  // null or an object
  std::string recipe_sha256;
  std::vector<std::string> packages;  // appended to the parent's (those not listed yet)
  bool checks_pending = false;        // Manifest::checks_pending
  // Writes the new layer as a finished ext4 at `path` (which does not exist yet). Called
  // with the lock held, once the parent is verified and its parts are linked in.
  std::function<Status(const std::string& path)> write_layer;
};

// Named failures, as DeriveError() tells them apart.
inline constexpr const char* kImageExists = "image_exists";
inline constexpr const char* kTooDeep = "too_deep";

// Makes images_root/NAME. kAlreadyExists ("image_exists") if it exists and !replace;
// kFailedPrecondition ("too_deep") when the parent already has kMaxLayers layers; the
// parent's verification error; write_layer's error. On any failure nothing is listed: only
// a dot-directory is left, and that only if the process dies (the next build removes it).
Result<Manifest> DeriveImage(const DeriveOptions& opts);

// Bytes a file takes on disk (st_blocks), not its length: a layer is a sparse file.
uint64_t DiskBytes(const std::string& path);

}  // namespace trybox::image
