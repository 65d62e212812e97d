// The "put" and "get" requests: files and directory trees into and out of the guest.
// Protocol: docs/protocol/guest.md. Directory trees travel as tar streams made and read by
// the rootfs's own GNU tar (/bin/tar), never by hand-written tar code.
#pragma once

#include <nlohmann/json.hpp>

#include "channel/mux.h"
#include "guest/reaper.h"
#include "guest/transfer_disk.h"

namespace trybox::guest {

// Serves one put on `stream`: reads DATA on channel 0 until EOF, then ENDs. On any error
// the rest of the upload is still consumed (so the host is never left blocked on credit)
// before the error END, and no partial file is left behind. With "disk" the content is read
// from `disk` instead (after the channel's EOF); a guest without one answers
// no_transfer_disk, a busy one disk_busy, before touching anything.
void ServePut(Reaper& reaper, channel::Stream& stream, const nlohmann::json& request,
              TransferDisk* disk = nullptr);

// Serves one get on `stream`: EVENT meta, DATA on channel 1, EOF, END. A failure part-way
// ENDs with ok:false, never with a truncated success. With "disk" the content is written to
// `disk` instead and the END's "bytes" says how much it holds; more than "max_bytes" is
// disk_full.
void ServeGet(Reaper& reaper, channel::Stream& stream, const nlohmann::json& request,
              TransferDisk* disk = nullptr);

}  // namespace trybox::guest
