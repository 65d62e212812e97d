// tryboxd: the per-user (or system) trybox daemon. Usually started by the CLI on demand.
#include <malloc.h>
#include <signal.h>
#include <sys/prctl.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "daemon/daemon.h"
#include "util/log.h"
#include "util/version.h"

int main(int argc, char** argv) {
  // Secrets and model keys pass through this process (docs/secrets.md). Like ssh-agent, it
  // makes itself non-dumpable: a crash writes no core file holding what its heap held (the
  // raw bytes of a request are freed unwiped), and other processes of the same user can
  // neither ptrace it nor read its memory. TRYBOX_CORE_DUMPS=1 keeps it dumpable to debug a
  // crash; the pages that hold secrets are MADV_DONTDUMP then.
  if (const char* d = std::getenv("TRYBOX_CORE_DUMPS"); !(d && std::string(d) == "1")) {
    ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  }
  CLI::App app{"tryboxd: owns trybox VMs, images and records; serves the trybox socket"};
  trybox::daemon::Options opts;
  opts.paths = trybox::Paths::FromEnvironment();
  std::string accel;
  app.add_option("--accel", accel, "Force the accelerator instead of probing")
      ->check(CLI::IsMember({"kvm", "tcg"}));
  if (const char* q = std::getenv("TRYBOX_QEMU"); q && *q) opts.qemu = q;
  app.add_option("--qemu", opts.qemu, "QEMU system emulator binary (env TRYBOX_QEMU)");
  double boot_timeout_s = 120;
  if (const char* t = std::getenv("TRYBOX_BOOT_TIMEOUT"); t && *t) boot_timeout_s = std::atof(t);
  app.add_option("--boot-timeout", boot_timeout_s,
                 "Seconds a guest agent has to answer before create fails (env "
                 "TRYBOX_BOOT_TIMEOUT)");
  if (const char* n = std::getenv("TRYBOX_SPARES"); n && *n) opts.spares = std::atoi(n);
  app.add_option("--spares", opts.spares,
                 "Restored, warmed clones kept ready per machine shape in use, at least (more "
                 "with demand); 0 restores on demand (env TRYBOX_SPARES)")
      ->check(CLI::Range(0, 16));
  if (const char* n = std::getenv("TRYBOX_SPARE_MEMORY_MIB"); n && *n) {
    opts.spare_memory_mib = std::atoll(n);
  }
  app.add_option("--spare-memory", opts.spare_memory_mib,
                 "MiB all spare clones may take together (each counted at its memory size); "
                 "the pool grows with demand up to this (env TRYBOX_SPARE_MEMORY_MIB)")
      ->check(CLI::NonNegativeNumber);
  if (const char* n = std::getenv("TRYBOX_REFILL_WORKERS"); n && *n) {
    opts.refill_workers = std::atoi(n);
  }
  app.add_option(
         "--refill-workers", opts.refill_workers,
         "Spare refills that run at once; 0 picks one per core and one more, at most five (env "
         "TRYBOX_REFILL_WORKERS)")
      ->check(CLI::Range(0, 16));
  int64_t demand_window_s = opts.spare_demand_window.count();
  if (const char* n = std::getenv("TRYBOX_SPARE_DEMAND_WINDOW_S"); n && *n) {
    demand_window_s = std::atoll(n);
  }
  app.add_option("--spare-demand-window", demand_window_s,
                 "Seconds of creates that set the spare pool's target, and how long a spare "
                 "beyond it may stay idle (env TRYBOX_SPARE_DEMAND_WINDOW_S)")
      ->check(CLI::PositiveNumber);
  int64_t agent_idle_s = 3600;
  if (const char* n = std::getenv("TRYBOX_AGENT_IDLE_S"); n && *n) agent_idle_s = std::atoll(n);
  app.add_option("--agent-idle", agent_idle_s,
                 "Seconds a vm_agent run waiting for an answer or a resume keeps its VM (env "
                 "TRYBOX_AGENT_IDLE_S)")
      ->check(CLI::PositiveNumber);
  if (const char* a = std::getenv("TRYBOX_AGENT_BINARY"); a && *a) opts.agent_binary = a;
  app.add_option("--agent-binary", opts.agent_binary,
                 "The vm_agent loop's program (default: trybox-agent beside tryboxd; env "
                 "TRYBOX_AGENT_BINARY)");
  std::string log_file;
  app.add_option("--log-file", log_file,
                 "Write the log to this file (rotated at 16 MiB, one old file kept) instead of "
                 "stderr");
  std::string transfer = "disk";
  if (const char* t = std::getenv("TRYBOX_TRANSFER"); t && *t) transfer = t;
  app.add_option("--transfer", transfer,
                 "How bulk data (workspaces, cp) reaches a VM: through its transfer disk, or "
                 "only the control channel (env TRYBOX_TRANSFER)")
      ->check(CLI::IsMember({"disk", "channel"}));
  if (const char* n = std::getenv("TRYBOX_EXEC_LOG_CAP"); n && *n) {
    opts.exec_log_cap = std::atoll(n);
  }
  app.add_option("--exec-log-cap", opts.exec_log_cap,
                 "Bytes of each exec's stdout and of its stderr kept for `trybox logs`: the "
                 "first and the last half; 0 keeps none (env TRYBOX_EXEC_LOG_CAP)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  if (const char* n = std::getenv("TRYBOX_EXEC_LOG_VM_CAP"); n && *n) {
    opts.exec_log_vm_cap = std::atoll(n);
  }
  app.add_option("--exec-log-vm-cap", opts.exec_log_vm_cap,
                 "Bytes one VM's exec logs may take together; past it the logs of its oldest "
                 "finished execs are trimmed, each leaving a note saying so; 0: no cap (env "
                 "TRYBOX_EXEC_LOG_VM_CAP)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  int64_t retention_s = opts.retention.max_age.count();
  if (const char* n = std::getenv("TRYBOX_RETENTION_S"); n && *n) retention_s = std::atoll(n);
  app.add_option("--retention", retention_s,
                 "Seconds the record of a VM that ended is kept, with its exec logs, and a "
                 "finished agent run with its repository; 0: no age limit (env "
                 "TRYBOX_RETENTION_S)")
      ->check(CLI::NonNegativeNumber);
  if (const char* n = std::getenv("TRYBOX_RETENTION_VMS"); n && *n) {
    opts.retention.max_vms = std::atoll(n);
  }
  app.add_option("--retention-vms", opts.retention.max_vms,
                 "Records of ended VMs kept at most (the newest), with their exec logs; 0: no "
                 "count limit (env TRYBOX_RETENTION_VMS)")
      ->check(CLI::NonNegativeNumber);
  if (const char* n = std::getenv("TRYBOX_RETENTION_RUNS"); n && *n) {
    opts.retention.max_runs = std::atoll(n);
  }
  app.add_option("--retention-runs", opts.retention.max_runs,
                 "Finished agent runs kept at most (the newest), with their repositories; 0: "
                 "no count limit (env TRYBOX_RETENTION_RUNS)")
      ->check(CLI::NonNegativeNumber);
  int64_t prune_every_s = opts.retention.interval.count();
  if (const char* n = std::getenv("TRYBOX_PRUNE_INTERVAL_S"); n && *n) {
    prune_every_s = std::atoll(n);
  }
  app.add_option("--prune-interval", prune_every_s,
                 "Seconds between the daemon's own prunes (at start, then from its "
                 "housekeeping); 0: only `trybox prune` (env TRYBOX_PRUNE_INTERVAL_S)")
      ->check(CLI::NonNegativeNumber);
  int64_t store_check_s = opts.store_check_interval.count();
  if (const char* n = std::getenv("TRYBOX_STORE_CHECK_S"); n && *n) store_check_s = std::atoll(n);
  app.add_option("--store-check-interval", store_check_s,
                 "Seconds between checks of the store's integrity (PRAGMA quick_check on a "
                 "connection of its own) while the daemon runs; 0: only at start (env "
                 "TRYBOX_STORE_CHECK_S)")
      ->check(CLI::NonNegativeNumber);
  if (const char* n = std::getenv("TRYBOX_DISK_BUDGET_MIB"); n && *n) {
    opts.disk_budget_mib = std::atoll(n);
  }
  app.add_option("--disk-budget", opts.disk_budget_mib,
                 "MiB the running VMs' disks may take on the host together; past it the VM "
                 "using the most is destroyed. 0: half the state filesystem's free space at "
                 "start (env TRYBOX_DISK_BUDGET_MIB)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  if (const char* n = std::getenv("TRYBOX_DISK_RESERVE_MIB"); n && *n) {
    opts.disk_reserve_mib = std::atoll(n);
  }
  app.add_option("--disk-reserve", opts.disk_reserve_mib,
                 "MiB of free space under the state directory a create needs (env "
                 "TRYBOX_DISK_RESERVE_MIB)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  if (const char* n = std::getenv("TRYBOX_MEMORY_RESERVE_MIB"); n && *n) {
    opts.memory_reserve_mib = std::atoll(n);
  }
  app.add_option("--memory-reserve", opts.memory_reserve_mib,
                 "MiB of available memory (MemAvailable) a create must leave the host beside "
                 "the VM's own memory (env TRYBOX_MEMORY_RESERVE_MIB)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  if (const char* n = std::getenv("TRYBOX_MEMORY_TOTAL_MIB"); n && *n) {
    opts.memory_total_mib = std::atoll(n);
  }
  app.add_option("--memory-total", opts.memory_total_mib,
                 "MiB of host memory the VMs' memory budget starts from; 0: MemTotal (env "
                 "TRYBOX_MEMORY_TOTAL_MIB). The budget is this less --memory-reserve, times "
                 "--memory-overcommit; every live VM's memory size counts against it")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  if (const char* n = std::getenv("TRYBOX_MEMORY_OVERCOMMIT"); n && *n) {
    opts.memory_overcommit = std::atof(n);
  }
  app.add_option("--memory-overcommit", opts.memory_overcommit,
                 "Ratio of the VMs' memory budget to the host's memory less the reserve; 1: "
                 "no memory is promised twice (the default), 2: twice as much, trusting the "
                 "guests not to use it all (env TRYBOX_MEMORY_OVERCOMMIT)")
      ->check(CLI::Range(0.1, 64.0));
  if (const char* n = std::getenv("TRYBOX_MAX_VMS"); n && *n) opts.max_vms = std::atoll(n);
  app.add_option("--max-vms", opts.max_vms,
                 "Live VMs at most (spare clones not counted); 0: no cap (env TRYBOX_MAX_VMS)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  if (const char* l = std::getenv("TRYBOX_HTTP_LISTEN"); l && *l) opts.http_listen = l;
  app.add_option("--http-listen", opts.http_listen,
                 "Serve the HTTP API (E2B-compatible) on this loopback HOST:PORT from the start; "
                 "otherwise only once `trybox serve` asks (env TRYBOX_HTTP_LISTEN)");
  app.set_version_flag("--version", std::string("tryboxd ") + trybox::Version());
  bool debug = false;
  app.add_flag("--debug", debug, "Verbose logging");
  CLI11_PARSE(app, argc, argv);
  opts.force_accel = accel;
  opts.disk_transfers = transfer == "disk";
  opts.agent_idle = std::chrono::seconds(agent_idle_s);
  opts.spare_demand_window = std::chrono::seconds(demand_window_s);
  // The environment's values bypass CLI11's checks.
  if (opts.exec_log_cap < 0 || opts.exec_log_cap > (int64_t{1} << 40) || opts.exec_log_vm_cap < 0 ||
      opts.exec_log_vm_cap > (int64_t{1} << 50) || retention_s < 0 || opts.retention.max_vms < 0 ||
      opts.retention.max_runs < 0 || prune_every_s < 0 || opts.disk_budget_mib < 0 ||
      opts.disk_budget_mib > (int64_t{1} << 30) || opts.disk_reserve_mib < 0 ||
      opts.disk_reserve_mib > (int64_t{1} << 30) || opts.memory_reserve_mib < 0 ||
      opts.memory_reserve_mib > (int64_t{1} << 30) || opts.max_vms < 0 ||
      opts.max_vms > (int64_t{1} << 20) || opts.memory_total_mib < 0 ||
      opts.memory_total_mib > (int64_t{1} << 30) || !(opts.memory_overcommit >= 0.1) ||
      !(opts.memory_overcommit <= 64.0) || demand_window_s <= 0 ||
      demand_window_s > (int64_t{1} << 30)) {
    std::cerr << "tryboxd: TRYBOX_EXEC_LOG_CAP must be from 0 to 2^40, TRYBOX_EXEC_LOG_VM_CAP "
                 "from 0 to 2^50, TRYBOX_RETENTION_S "
                 "(and _VMS, _RUNS, TRYBOX_PRUNE_INTERVAL_S) not negative, TRYBOX_DISK_BUDGET_MIB "
                 "and TRYBOX_DISK_RESERVE_MIB and "
                 "TRYBOX_MEMORY_RESERVE_MIB and TRYBOX_MEMORY_TOTAL_MIB from 0 to 2^30, "
                 "TRYBOX_MEMORY_OVERCOMMIT from 0.1 to 64, TRYBOX_MAX_VMS from 0 to 2^20, "
                 "TRYBOX_SPARE_DEMAND_WINDOW_S from 1 to 2^30\n";
    return 2;
  }
  // The daemon's housekeeping runs once a minute: a shorter interval would silently be 60.
  if (prune_every_s > 0 && prune_every_s < 60) {
    std::cerr << "tryboxd: --prune-interval (TRYBOX_PRUNE_INTERVAL_S) must be 0 (prune only "
                 "by hand) or at least 60 seconds, not "
              << prune_every_s << "\n";
    return 2;
  }
  if (store_check_s < 0) {
    std::cerr << "tryboxd: TRYBOX_STORE_CHECK_S must not be negative\n";
    return 2;
  }
  opts.store_check_interval = std::chrono::seconds(store_check_s);
  opts.log_file = log_file;
  opts.retention.max_age = std::chrono::seconds(retention_s);
  opts.retention.interval = std::chrono::seconds(prune_every_s);
  opts.boot_timeout = std::chrono::milliseconds(static_cast<int64_t>(boot_timeout_s * 1000));
  if (debug) trybox::SetLogLevel(trybox::LogLevel::kDebug);
  if (!log_file.empty()) {
    trybox::Status st = trybox::SetLogFile(log_file, 16u << 20);
    if (!st.ok()) {
      std::cerr << "tryboxd: " << st.ToString() << "\n";
      return 1;
    }
  }

  // One malloc arena: with glibc's default (one per thread, up to 8 per core) the daemon's
  // RSS grew 35 -> 43 MB over a 1,000-cycle soak of 4 clients; with one it stayed at 23.5 MB
  // and the latencies were no worse (docs/performance.md, "Soak"). MALLOC_ARENA_MAX wins.
  if (!std::getenv("MALLOC_ARENA_MAX")) (void)::mallopt(M_ARENA_MAX, 1);

  // Signals are taken by one thread with sigwait; every other thread has them blocked.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  trybox::daemon::Daemon d(opts);
  trybox::Status st = d.Init();
  if (!st.ok()) {
    std::cerr << "tryboxd: " << st.ToString() << "\n";
    return st.code() == trybox::Code::kAlreadyExists ? 3 : 1;
  }
  // SIGHUP reloads the configuration, as `trybox daemon reload` does; SIGTERM and SIGINT
  // stop the daemon (its VMs are destroyed).
  std::thread([&d, set] {
    for (;;) {
      int sig;
      if (sigwait(&set, &sig) != 0) continue;
      if (sig == SIGHUP) {
        trybox::LogInfo("daemon", "SIGHUP: reloading the configuration");
        (void)d.Reload();
        continue;
      }
      trybox::LogInfo("daemon", std::string("stopping on ") + strsignal(sig));
      d.Stop(std::string(strsignal(sig)));
      return;
    }
  }).detach();
  st = d.Serve();
  if (!st.ok()) {
    std::cerr << "tryboxd: " << st.ToString() << "\n";
    return 1;
  }
  trybox::LogInfo("daemon", "stopped; destroying VMs");
  return 0;
}
