// ExecLogs: every exec's stdout and stderr, kept by the daemon as they arrive, so that
// `trybox logs` can print them again, follow a live exec, or resume from an offset. File
// format and rules: docs/store.md, "Exec logs".
//
// Each stream of each exec is one file, $STATE/execs/<vm>/<exec>.out (.err), capped: the
// first `head` bytes and the last `tail` bytes are kept, whatever the command printed in
// between is dropped, and a reader is told exactly which range was dropped. Offsets are
// positions in the whole output as the command produced it, so they never shift when the
// cap cuts: an offset a reader got to stays valid to resume from.
//
// Ownership and threads: ExecLogs owns the directory and the map of live logs (its lock);
// each ExecLog owns its files, its byte counts and its own lock and condition variable, on
// which followers wait. One writer per log (the thread running the exec), any number of
// readers. A log stays readable after its exec ended and until its VM's record is pruned,
// or until its VM's logs together pass the per-VM cap: then the logs of its oldest finished
// execs are trimmed first, each leaving a marker (<exec>.trimmed) a reader gets as the reason.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/guest_ops.h"
#include "util/fd.h"
#include "util/mutex.h"
#include "util/status.h"

namespace trybox::daemon {

// The default cap per stream: 4 MiB of head and 4 MiB of tail.
inline constexpr int64_t kDefaultExecLogCap = 8 << 20;
// The default cap on one VM's exec logs together (20 execs printing a lot made 77 MB).
inline constexpr int64_t kDefaultExecLogVmCap = int64_t{64} << 20;

class ExecLog : public OutputSink {
 public:
  enum Channel { kStdout = 0, kStderr = 1 };

  // What one Read found at `offset`.
  struct Slice {
    // The bytes from `offset` (at most the asked size); empty at the end of what exists so
    // far, or when `offset` fell in a dropped range.
    std::string data;
    // Set when `offset` fell in a dropped range: the first kept offset after it. Nothing is
    // read; the reader resumes there.
    int64_t skipped_to = -1;
    int64_t total = 0;      // bytes the command has produced on this stream so far
    bool finished = false;  // the exec has ended: `total` is final
  };

  // Appends to stdout (channel::kChanOut) or stderr (channel::kChanErr). OutputSink.
  void Append(uint8_t channel, std::string_view data) override EXCLUDES(mu_);
  // The exec has ended: wakes followers; no more Append.
  void Finish() EXCLUDES(mu_);

  // Reads up to `max` bytes at `offset`. kInvalidArgument if `offset` is past what exists;
  // kFailedPrecondition if the output could not be kept (its reason).
  Result<Slice> Read(Channel ch, int64_t offset, size_t max) EXCLUDES(mu_);
  // Blocks until the stream has bytes past `offset`, the exec has ended, or `*stop` is set
  // and Wake() called.
  void Wait(Channel ch, int64_t offset, const std::atomic<bool>* stop) EXCLUDES(mu_);
  // Blocks until stdout has bytes past `out_offset` or stderr past `err_offset`, or the exec
  // has ended.
  // `stop`: as Wait's, set (then Wake) by another thread to give up.
  void WaitAny(int64_t out_offset, int64_t err_offset, const std::atomic<bool>* stop = nullptr)
      EXCLUDES(mu_);
  // The same, but returns false if `deadline` passes first.
  bool WaitAnyUntil(int64_t out_offset, int64_t err_offset,
                    std::chrono::steady_clock::time_point deadline) EXCLUDES(mu_);
  // Wakes every Wait, so that one whose `stop` was set returns.
  void Wake() EXCLUDES(mu_);

  // Bytes produced so far on each stream.
  int64_t total(Channel ch) const EXCLUDES(mu_);
  bool finished() const EXCLUDES(mu_);

 private:
  friend class ExecLogs;
  struct File {
    UniqueFd fd;  // invalid: not kept (cap 0), or broken (error says why)
    int64_t total = 0;
    int64_t head = 0;  // bytes of the output's start kept
    int64_t tail = 0;  // size of the ring holding its end
    std::string error;
  };
  // Writes `data` at the logical offset file.total.
  void Write(File& f, std::string_view data) REQUIRES(mu_);

  mutable Mutex mu_;
  CondVar cv_;
  std::string vm_;  // set once by ExecLogs::Start
  File files_[2] GUARDED_BY(mu_);
  bool finished_ GUARDED_BY(mu_) = false;
};

class ExecLogs {
 public:
  // `dir` holds one directory per VM. `cap_bytes` per stream, split in halves between head
  // and tail; 0 keeps nothing (Read then says so). `vm_cap_bytes`: the most one VM's logs
  // take on disk together before its oldest finished execs' logs are trimmed (0: no cap).
  ExecLogs(std::string dir, int64_t cap_bytes, int64_t vm_cap_bytes = 0)
      : dir_(std::move(dir)), cap_(cap_bytes), vm_cap_(vm_cap_bytes) {}

  // The log of a new exec, live until Finish(exec_id). A file that cannot be created makes a
  // log that counts bytes and says why it kept none: the exec runs anyway.
  std::shared_ptr<ExecLog> Start(const std::string& vm, int64_t exec_id) EXCLUDES(mu_);
  // Marks it ended and forgets it as live (readers then open its files).
  void Finish(int64_t exec_id) EXCLUDES(mu_);
  // The live log of `exec_id`, or its files once it ended. kNotFound if it has none.
  Result<std::shared_ptr<ExecLog>> Open(const std::string& vm, int64_t exec_id) EXCLUDES(mu_);
  // Deletes a VM's logs (its record was pruned).
  Status RemoveVm(const std::string& vm);
  // Bytes a VM's exec logs take on disk (allocated blocks), for the disk budget.
  int64_t VmBytes(const std::string& vm) const;
  // While the VM's logs pass the per-VM cap, trims the oldest finished exec's (both
  // streams), leaving its marker. Called at each exec's start and end. Returns the execs
  // trimmed.
  std::vector<int64_t> TrimVm(const std::string& vm) EXCLUDES(mu_, trim_mu_);

  int64_t cap() const { return cap_; }
  int64_t vm_cap() const { return vm_cap_; }

 private:
  std::string PathOf(const std::string& vm, int64_t exec_id, ExecLog::Channel ch) const;

  const std::string dir_;
  const int64_t cap_;
  const int64_t vm_cap_;
  Mutex trim_mu_;  // one TrimVm at a time
  Mutex mu_;
  std::map<int64_t, std::shared_ptr<ExecLog>> live_ GUARDED_BY(mu_);
};

}  // namespace trybox::daemon
