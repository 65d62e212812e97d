// A workspace on the VM's workspace disk (docs/protocol/guest.md, "The workspace disk";
// docs/workspace.md): in, the daemon writes an ext4 file system of the manifest's entries
// into the disk's file and the guest mounts it at /workspace; out, the guest freezes it and
// a sandboxed trybox-ext4tar reads the guest-written file system into a tar, which goes
// through the same safe unpacking as any tar from a guest. Neither direction runs a
// process in the guest or moves the tree over the control channel.
//
// Internal to the daemon's workspace service; functions keep no state, a reader is used by
// one thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/guest_ops.h"
#include "util/process.h"
#include "workspace/ext4.h"
#include "workspace/manifest.h"

namespace trybox::daemon {

// Writes the entries of `m` (relative to `root`) as an ext4 file system of `geo` into the
// disk's file (by its descriptor, never its path) and has the guest mount it at /workspace.
// With `written`, the caller wrote that file system already (WorkspaceService::Plan, while
// the plan hashed the files): only the announce and the mount are left.
Status MountWorkspace(GuestChannel& guest, WorkspaceDiskPort& disk, const std::string& root,
                      const workspace::Manifest& m, const workspace::Ext4Geometry& geo,
                      bool written = false);

// The tar of a guest's /workspace as read from its disk. While it lives the guest keeps
// /workspace frozen (its writers wait); Finish or the destructor thaws it.
class WorkspaceDiskReader {
 public:
  struct Options {
    std::string binary;        // trybox-ext4tar
    uint64_t max_entries = 0;  // the reader stops past this many entries (0: no limit)
    uint64_t max_bytes = 0;    // ... or this many bytes of files, at their declared sizes
  };
  static Result<std::unique_ptr<WorkspaceDiskReader>> Open(GuestChannel& guest,
                                                           WorkspaceDiskPort& disk,
                                                           const Options& opts);
  ~WorkspaceDiskReader();
  WorkspaceDiskReader(const WorkspaceDiskReader&) = delete;
  WorkspaceDiskReader& operator=(const WorkspaceDiskReader&) = delete;

  // The next chunk of the tar; "" at its end.
  Result<std::string> Next();
  // After Next() returned "": how the reader ended (its error names the image's fault), and
  // the thaw.
  Status Finish();
  // Stops the reader and thaws /workspace.
  void Abort(const std::string& why);
  // After Finish: the sockets the reader left out (a tar cannot hold them), at most
  // Ext4ReadReport::kMaxListedSockets named, the rest counted.
  const std::vector<workspace::Skipped>& skipped() const { return skipped_; }
  uint64_t skipped_unlisted() const { return skipped_unlisted_; }

 private:
  WorkspaceDiskReader(GuestChannel& guest, std::shared_ptr<channel::Stream> freeze)
      : guest_(guest), freeze_(std::move(freeze)) {}
  Status Thaw();
  // Waits for the reader once its output ended: its failure, naming the image's fault.
  Status Reap();

  GuestChannel& guest_;
  std::shared_ptr<channel::Stream> freeze_;
  ChildProcess child_;
  UniqueFd out_, err_;
  bool thawed_ = false;
  std::optional<Status> reaped_;
  std::vector<workspace::Skipped> skipped_;
  uint64_t skipped_unlisted_ = 0;
};

// trybox-ext4tar beside the running binary, else on PATH.
std::string DefaultExt4TarBinary();

}  // namespace trybox::daemon
