// GuestOps: every conversation the daemon has with a guest agent, written once
// (docs/protocol/guest.md): an exec relayed to a client or captured, a file or a tree sent,
// a file or a tree received, a put or get relayed for a client.
//
// Nothing a guest sends is trusted. Every END and EVENT body is read through a typed parser;
// a malformed one resets its stream (which stops the guest's work on it) and becomes an
// error of its own name ("bad_guest_reply"), never a result borrowed from success, and never
// an exception. A lost channel, a guest reset, a cancelled client and a timeout stay four
// different outcomes.
//
// GuestChannel is the seam: the daemon passes a running VM (vm_service.h), unit tests a Mux
// over a socketpair served by trybox-init's own request handlers. Functions here keep no
// state and may run on many threads at once.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "channel/mux.h"
#include "daemon/requests.h"
#include "daemon/wire.h"
#include "util/status.h"

namespace trybox::daemon {

// A guest's transfer disk as the host holds it (docs/protocol/guest.md, "Bulk data through a
// disk"): a file the guest sees as a disk of the capacity last announced. The host uses the
// descriptor it created the file with, never its path: the VM's directory belongs to
// QEMU's uid, which could put a symlink there.
class TransferDiskPort {
 public:
  virtual ~TransferDiskPort() = default;
  virtual int fd_for_io() const = 0;
  // The guest sees `bytes` of capacity from now on; the file is cut or extended to it.
  virtual Status Announce(uint64_t bytes) = 0;
  // Exclusive use for one transfer; an empty lock while another one still runs after a
  // short wait.
  virtual std::unique_lock<std::timed_mutex> TryLock() = 0;
};

// A guest's workspace disk as the host holds it (docs/protocol/guest.md, "The workspace
// disk"): a file the guest sees as a disk of the capacity last announced, written by the
// host once (the workspace's ext4) and then by the guest. Used through the descriptor the
// host created it with, as the transfer disk is.
class WorkspaceDiskPort {
 public:
  virtual ~WorkspaceDiskPort() = default;
  virtual int fd_for_io() const = 0;
  // The guest sees `bytes` of capacity from now on; the file is cut or extended to it.
  virtual Status Announce(uint64_t bytes) = 0;
  // The uid a reader of what the guest wrote runs as (the VM's own, under a root daemon).
  virtual std::optional<uid_t> reader_uid() const = 0;
};

class GuestChannel {
 public:
  virtual ~GuestChannel() = default;
  // A request stream to the guest agent; kUnavailable once the guest is gone.
  virtual Result<std::shared_ptr<channel::Stream>> Open(const Json& request) = 0;
  virtual bool alive() const = 0;
  // Why the guest is gone ("" while alive): QEMU's exit or the channel's loss.
  virtual std::string death_reason() const = 0;
  // Its transfer disk, or null: bulk bytes then take the channel.
  virtual TransferDiskPort* transfer_disk() { return nullptr; }
  // Its workspace disk, or null: a workspace then goes in and out as a tar.
  virtual WorkspaceDiskPort* workspace_disk() { return nullptr; }
  // True while the host's heartbeat finds the guest not answering (docs/reliability.md).
  // Streams waiting on such a guest are Interrupt()ed; they then end as guest_unresponsive.
  virtual bool unresponsive() const { return false; }
  // Why the host's own file system under the VM cannot take more ("" while it can): a
  // transfer that fails then is named no_space, whatever the guest saw (an I/O error).
  virtual std::string host_no_space() const { return ""; }
  // Why the VM is damaged by the host's disk ("" if it is not): some of its writes failed on
  // the host, and its guest's file systems may stay broken after the space came back.
  virtual std::string host_disk_damage() const { return ""; }
};

// The reason of a RESET body ("no reason given" if it has none).
std::string ResetReason(const Json& body);
// kUnavailable("the guest aborted the request: REASON").
Status GuestAborted(const Json& body);

// `fallback`, or kUnavailable("the guest is gone: WHY") when the guest has died: the reason
// a transfer failed is then the guest's death, not the broken stream it caused; or
// kUnavailable("the guest stopped answering ...") when the heartbeat gave up on it.
Status GuestGone(const GuestChannel& guest, const Status& fallback);

// A failed transfer's error reply: `st` with the guest's `kind`, or, when the host's file
// system under the VM is full, kResourceExhausted with kind "no_space" naming it.
Json TransferErrorReply(const GuestChannel& guest, const Status& st, const std::string& kind);

// ---- exec ----

enum class ExecOutcome {
  kExited,
  kSignaled,
  kTimedOut,
  kError,
  kChannelLost,
  kCancelled,
  kGuestUnresponsive,  // the guest stopped answering: the host's deadline or heartbeat ended it
  kNotStarted,         // the guest was gone before it reported the command started
};
const char* ExecOutcomeName(ExecOutcome o);  // "exited", ... as on the wire

struct ExecResult {
  ExecOutcome outcome = ExecOutcome::kError;
  std::optional<int> exit_code;        // kExited
  std::optional<int> signal;           // kSignaled
  std::optional<int64_t> timeout_ms;   // kTimedOut
  std::optional<int64_t> duration_ms;  // as the guest measured it
  std::string error;                   // kError: not_found, not_executable, bad_cwd, ...
  std::string message;
  int64_t stdout_bytes = 0;
  int64_t stderr_bytes = 0;

  bool Succeeded() const { return outcome == ExecOutcome::kExited && exit_code == 0; }
  // The `result` object of docs/protocol/daemon.md.
  Json ToJson() const;
};

// The guest's exec END, type-checked. A body with a missing or ill-typed field gives an
// kError result with error "bad_guest_reply" naming the field.
ExecResult ExecResultFromGuest(const Json& end);

// The guest's EVENTs, type-checked: an exec's {"type":"started","pid":N} (unknown types
// give nullopt: a newer guest), a get's {"type":"meta",...} (other types give null). The
// result holds only the known fields; a malformed one is kInvalidArgument naming the field.
Result<std::optional<Json>> GuestExecEvent(const Json& body);
Result<Json> GuestMetaEvent(const Json& body);

// The host's own deadline for an exec with a timeout: the guest's timeout plus this grace,
// for the guest to kill the command and send its END (docs/reliability.md). Past it the exec
// ends as guest_unresponsive.
inline constexpr int64_t kHostGraceMs = 5000;

struct ExecSpec {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string cwd = "/root";  // "": the account's home, as the guest resolves it
  int64_t timeout_ms = 0;     // 0: none
  bool stdin = false;         // the client's channel 0 becomes the command's stdin
  std::string user;           // "" = root
  bool privileged = false;
  // On a pseudo-terminal of this size: stdout and stderr arrive merged on channel 1, the
  // client's channel 0 is the terminal's input and its resize EVENTs are relayed.
  std::optional<TermSize> tty;
  // With a timeout: how long past it the host waits for the guest's END (never sent).
  int64_t host_grace_ms = kHostGraceMs;
};

// Where an exec's output is kept as it arrives (the daemon's ExecLogs). Called on the
// thread running the exec, in the order the guest sent the bytes.
class OutputSink {
 public:
  virtual ~OutputSink() = default;
  // `channel`: channel::kChanOut or channel::kChanErr.
  virtual void Append(uint8_t channel, std::string_view data) = 0;
};

// The one place the guest's exec request is built.
Json GuestExecRequest(const ExecSpec& spec);

// Where an exec's output goes, and where its input and its cancellation come from.
struct ExecIo {
  // Output is forwarded here as produced; the stream is watched for the whole exec (a
  // reset or a lost connection cancels the command: its tree is killed); with spec.stdin
  // its channel 0 is the input. Interrupt()ed when the exec ends.
  channel::Stream* client = nullptr;
  // Output (stdout and stderr, interleaved) kept here, capped to its last kCaptureBytes.
  std::string* capture = nullptr;
  // Output is also appended here as it arrives (VmService::Exec: beside the exec's log).
  OutputSink* sink = nullptr;
  // Called with the guest stream once the exec is open: resetting it cancels the command
  // from another thread (a run being stopped); set `cancelled` first, so that the outcome
  // says `cancelled` rather than a lost channel. An EVENT on it signals the command.
  std::function<void(std::shared_ptr<channel::Stream>)> on_open;
  const std::atomic<bool>* cancelled = nullptr;
  // Called once the guest reported the command started (its "started" EVENT).
  std::function<void()> on_started;
};

inline constexpr size_t kCaptureBytes = 256 * 1024;

// Runs one exec to its end. Never blocks on a polling timer: it returns as soon as the
// guest's END, the guest's loss, the client's cancellation, the heartbeat's verdict that the
// guest is unresponsive (an Interrupt() of the stream), or the host's deadline (an exec with
// a timeout: timeout_ms + host_grace_ms) is seen.
ExecResult RunExec(GuestChannel& guest, const ExecSpec& spec, const ExecIo& io);

// ---- files ----

// A guest file END ({"ok":true,"bytes":N} or {"ok":false,"error":KIND,"message":TEXT}) as
// a Status; *kind receives the guest's error name. A malformed END is kInternal naming it.
Status FileEndStatus(const Json& end, std::string* kind = nullptr, int64_t* bytes = nullptr);

// Waits for the stream's END, dropping data. kUnavailable if the guest reset the stream.
Result<Json> AwaitEnd(channel::Stream& s);

// ---- control requests (an op with no data, answered by an END) ----

// Why an END does not say {"ok": true}: "the guest could not WHAT: ERROR[: MESSAGE]", as
// kResourceExhausted for the guest's "no_space" and kFailedPrecondition otherwise. Never Ok:
// the caller has seen that the END was not ok, or an END came where none should.
Status GuestRefusal(const Json& end, const std::string& what);

// `st` with the host's disk named as the cause when it is an I/O error, a read-only or a
// full file system in the guest and the host's disk is full now (host_no_space) or damaged
// the VM before (host_disk_damage): "... Input/output error (the host's disk caused it: ...)".
Status WithHostDiskCause(const GuestChannel& guest, const Status& st);

// Waits for `stream`'s END: its body when it says ok, GuestRefusal (WithHostDiskCause) when it does
// not, and GuestGone (the guest's death, else the broken stream, annotated with WHAT) when the
// stream ends without one.
Result<Json> AwaitGuestOk(GuestChannel& guest, channel::Stream& stream, const std::string& what);

// `request` sent, no data, and its END awaited as AwaitGuestOk does.
Result<Json> GuestCall(GuestChannel& guest, const Json& request, const std::string& what);

// Writes `data` to `path` as one file.
Status WriteFile(GuestChannel& guest, const std::string& path, std::string_view data, int mode,
                 bool mkdirs);

struct FileRead {
  std::string data;        // at most max_bytes
  bool truncated = false;  // the file is longer
  int64_t size = -1;       // as the guest reported it
};
// Reads up to `max_bytes` of a regular file. A directory or other non-file is
// kFailedPrecondition naming what it is.
Result<FileRead> ReadFile(GuestChannel& guest, const std::string& path, int64_t max_bytes);

// Produces content chunk by chunk into the function it is given.
using ContentWriter = std::function<Status(const std::function<Status(std::string_view)>&)>;

// Bulk transfers use the guest's transfer disk when it has one (the channel then carries
// only the request and its END) and the channel otherwise, or when the disk cannot be used
// for this transfer (busy, too small, refused before anything was done).

// Sends a tar to `path` (a directory, created): `write_tar` produces it chunk by chunk.
// *via_disk (if given) says whether it went through the transfer disk.
Status PutTar(GuestChannel& guest, const std::string& path, const ContentWriter& write_tar,
              bool* via_disk = nullptr);

class DiskContent;

// Pulls `path` (a directory) as a tar. `excludes` are GNU tar patterns applied in the guest.
// Through the disk the tar may take at most `max_disk_bytes` (past that the channel, which
// has no limit, carries it). The chunks come through `next()` of the returned reader; after
// it returns "" (the end), Finish() gives the guest's END: its warnings, or why the
// transfer failed.
class TarReader {
 public:
  static Result<std::unique_ptr<TarReader>> Open(GuestChannel& guest, const std::string& path,
                                                 const std::vector<std::string>& excludes,
                                                 uint64_t max_disk_bytes = kMaxDiskTransfer);
  ~TarReader();
  // The next chunk of the tar; "" at its end.
  Result<std::string> Next();
  // After Next() returned "": the guest's END warnings (tar's own complaints), or the error.
  Result<std::string> Finish();
  // Stops the transfer (the guest stops producing it).
  void Abort(const std::string& why);
  // True if the tar came through the transfer disk.
  bool via_disk() const { return disk_ != nullptr; }

  // The most a transfer through the disk may hold unless the caller says otherwise.
  static constexpr uint64_t kMaxDiskTransfer = uint64_t{8} << 30;

 private:
  TarReader(GuestChannel& guest, std::shared_ptr<channel::Stream> s);
  TarReader(GuestChannel& guest, std::unique_ptr<DiskContent> disk);
  GuestChannel& guest_;
  std::shared_ptr<channel::Stream> s_;
  std::unique_ptr<DiskContent> disk_;
  bool eof_ = false;
  std::optional<Json> end_;
};

// ---- the put and get verbs ----

// Relays a client's upload (channel 0, then EOF) to `greq` (a guest put) and ends the client
// stream with the result in the daemon's error shape.
void RelayPut(GuestChannel& guest, const Json& greq, channel::Stream& client);
// Relays a guest get (meta EVENT, channel 1, EOF, END) to the client, then ends it.
void RelayGet(GuestChannel& guest, const Json& greq, channel::Stream& client);
// Reads and drops a client's upload until it ends, so that a refused put never leaves the
// client blocked on credit.
void DrainInput(channel::Stream& client);

// ---- the port verb ----

// One TCP connection of `trybox port`: relays the client's channel 0 to a guest `port`
// request for 127.0.0.1:`port` and the guest's channel 1 back, EOFs both ways, and ends the
// client stream with the guest's result in the daemon's shape ({"ok":true,"bytes_in",
// "bytes_out"}, or an error with the guest's `kind`: connect_failed, io).
void RelayPort(GuestChannel& guest, int port, channel::Stream& client);

}  // namespace trybox::daemon
