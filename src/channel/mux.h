// Mux: many independent streams over one byte connection (a virtio-serial port in the
// guest, a unix socket on the host). Wire format: docs/protocol/channel.md.
//
// Ownership and threads:
//  - A Mux owns its fd and one reader thread that decodes frames and routes them to streams.
//  - Writes from any thread are serialised on one lock, a whole frame at a time, so frames
//    never interleave. DATA frames are at most kMaxDataChunk bytes, which keeps streams fair.
//  - Each stream has a per-direction credit window: a writer blocks once it has sent
//    kInitialWindow bytes the reader has not consumed. A slow consumer stalls only its own
//    stream, never the connection.
//  - Streams are shared_ptrs: the Mux holds only weak references. Dropping a stream that has
//    not finished resets it on the wire.
//  - When the connection dies (EOF, read error, malformed frame) every stream's Next()
//    returns kUnavailable naming the reason, and every blocked Write() fails. Nothing is
//    reported as success after that.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "channel/frame.h"
#include "util/fd.h"
#include "util/mutex.h"
#include "util/status.h"
#include "util/thread_annotations.h"

namespace trybox::channel {

using Json = nlohmann::json;

// Initial credit per stream per direction.
inline constexpr uint32_t kInitialWindow = 4u << 20;

class MuxCore;

class Stream {
 public:
  struct Message {
    enum class Kind { kData, kEof, kEvent, kEnd, kReset };
    Kind kind = Kind::kData;
    uint8_t channel = 0;
    std::string data;  // kData
    Json body;         // kEvent, kEnd, kReset
  };
  using Deadline = std::optional<std::chrono::steady_clock::time_point>;

  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  uint32_t id() const { return id_; }

  // JSON senders (Open, SendEvent, End, Mux::SendControl) refuse a body that cannot be encoded
  // (a string that is not UTF-8) or that encodes to more than kMaxPayload bytes; End then
  // resets the stream with the reason, so that the peer is never left waiting.

  // Sends bytes on `channel`, blocking while the peer's window is full.
  Status Write(uint8_t channel, std::string_view data);
  // Write for `len` bytes that the pipe `pipe` already holds, moved to the connection with
  // splice(2) instead of being copied through this process (under emulation each copy is a
  // large part of what a byte costs). Only the caller may read `pipe`, and it must hold
  // `len` bytes (FIONREAD): a pipe that holds fewer loses the connection.
  Status WriteFromPipe(uint8_t channel, int pipe, size_t len);
  Status CloseWrite(uint8_t channel);
  Status SendEvent(const Json& body);
  // Sends the final result. After End the stream accepts no more writes.
  Status End(const Json& body);
  // Aborts the stream in both directions.
  Status Reset(const std::string& reason);

  // Next message from the peer. kUnavailable once the connection is gone; kFailedPrecondition
  // after the stream has ended, or once this side reset it (which wakes a Next() blocked on
  // another thread); kCancelled once Interrupt() was called and nothing is queued;
  // kDeadlineExceeded if `deadline` passes first.
  Result<Message> Next(Deadline deadline = std::nullopt);

  // Wakes a Next() blocked on another thread, and every later one, with kCancelled (after
  // what is already queued). The stream itself is untouched: it can still be written, ended
  // or reset. For a reader that must stop when other work finishes, without a polling tick.
  void Interrupt();

  // True once an END or RESET was received or sent.
  bool finished() const;

  // From now on a Write that waits longer than `limit` for the peer's window fails with
  // kDeadlineExceeded (the stream is left as it is: the caller resets it). A deadline on
  // progress, not on the whole transfer: each wait for credit gets the full limit. For
  // writes the peer must always take (a file being put), not for a command's stdin.
  void SetWriteStallLimit(std::chrono::milliseconds limit);

  // How many times Next() has gone to sleep waiting for a message: a reader woken by a
  // timer rather than by an event shows up here (tests assert there is no such timer).
  uint64_t wakeups() const;

 private:
  friend class MuxCore;
  Stream(std::shared_ptr<MuxCore> core, uint32_t id) : core_(std::move(core)), id_(id) {}
  // Blocks until the peer's window has room; takes and returns up to `want` bytes of it
  // (at most kMaxDataChunk).
  Result<size_t> TakeCredit(size_t want) EXCLUDES(mu_);

  std::shared_ptr<MuxCore> core_;
  const uint32_t id_;

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Message> inbox_ GUARDED_BY(mu_);
  uint64_t send_credit_ GUARDED_BY(mu_) = kInitialWindow;
  uint64_t recv_window_ GUARDED_BY(mu_) = kInitialWindow;  // bytes the peer may still send
  uint64_t consumed_unacked_ GUARDED_BY(mu_) = 0;
  bool remote_done_ GUARDED_BY(mu_) = false;  // END/RESET received
  bool local_done_ GUARDED_BY(mu_) = false;   // END/RESET sent
  bool end_delivered_ GUARDED_BY(mu_) = false;
  bool reset_here_ GUARDED_BY(mu_) = false;  // this side sent RESET
  bool interrupted_ GUARDED_BY(mu_) = false;
  std::optional<std::chrono::milliseconds> write_stall_limit_ GUARDED_BY(mu_);
  uint64_t wakeups_ GUARDED_BY(mu_) = 0;
  std::string conn_error_ GUARDED_BY(mu_);  // non-empty once the connection died
};

// `body` as a frame payload, or why it cannot be one (not UTF-8, over kMaxPayload).
Result<std::string> EncodeJsonPayload(const Json& body);

enum class Role { kHost, kGuest };  // host opens odd stream ids, guest even ones

// Where a Mux's frames go. By default its own fd; the guest writes them to its virtio port
// instead (guest/port.h), which needs writes that give up when the host leaves. Called
// with the Mux's write lock held, one frame at a time; after an error the Mux calls it no
// more.
class FrameWriter {
 public:
  virtual ~FrameWriter() = default;
  // Writes all of `iov` (it may change the entries).
  virtual Status Write(struct iovec* iov, int count) = 0;
  // Moves the next `len` bytes of the pipe `pipe`, which holds at least that many, without
  // copying them through this process where it can (splice(2)).
  virtual Status Splice(int pipe, size_t len) = 0;
};

// Moves `*iov` and `*count` past `done` bytes written (a FrameWriter's partial writes).
void AdvanceIov(struct iovec** iov, int* count, size_t done);
// A FrameWriter's Splice where splicing does not work: reads the `len` bytes and writes them.
Status CopyFromPipe(FrameWriter& writer, int pipe, size_t len);

class Mux {
 public:
  // Called on a fresh thread for each OPEN from the peer. The handler owns the stream and
  // must End or Reset it. If it throws, the stream is reset with the exception's text.
  using OpenHandler = std::function<void(std::shared_ptr<Stream>, Json request)>;
  // Called on the reader thread for each EVENT on stream 0 (connection-level messages). A
  // stream-0 event that is not a JSON object, or one the handler throws on, ends the
  // connection with a reason naming it (stream 0 has no stream of its own to reset).
  using ControlHandler = std::function<void(const Json& event)>;
  // Called once, on the reader thread, when the connection dies.
  using DeathHandler = std::function<void(const std::string& reason)>;

  // Frames are read from `fd`, and written to it unless a `writer` is given.
  Mux(UniqueFd fd, Role role, std::unique_ptr<FrameWriter> writer = nullptr);
  ~Mux();
  Mux(const Mux&) = delete;
  Mux& operator=(const Mux&) = delete;

  void OnOpen(OpenHandler h);
  void OnControl(ControlHandler h);
  void OnDeath(DeathHandler h);
  // Starts the reader thread. Set handlers first.
  void Start();

  Result<std::shared_ptr<Stream>> Open(const Json& request);
  Status SendControl(const Json& event);

  bool alive() const;
  // Why the connection died ("" while alive).
  std::string death_reason() const;
  // Stops reading, fails all streams, and joins the reader. Idempotent.
  void Shutdown();

 private:
  std::shared_ptr<MuxCore> core_;
  std::thread reader_;
};

}  // namespace trybox::channel
