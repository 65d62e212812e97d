// Daemon: tryboxd's composition root. It builds the services in order, wires them to the
// verb table, serves the socket, and tears everything down in the reverse order:
//
//   store (SQLite)  egress gateway  uid pool  templates  background queue
//        \               |             |          |            |
//         +--------- VmLauncher, VmRegistry, VmService --------+
//                        |                   |
//               WorkspaceService        Supervisor
//                        \                   /
//                            AgentRunner
//                                 |
//                    RecordKeeper (retention)
//                                 |
//                  HttpApi (the HTTP server, off until `serve`)
//                                 |
//                 VerbTable (verbs.h) -> ControlServer (the socket)
//
// Each service owns its state and its lock (see its header). Thread-safe: Stop() may be
// called from any thread (the signal thread does).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "daemon/admission.h"
#include "daemon/agent_process.h"
#include "daemon/agent_runner.h"
#include "daemon/background.h"
#include "daemon/control_server.h"
#include "daemon/egress_gateway.h"
#include "daemon/exec_logs.h"
#include "daemon/heartbeat.h"
#include "daemon/http_api.h"
#include "daemon/image_service.h"
#include "daemon/record_keeper.h"
#include "daemon/running_execs.h"
#include "daemon/supervisor.h"
#include "daemon/uid_pool.h"
#include "daemon/verbs.h"
#include "daemon/vm_launcher.h"
#include "daemon/vm_registry.h"
#include "daemon/vm_service.h"
#include "daemon/workspace_service.h"
#include "store/store.h"
#include "util/paths.h"
#include "vmm/template.h"

namespace trybox::daemon {

struct Options {
  Paths paths;
  std::string qemu = "qemu-system-x86_64";
  // Forces the acceleration instead of probing ("kvm" or "tcg"); empty means probe.
  std::string force_accel;
  std::chrono::milliseconds boot_timeout{120000};
  // Restored, warmed clones kept ready per machine shape in use, at least; the pool grows
  // with demand up to spare_memory_mib for all spares together (docs/templates.md). 0
  // turns spares off.
  int spares = 1;
  int64_t spare_memory_mib = 2048;
  // Spare refills (and template rebuilds) that run at once; 0: one per core and one more,
  // at most five (docs/templates.md, "Spare clones").
  int refill_workers = 0;
  // The creates of the last `spare_demand_window` set a shape's target; a spare idle for as
  // long beyond the target is released (docs/templates.md, "Spare clones").
  std::chrono::seconds spare_demand_window{60};
  // Bulk data (workspaces, cp) through each VM's transfer disk; false: always the channel.
  bool disk_transfers = true;
  // A vm_agent run left waiting (NEEDS_INPUT, IN_PROGRESS, ERROR) keeps its VM this long
  // after its last call; then the VM is destroyed and the run can no longer continue.
  std::chrono::seconds agent_idle{3600};
  // The vm_agent loop's process; empty: trybox-agent beside tryboxd.
  std::string agent_binary;
  // Bytes of each exec's stdout and of its stderr kept (the first half and the last half;
  // docs/store.md, "Exec logs"); 0 keeps none.
  int64_t exec_log_cap = kDefaultExecLogCap;
  int64_t exec_log_vm_cap = kDefaultExecLogVmCap;
  // What the record keeps of what ended (record_keeper.h; docs/store.md, "Retention").
  RetentionPolicy retention;
  // The host-wide cap on the running VMs' disks (disk_budget.h); 0: half the free space of
  // the state filesystem when the daemon starts.
  int64_t disk_budget_mib = 0;
  // Free space a create needs under the state directory.
  int64_t disk_reserve_mib = 512;
  // Admission (admission.h): MemAvailable a create leaves the host, and the cap on live
  // VMs (0: none).
  int64_t memory_reserve_mib = 256;
  int64_t max_vms = 0;
  int64_t memory_total_mib = 0;  // 0: MemTotal (daemon/admission.h)
  double memory_overcommit = 1.0;
  // Serve the HTTP API on this loopback address from the start ("" : only when `serve` asks;
  // docs/protocol/http.md).
  std::string http_listen;
  // The log file (--log-file); empty: standard error. Shown by `daemon status`.
  std::string log_file;
  // How often the housekeeping checks the store's integrity (quick_check); 0: never after
  // the check at start.
  std::chrono::seconds store_check_interval{600};
};

class Daemon {
 public:
  explicit Daemon(Options opts) : opts_(std::move(opts)) {}
  // Destroys every VM and spare, then stops the services.
  ~Daemon();

  // Creates directories, takes the single-instance lock, opens the store, reaps VMs left by
  // a daemon that died, and binds the socket.
  Status Init();
  // Accepts clients until Stop().
  Status Serve();
  // Safe from any thread. `why` ("trybox daemon stop", "SIGTERM") is what the execs it cuts
  // off report.
  void Stop(const std::string& why = "");
  // Reads egress.json again for new VMs, as `trybox daemon reload` does (SIGHUP); the
  // outcome, good or bad, is logged. Safe from any thread.
  Status Reload();

 private:
  Options opts_;
  UniqueFd lock_fd_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<EgressGateway> egress_;
  std::unique_ptr<UidPool> uids_;
  std::unique_ptr<vmm::TemplateStore> templates_;
  std::unique_ptr<BackgroundQueue> background_;
  std::unique_ptr<ExecLogs> exec_logs_;
  std::unique_ptr<DiskBudget> disks_;
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<RunningExecs> running_;
  std::unique_ptr<VmLauncher> launcher_;
  std::unique_ptr<VmRegistry> registry_;
  std::unique_ptr<VmService> vms_;
  std::unique_ptr<Heartbeat> heartbeat_;
  std::unique_ptr<WorkspaceService> workspaces_;
  std::unique_ptr<Supervisor> supervisor_;
  std::unique_ptr<AgentRunner> agents_;
  std::unique_ptr<RecordKeeper> records_;
  std::unique_ptr<HttpApi> http_;
  std::unique_ptr<ImageService> images_;
  std::unique_ptr<Services> services_;
  DaemonControl control_;
  VerbTable verbs_;
  std::unique_ptr<ControlServer> server_;
  // Now and then: audit summaries and retention.
  void Housekeeping() EXCLUDES(mu_);
  void PruneAndLog();
  // Runs the store's integrity check; logs a change of verdict; the verdict goes to status.
  void CheckStore();
  Mutex mu_;
  CondVar housekeeping_cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::string stop_reason_ GUARDED_BY(mu_);
  Mutex check_mu_;
  Json store_check_ GUARDED_BY(check_mu_);
  std::thread housekeeping_;
};

}  // namespace trybox::daemon
