// Daemon: tryboxd's core. Owns the VM registry, the SQLite store, the acceleration choice
// and the unix socket with its fixed list of verbs (docs/protocol/daemon.md).
//
// Each client connection is a channel::Mux (the daemon plays the accepting role); each
// request is one stream whose OPEN names a verb. Verbs run on their own threads, so a long
// exec never blocks a list or a create. Thread-safe throughout.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "channel/mux.h"
#include "store/store.h"
#include "util/paths.h"
#include "util/socket.h"
#include "vmm/qemu.h"

namespace trybox::daemon {

using Json = nlohmann::json;

struct Options {
  Paths paths;
  std::string qemu = "qemu-system-x86_64";
  // Forces the acceleration instead of probing ("kvm" or "tcg"); empty means probe.
  std::string force_accel;
  std::chrono::milliseconds boot_timeout{120000};
};

class Daemon {
 public:
  explicit Daemon(Options opts) : opts_(std::move(opts)) {}
  ~Daemon();

  // Creates directories, takes the single-instance lock, opens the store, reaps VMs left by
  // a daemon that died, and binds the socket.
  Status Init();
  // Accepts clients until Stop(). Then destroys every VM.
  Status Serve();
  // Safe from any thread (the signal thread calls it).
  void Stop();

 private:
  struct VmEntry {
    std::unique_ptr<vmm::Vm> vm;
    store::VmRecord record;
    bool has_workspace = false;  // GUARDED_BY(Daemon::mu_): execs default to /workspace
  };

  // One client connection. VMs created with "ephemeral": true belong to it and are
  // destroyed when it closes, however the client went away.
  struct Connection {
    std::mutex mu;
    std::vector<std::string> ephemeral;  // GUARDED_BY(mu)
    bool closed = false;                 // GUARDED_BY(mu)
  };

  void HandleClient(UniqueFd fd);
  void Dispatch(std::shared_ptr<channel::Stream> s, Json req, Connection& conn);
  Json DoCreate(const Json& req);
  Json DoDestroy(const Json& req);
  Json DoList(const Json& req);
  Json DoDoctor(const Json& req);
  void DoExec(channel::Stream& client, const Json& req);
  void DoPut(channel::Stream& client, const Json& req);
  void DoGet(channel::Stream& client, const Json& req);
  // Workspace verbs (workspace_verbs.cc, docs/workspace.md).
  void DoWorkspaceIn(channel::Stream& client, const Json& req);
  Json DoCollect(const Json& req);
  Json DoDiff(const Json& req);

  // Runs one exec request `greq` in the VM and records it in the store. Output goes to
  // `client` (if not null) and, capped to its tail, to `capture` (if not null).
  Json RunGuestExec(VmEntry& e, const Json& greq, channel::Stream* client, bool want_stdin,
                    std::string* capture, int64_t* exec_id);

  // The VM for a request's "vm" field, or an error Status naming why not.
  Result<std::shared_ptr<VmEntry>> Lookup(const Json& req);
  // Marks a VM dead in the store once, when its death is first observed.
  void NoteDeath(VmEntry& e);
  vmm::AccelChoice Accel(const std::string& image_dir);
  void ReapLeftovers();

  Options opts_;
  std::unique_ptr<store::Store> store_;
  std::optional<UnixListener> listener_;
  UniqueFd lock_fd_;

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<VmEntry>> vms_;  // GUARDED_BY(mu_)
  std::optional<vmm::AccelChoice> accel_;                // GUARDED_BY(mu_)
  bool stopping_ = false;                                // GUARDED_BY(mu_)
};

// {"ok":false,"error":{"code":"NOT_FOUND","message":...}}
Json ErrorReply(const Status& st);
// A guest file request's error END ({"ok":false,"error":"not_found",...}) in that shape,
// keeping the guest's error name as "kind". Other bodies are returned unchanged.
Json NormalizeGuestEnd(Json end);

}  // namespace trybox::daemon
