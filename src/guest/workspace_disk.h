// The workspace disk as trybox-init serves it (docs/protocol/guest.md, "The workspace
// disk"): the host builds an ext4 file system holding the project, the guest mounts it at
// /workspace for the VM's life, and freezes it while the host reads it back.
//
// {"op":"workspace_mount","disk":{"bytes":S}}: waits for the announced capacity, drops the
// guest's cache of the disk, mounts it at /workspace (made if missing) and removes the empty
// lost+found: {"ok":true}, or a failure (bad_request, no_workspace_disk, already_mounted, io).
//
// {"op":"workspace_freeze"}: flushes and freezes the file system at /workspace (FIFREEZE),
// sends EVENT {"type":"frozen"}, and keeps it frozen until the host's EOF, END or RESET on
// the stream, the channel's loss, or kMaxFrozen, whichever comes first; then thaws it and
// ENDs {"ok":true,"frozen_ms":T}. The thaw is tied to the stream, so a host that dies while
// reading never leaves the guest's writers blocked. Failures: no_workspace_disk,
// not_mounted, io.
//
// Handlers run on the server's request threads; the disk object is shared and locked for
// each request (one at a time).
#pragma once

#include <chrono>

#include "channel/mux.h"
#include "guest/transfer_disk.h"

namespace trybox::guest {

inline constexpr const char* kWorkspaceMountPoint = "/workspace";
// The longest a host may keep /workspace frozen before the guest thaws it on its own.
inline constexpr std::chrono::minutes kMaxFrozen{10};

void ServeWorkspaceMount(channel::Stream& stream, const nlohmann::json& request,
                         TransferDisk* disk);
void ServeWorkspaceFreeze(channel::Stream& stream, TransferDisk* disk);

}  // namespace trybox::guest
