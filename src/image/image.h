// Frozen guest images: build them, check them, find them.
//
// An image is a directory images_root/NAME holding a kernel (vmlinux), an initramfs
// (initrd.cpio), a root filesystem (rootfs.ext4), an empty scratch filesystem
// (scratch.qcow2) and manifest.json, which records each part's size and SHA-256. Byte layout
// and rules: docs/images.md.
//
// Ownership: only BuildImage writes images. A finished image is frozen (files 0444, directory
// 0555) and is never modified in place; a rebuild swaps a whole new directory in. Builds in
// progress live in dot-directories that nothing else reads.
//
// Thread-safety: every function here may be called from any thread. VerifyImage shares one
// internally locked hash cache per process. BuildImage takes a lock file in images_root, so
// one build at a time runs per images_root (across processes too).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trybox::image {

inline constexpr int kManifestFormat = 1;
// A derived image: the parts of its base plus one read-only layer per image of its chain
// (docs/images.md, "Derived images").
inline constexpr int kDerivedManifestFormat = 2;
// The most layers over a base: each is a virtio-mmio disk (microvm has few slots) and an
// overlayfs lower dir.
inline constexpr int kMaxLayers = 16;

// The parts of every image, as named in the manifest's "files" object and on disk.
inline constexpr const char* kPartNames[] = {"vmlinux", "initrd.cpio", "rootfs.ext4",
                                             "scratch.qcow2"};

// The part holding the K-th layer over the base (1-based, oldest first): "layer-K.ext4".
std::string LayerPartName(int k);

// Which image a layer of a derived image was frozen for, and the part holding it.
struct LayerInfo {
  std::string image;  // the image committed with this layer on top
  std::string part;   // "layer-K.ext4"
  bool operator==(const LayerInfo&) const = default;
};

// An image a derived image was made from: its name and the SHA-256 of its manifest.json
// as it was at the time.
struct ImageRef {
  std::string name;
  std::string manifest_sha256;
  bool operator==(const ImageRef&) const = default;
};

struct PartInfo {
  std::string sha256;  // lowercase hex
  uint64_t size = 0;

  bool operator==(const PartInfo&) const = default;
};

struct Manifest {
  int format = kManifestFormat;
  std::string name;
  std::string created;                // ISO 8601 UTC, "2025-11-30T05:13:00Z"
  std::string suite;                  // "bookworm"
  std::string kernel_version;         // "6.1.0-57-amd64"
  std::string kernel_package;         // "linux-image-6.1.0-57-amd64=6.1.192-3"
  std::vector<std::string> packages;  // the rootfs --include list
  // Module files relative to lib/modules/KERNEL_VERSION/ inside the initramfs, in load order.
  std::vector<std::string> modules;
  std::string init_sha256;                // of the trybox-init binary at /init in the initramfs
  std::map<std::string, PartInfo> files;  // the kPartNames, plus each layer's part (format 2)

  // Format 2 only (empty in format 1).
  ImageRef base;                           // the chain's bottom (a format-1 image)
  ImageRef parent;                         // the image committed from
  std::vector<LayerInfo> layers;           // oldest first; the last is this image's own
  std::map<std::string, std::string> env;  // for every exec: the chain's, merged, child wins
  std::string vm;                          // the VM it was committed from
  nlohmann::json recipe;                   // null, or the recipe object as given
  std::string recipe_sha256;               // "" or 64 lowercase hex digits
  // Format 2: committed by a recipe build before its checks ran (a staged image). Such an
  // image boots (its checks run in it) but is never listed and never counts as built; the
  // image that passed them is committed again without it. Written only when true.
  bool checks_pending = false;

  bool operator==(const Manifest&) const = default;
};

// The env of an image derived from `parent` with `own` set by its commit: the parent's,
// with `own` replacing equal keys.
std::map<std::string, std::string> MergeEnv(const std::map<std::string, std::string>& parent,
                                            const std::map<std::string, std::string>& own);

// The creation time for a freshly built `fresh` when `installed` is already there: the
// installed one's when the two differ in nothing else (same parts, kernel, init, packages,
// chain), so that the manifest's bytes and SHA-256 do not change; else fresh.created.
std::string CreatedFor(const Manifest& fresh, const Manifest& installed);

// Pretty JSON, as written to manifest.json.
std::string ManifestToJson(const Manifest& manifest);
// Parses and checks manifest.json text: known format (1 or 2), all fields present with the
// right types, a valid image name, exactly the four parts (plus, in format 2, exactly one
// part per layer) with 64-hex-digit hashes, and in format 2 a consistent chain (layer K in
// part layer-K.ext4, the last layer this image's own, the parent the layer below's image
// or the base). Errors are kFailedPrecondition naming the field.
Result<Manifest> ParseManifest(std::string_view json);

// Reads image_dir/manifest.json. kNotFound if it is missing; kFailedPrecondition if it is
// malformed or names an image other than the directory's own name.
Result<Manifest> ReadManifest(const std::string& image_dir);

// Checks every part's size and SHA-256 against the manifest. A mismatch is
// kFailedPrecondition naming the image and the part; a missing part is kNotFound naming it.
// Hashes are remembered per process, keyed by each file's (path, st_dev, st_ino, size,
// mtime, ctime), so booting the same image again does not re-read a 400 MB rootfs; any
// change to those re-hashes.
Status VerifyImage(const std::string& image_dir);

struct ImageEntry {
  std::string name;
  std::string dir;
  bool valid = false;   // ReadManifest succeeded (no hashing: see VerifyImage)
  std::string problem;  // why not valid
  Manifest manifest;    // meaningful only if valid
};

// Images under images_root, sorted by name: every directory not starting with '.' that has
// a manifest.json. A missing images_root is an empty list.
Result<std::vector<ImageEntry>> ListImages(const std::string& images_root);

// images_root/NAME after ValidateName; kNotFound "image 'x' is not built (run: trybox image
// build x)" if it has no manifest.json.
Result<std::string> ImageDir(const std::string& images_root, const std::string& name);

struct BuildOptions {
  std::string name = "debian-12";
  std::string images_root;      // Paths::images
  std::string cache_dir;        // Paths::cache; kernel packages and rootfs images are kept here
  std::string init_binary;      // the static trybox-init, installed as /init
  bool rebuild_rootfs = false;  // ignore the cached rootfs for this recipe
  // Called once per step with a human line, "[2/6] rootfs: mmdebstrap bookworm (cached)".
  std::function<void(const std::string&)> progress;
  // Polled between steps; once it returns true the build stops, removes its partial
  // output and returns kCancelled-like FailedPrecondition("interrupted"). May be empty.
  std::function<bool()> cancelled;
};

// Builds (or rebuilds) images_root/NAME from the recipe NAME. Needs apt with the suite in
// the host's sources, mmdebstrap, dpkg-deb, depmod, mkfs.ext4 and qemu-img. Takes minutes
// when nothing is cached. On failure nothing but a dot-directory is left behind (removed by
// the next build; ignored by ListImages) and an existing image of that name is untouched.
Status BuildImage(const BuildOptions& opts);

// Names BuildImage accepts: "debian-12".
std::vector<std::string> KnownRecipes();

}  // namespace trybox::image
