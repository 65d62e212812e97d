// The boot half of an image: the uncompressed kernel, the module load order and the
// initramfs. Pure functions over bytes and text (libarchive does the compression formats);
// BuildImage feeds them files from the Debian kernel package. Thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace trybox::image {

// Decompresses one stream in any format libarchive reads (xz, zstd, gzip, ...) into `out`.
// Bytes after the stream are an error, and then the tail of `out` is missing.
Status Decompress(std::string_view data, std::string* out);

// The vmlinux ELF embedded XZ-compressed in an x86 bzImage (CONFIG_KERNEL_XZ). QEMU's
// microvm boots that ELF directly through its PVH note, skipping the decompressor.
Result<std::string> ExtractVmlinux(std::string_view bzimage);

// FailedPrecondition unless `data` is an ELF executable without a PT_INTERP (the initramfs
// has no dynamic loader). `what` names it in the error.
Status CheckStaticElf(std::string_view data, const std::string& what);

// The load order for `wanted_names` and everything they depend on, from the text of
// modules.dep ("kernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko ..."). Dependencies come
// before their users and each module appears once. Names match the file's basename without
// ".ko*", with '-' and '_' equivalent. Returns the paths as modules.dep writes them. A
// wanted module that is not listed is kNotFound naming it; a cycle is kInvalidArgument.
Result<std::vector<std::string>> ModuleLoadOrder(const std::string& modules_dep_text,
                                                 const std::vector<std::string>& wanted_names);

// "kernel/fs/ext4/ext4.ko.xz" -> "kernel/fs/ext4/ext4.ko": where a module is stored
// (decompressed) in the initramfs.
std::string StoredModulePath(const std::string& module_path);

struct InitramfsSpec {
  std::string kernel_version;
  std::string init;  // the /init binary
  // (path relative to lib/modules/KERNEL_VERSION/, plain .ko contents), in load order.
  std::vector<std::pair<std::string, std::string>> modules;
};

// Writes an uncompressed newc cpio: the base directories, /dev/console and /dev/null,
// /init, the modules, /etc/trybox/modules.load and /etc/trybox/kernel_version (layout in
// docs/images.md). Owner root, mtime 0, so equal inputs give equal bytes.
Status WriteInitramfs(const InitramfsSpec& spec, const std::string& path);

}  // namespace trybox::image
