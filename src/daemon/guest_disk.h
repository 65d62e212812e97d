// Bulk data through a guest's transfer disk (docs/protocol/guest.md, "Bulk data through a
// disk"): the halves of a put or a get that guest_files.cc runs when the guest has one.
//
// A put: the host writes the content into the disk's file, announces its size, and sends
// the request with "disk": {"bytes": N} and an empty upload; the guest reads the disk. A
// get: the host announces room for `max_bytes`, sends "disk": {"max_bytes": L}; the guest
// writes the disk, flushes it, and its END says how many bytes it holds; the host reads
// them from the file. Either way the disk is emptied (capacity 0, file cut to 0) as soon as
// the transfer is over, so that between transfers a guest can neither read nor write it,
// and the host's disk holds at most one transfer per VM.
//
// Small content stays on the channel: the disk costs two QMP block_resize round trips
// (announce, then empty) that a small transfer does not win back. A put whose upload ends
// within kChannelMaxBytes, and a get the guest finds no larger than that, take the channel
// (a get asks for it with "channel_max_bytes" and is answered "too_large" otherwise, before
// any content; then it takes the disk).
//
// An empty answer (nullopt, null) means the disk could not be used for this transfer and
// nothing was done in the guest: the caller sends it through the channel instead.
// Internal to the daemon's guest operations; thread-safe as GuestOps is.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/guest_ops.h"
#include "util/fd.h"

namespace trybox::daemon {

// Content up to this many bytes goes through the channel even when the disk is there
// (docs/performance.md: where the disk's fixed cost is won back).
inline constexpr uint64_t kChannelMaxBytes = 4 << 20;

// What a get left on the transfer disk: its first bytes(), with the guest's events and END.
// The disk stays locked while this lives; dropping it empties the disk.
class DiskContent {
 public:
  DiskContent(TransferDiskPort& port, std::unique_lock<std::timed_mutex> lock, uint64_t bytes,
              std::vector<Json> events, Json end);
  ~DiskContent();
  DiskContent(const DiskContent&) = delete;
  DiskContent& operator=(const DiskContent&) = delete;

  // The next at most `max` bytes; "" once all bytes() were read.
  Result<std::string> Read(size_t max);
  uint64_t bytes() const { return bytes_; }
  const std::vector<Json>& events() const { return events_; }
  const Json& end() const { return end_; }

 private:
  TransferDiskPort& port_;
  std::unique_lock<std::timed_mutex> lock_;
  const uint64_t bytes_;
  uint64_t read_ = 0;
  const std::vector<Json> events_;
  const Json end_;
};

// The guest refused the disk before doing anything (it has none, it is busy, it was too
// small): the transfer may be retried through the channel.
bool DiskRefused(const Json& end);

// A put `greq` whose content `write` produces, through the disk: the guest's END (whatever
// it says), or nullopt when the disk could not be used (none, busy, refused, or the host's
// own disk could not take the content).
Result<std::optional<Json>> PutViaDisk(GuestChannel& guest, Json greq, const ContentWriter& write);

// A get `greq` onto the disk, with room for `max_bytes`. The guest's END may still be a
// failure (check DiskContent::end()). Null when the disk could not be used or was too small.
Result<std::unique_ptr<DiskContent>> GetViaDisk(GuestChannel& guest, Json greq, uint64_t max_bytes);

// ---- the put and get verbs (guest_files.cc's relays) ----

// What a put through the disk had taken from the client before it had to use the channel:
// the first `bytes` of `fd`, and whether the client's upload had ended.
struct Spooled {
  int fd = -1;
  uint64_t bytes = 0;
  std::string tail;  // taken from the client after those, not written to the file
  bool upload_ended = false;
};

// The put verb through the disk: `head` (what was taken from the client already: its
// `tail`, in memory, and whether the upload ended) and then the rest of the client's upload
// are written to the disk's file as they arrive, then the guest reads it. False when the disk
// cannot be used (nothing more was taken from the client, nothing sent to the guest);
// otherwise the client stream has been ended, through the channel if the disk failed
// part-way.
bool RelayPutViaDisk(GuestChannel& guest, const Json& greq, channel::Stream& client,
                     const Spooled& head);
// The put verb through the channel, after what `spooled` holds (may be null).
void RelayPutChannel(GuestChannel& guest, const Json& greq, channel::Stream& client,
                     const Spooled* spooled);
// The get verb through the disk; false when it cannot be used (nothing was sent to the
// client), otherwise the client stream has been ended.
bool RelayGetViaDisk(GuestChannel& guest, const Json& greq, channel::Stream& client);

// Shared with guest_files.cc: a relay's END in the daemon's shape (a get's meta EVENT is
// read by GuestMetaEvent, guest_ops.h). `via_disk`: the success reply says "via": "disk" (else
// "channel").
void FinishRelay(GuestChannel& guest, channel::Stream& client, const std::optional<Json>& end,
                 const Status& failure, bool via_disk = false);

}  // namespace trybox::daemon
