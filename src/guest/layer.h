// A commit's guest half (docs/protocol/guest.md, "Layers"): the VM's own writes (the
// overlay's upper dir) copied into an empty ext4 that the host formatted on the transfer
// disk, which becomes a derived image's read-only layer (docs/images.md).
//
// The host never parses what the guest wrote: it only hashes the disk's bytes and attaches
// them read-only to later VMs of that image. So whatever a guest does here (a hostile
// command racing the copy, a crafted filesystem) reaches only guests of the image it
// commits, never the host (docs/security.md).
//
// trybox-init copies with its full capabilities, which commands lack: overlayfs whiteouts
// (character devices 0:0), opaque-directory and other trusted.* xattrs, owners, modes,
// times and hard links are kept. One capture at a time (the transfer disk's lock).
#pragma once

#include <cstdint>
#include <string>

#include "channel/mux.h"
#include "guest/transfer_disk.h"
#include "util/status.h"

namespace trybox::guest {

struct TreeUsage {
  uint64_t bytes = 0;   // an upper bound of the data and directory blocks, 4 KiB each
  uint64_t inodes = 0;  // entries, the root included
};

// Walks the tree under `dir` (a path) without following symlinks.
Result<TreeUsage> MeasureTree(const std::string& dir);

struct CopyStats {
  uint64_t entries = 0;
  uint64_t bytes = 0;  // of regular files' contents
};

// Copies the tree under `from` into the existing, empty directory `to`: every entry with
// its type, owner, mode, times and xattrs, device numbers (whiteouts), symlink targets,
// and hard links as hard links. The root's own attributes are copied onto `to`. A full
// target is kResourceExhausted.
Result<CopyStats> CopyTree(const std::string& from, const std::string& to);

// {"op":"layer_size"}: {"ok":true,"bytes":B,"inodes":N} of the upper dir.
void ServeLayerSize(channel::Stream& stream, int upper_fd);
// {"op":"layer_capture","disk":{"bytes":S}}: mounts the transfer disk's ext4 (S bytes, made
// by the host), copies the upper dir into it, unmounts and flushes it:
// {"ok":true,"entries":N,"bytes":B}, or a failure ("no_space", "io", "disk_busy", ...).
void ServeLayerCapture(channel::Stream& stream, const nlohmann::json& request, int upper_fd,
                       TransferDisk* disk);

}  // namespace trybox::guest
