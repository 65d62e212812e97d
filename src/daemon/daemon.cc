#include "daemon/daemon.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>

#include "store/schema.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/private_dir.h"
#include "vmm/accel.h"
#include "workspace/git.h"

namespace trybox::daemon {
namespace {

constexpr auto kHousekeepingEvery = std::chrono::seconds(60);

int DefaultRefillWorkers() {
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  return static_cast<int>(std::min(cores + 1, 5L));
}

}  // namespace

Status Daemon::Init() {
  const Paths& p = opts_.paths;
  // The runtime directory holds the socket: a directory someone else made or can write
  // into is refused, never repaired (docs/security.md).
  RETURN_IF_ERROR(MakePrivateDir(p.runtime));
  for (const auto& d : {p.state, p.vms()}) RETURN_IF_ERROR(MakeDirs(d, 0700));
  ASSIGN_OR_RETURN(lock_fd_, OpenFile(p.runtime + "/tryboxd.lock", O_RDWR | O_CREAT, 0600));
  if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    return Status(Code::kAlreadyExists, "another tryboxd is running for " + p.runtime);
  }
  // A probe QEMU of a daemon killed during the acceleration probe (vmm::ReapProbe).
  if (pid_t probe = vmm::ReapProbe(p.runtime)) {
    LogInfo("daemon", "killed the acceleration probe's QEMU (pid " + std::to_string(probe) +
                          ") left by a previous daemon");
  }
  ASSIGN_OR_RETURN(store_, store::Store::Open(p.db()));
  if (std::string w = store_->info().warning; !w.empty()) LogError("store", w);
  // Open checked the store (quick_check); later checks come from the housekeeping.
  {
    MutexLock lock(check_mu_);
    store_check_ = {{"ok", true},
                    {"at", static_cast<int64_t>(store::NowSeconds())},
                    {"detail", "checked at start"}};
  }
  // Execs a dead daemon was running never ended in its record: they are interrupted, by name.
  if (auto n = store_->MarkInterruptedExecs(
          store::NowSeconds(), "interrupted: the daemon that ran it ended before it did");
      !n.ok()) {
    LogError("store", "could not mark the execs of a previous daemon: " + n.status().message());
  } else if (*n > 0) {
    LogInfo("daemon",
            "marked " + std::to_string(*n) + " execs a previous daemon was running as interrupted");
  }
  ASSIGN_OR_RETURN(egress_, EgressGateway::Make(p.config + "/egress.json", *store_));
  auto egress_at_start = egress_->settings();
  const egress::Config& eg = egress_at_start->config;
  uids_ = std::make_unique<UidPool>(::geteuid() == 0 && eg.qemu_drop_uid, eg.qemu_uid_base);
  templates_ = std::make_unique<vmm::TemplateStore>(p.templates(), p.vms(), opts_.boot_timeout);
  // Spare refills and template rebuilds: by default one worker per core and one more (at
  // most five). A refill keeps a core busy while its clone restores and warms (under TCG),
  // but not all the time: it waits on QEMU's monitor and on the guest's replies between its
  // steps, and a core left idle then is a later spare in a burst. On two cores a second
  // worker took ten back-to-back `run`s from p50 305-327 ms to 172-202 ms, a third from
  // 200-276 ms to 115-227 ms in alternated pairs, and the creates beside them were no
  // slower (docs/performance.md, "Back to back").
  const int workers = opts_.refill_workers > 0 ? opts_.refill_workers : DefaultRefillWorkers();
  background_ = std::make_unique<BackgroundQueue>(workers);
  LauncherOptions lo;
  lo.vms_dir = p.vms();
  lo.templates_dir = p.templates();
  lo.probe_dir = p.runtime;
  lo.accel_file = p.state + "/accel.json";
  lo.qemu = opts_.qemu;
  lo.force_accel = opts_.force_accel;
  lo.boot_timeout = opts_.boot_timeout;
  lo.pool.min_spares = opts_.spares;
  lo.pool.memory_budget_mib = opts_.spare_memory_mib;
  lo.pool.demand_window = opts_.spare_demand_window;
  lo.pool.idle_release = opts_.spare_demand_window;
  lo.netns = eg.qemu_netns;
  launcher_ = std::make_unique<VmLauncher>(lo, *templates_, *uids_, *background_);
  registry_ = std::make_unique<VmRegistry>();
  exec_logs_ =
      std::make_unique<ExecLogs>(p.state + "/execs", opts_.exec_log_cap, opts_.exec_log_vm_cap);
  running_ = std::make_unique<RunningExecs>();
  ASSIGN_OR_RETURN(int64_t budget, DiskBudgetBytes(opts_.disk_budget_mib, p.state));
  disks_ = std::make_unique<DiskBudget>(budget, opts_.disk_reserve_mib << 20, p.state);
  LogInfo("daemon", "host-wide disk budget for VMs: " + FormatMiB(budget));
  vms_ = std::make_unique<VmService>(*store_, *registry_, *launcher_, *egress_, p.images,
                                     *exec_logs_, *running_, *disks_, opts_.disk_transfers);
  admission_ = std::make_unique<Admission>(AdmissionLimits{
      opts_.memory_reserve_mib, opts_.max_vms, opts_.memory_total_mib, opts_.memory_overcommit});
  {
    Admission::Memory m = admission_->Describe();
    LogInfo("daemon", "VM memory budget: " + std::to_string(m.budget_mib) + " MiB (" +
                          std::to_string(m.total_mib) + " MiB less a " +
                          std::to_string(m.reserve_mib) + " MiB reserve, overcommit ratio " +
                          std::to_string(m.overcommit) + ")");
  }
  vms_->SetAdmission(admission_.get());
  vms_->ReapLeftovers(p.vms(), p.templates());
  heartbeat_ = std::make_unique<Heartbeat>(
      *registry_,
      [this](VmEntry& vm, VmEntry::Condition c, const std::string& note) {
        vms_->NoteCondition(vm, c, note);
      },
      Heartbeat::Options{});
  heartbeat_->SetOnDamage([this](VmEntry& vm, int64_t failed) { vms_->NoteDamage(vm, failed); });
  heartbeat_->Start();
  // Staging trees of collects a dead daemon left (WorkspaceService::Collect makes them
  // there); none can be in use before this daemon serves.
  // A collect's object quarantine in the user's repository is named by a marker there.
  if (::access((p.state + "/collect").c_str(), F_OK) == 0) {
    auto names = ListDir(p.state + "/collect");
    // A collect cut off by the dead daemon left its marker: its row says so.
    for (const auto& name : names.ok() ? *names : std::vector<std::string>{}) {
      size_t at = name.find(kCollectMarker);
      if (at == std::string::npos || at == 0) continue;
      store::CollectRecord rec;
      rec.vm_id = name.substr(0, at);
      rec.collected_at = store::NowSeconds();
      rec.outcome = "interrupted";
      rec.error =
          "interrupted: the daemon ended during this collect; it committed nothing it would "
          "have reported (see the workspace repository's trybox/ branch)";
      if (auto text = ReadFileToString(p.state + "/collect/" + name); text.ok() && !text->empty()) {
        rec.exec_id = std::atoi(text->c_str());
      }
      auto id = store_->InsertCollect(rec);
      LogInfo("daemon", id.ok() ? "recorded the collect of VM " + rec.vm_id +
                                      " a previous daemon left unfinished as interrupted"
                                : "could not record the interrupted collect of VM " + rec.vm_id +
                                      ": " + id.status().message());
    }
    for (const auto& name : names.ok() ? *names : std::vector<std::string>{}) {
      if (!workspace::IsQuarantineMarker(name)) continue;
      Status q = workspace::RemoveAbandonedQuarantine(p.state + "/collect/" + name);
      LogInfo("daemon", q.ok() ? "removed the object quarantine of a collect a previous daemon "
                                 "left (" +
                                     name + ")"
                               : "could not remove a collect's object quarantine: " + q.message());
    }
    Status st = RemoveTree(p.state + "/collect");
    LogInfo("daemon", st.ok() ? "removed collect staging trees left by a previous daemon"
                              : "could not remove old collect staging: " + st.message());
  }
  workspaces_ = std::make_unique<WorkspaceService>(*store_, *vms_, p.state);
  supervisor_ = std::make_unique<Supervisor>(*vms_, *workspaces_, p.state);
  AgentRunnerOptions ao;
  ao.state_dir = p.state;
  ao.idle = opts_.agent_idle;
  ao.agent_binary = opts_.agent_binary.empty() ? DefaultAgentBinary() : opts_.agent_binary;
  agents_ = std::make_unique<AgentRunner>(*store_, *vms_, *workspaces_, *supervisor_, *uids_, ao);
  records_ = std::make_unique<RecordKeeper>(*store_, *vms_, *registry_, *egress_, p.state,
                                            opts_.retention, opts_.disk_reserve_mib << 20,
                                            [this] { return agents_->LiveRunIds(); });
  if (opts_.retention.interval.count() > 0) PruneAndLog();
  HttpApiSettings hs;
  hs.image_builds.trybox_binary = BinaryBesideSelf("trybox");
  hs.image_builds.work_dir = p.state + "/image-builds";
  http_ = std::make_unique<HttpApi>(*store_, *vms_, hs);
  RETURN_IF_ERROR(http_->Init());
  services_.reset(new Services{opts_.paths, opts_.qemu, *vms_, *launcher_, *egress_, *workspaces_,
                               *agents_, *exec_logs_, *records_, *http_});
  AddVmVerbs(verbs_, *services_);
  AddWorkVerbs(verbs_, *services_);
  AddTerminalVerbs(verbs_, *services_);
  AddStoreVerbs(verbs_, *services_);
  AddHttpVerbs(verbs_, *services_);
  images_ = std::make_unique<ImageService>(p, *registry_, *templates_);
  // A killed commit or build leaves its `.build-NAME-PID` (a whole layer) that its own
  // name's next build would not remove; its process is gone, so nothing uses it.
  for (const Freed& f : images_->RemoveBuildLeftovers(/*dry_run=*/false)) {
    LogInfo("daemon", "removed " + f.path + " (" + FormatMiB(static_cast<int64_t>(f.bytes)) +
                          "), left by a build or commit whose process is gone");
  }
  AddImageVerbs(verbs_, *images_, *services_);
  control_.started_at = static_cast<int64_t>(store::NowSeconds());
  Admission::Memory mem = admission_->Describe();
  control_.limits = {{"memory_reserve_mib", opts_.memory_reserve_mib},
                     {"memory_total_mib", mem.total_mib},
                     {"memory_total_from_setting", mem.total_from_setting},
                     {"memory_overcommit", opts_.memory_overcommit},
                     {"memory_budget_mib", mem.budget_mib},
                     {"max_vms", opts_.max_vms},
                     {"disk_budget_mib", budget >> 20},
                     {"disk_reserve_mib", opts_.disk_reserve_mib},
                     {"exec_log_cap", opts_.exec_log_cap},
                     {"exec_log_vm_cap", opts_.exec_log_vm_cap}};
  control_.settings = {{"log_file", opts_.log_file},
                       {"retention",
                        {{"max_age_s", opts_.retention.max_age.count()},
                         {"max_vms", opts_.retention.max_vms},
                         {"max_runs", opts_.retention.max_runs},
                         {"prune_interval_s", opts_.retention.interval.count()}}},
                       {"store_check_interval_s", opts_.store_check_interval.count()}};
  control_.store_check = [this] {
    MutexLock lock(check_mu_);
    return store_check_;
  };
  control_.stop = [this](const std::string& why) { Stop(why); };
  AddDaemonVerbs(verbs_, *services_, control_);
  server_ = std::make_unique<ControlServer>(verbs_, [this](const std::string& id) {
    if (vms_->Destroy(id).ok())
      LogInfo("daemon", "destroyed ephemeral VM " + id + " of a closed connection");
  });
  RETURN_IF_ERROR(server_->Listen(p.socket()));
  // trybox's own REST routes call the verbs over a connection from inside.
  ASSIGN_OR_RETURN(UniqueFd verbs, server_->Attach());
  http_->SetVerbConnection(std::move(verbs));
  if (!opts_.http_listen.empty()) {
    ASSIGN_OR_RETURN(api::ListenAddress where, api::ParseListenAddress(opts_.http_listen));
    RETURN_IF_ERROR(http_->Serve(where).status());
  } else if (std::string kept = RememberedListen(p.state); !kept.empty()) {
    // `trybox serve` asked a previous daemon: the HTTP API comes back on the same address.
    auto where = api::ParseListenAddress(kept);
    auto url = where.ok() ? http_->Serve(*where) : Result<std::string>(where.status());
    if (url.ok()) {
      LogInfo("http", "serving again where `trybox serve` asked before: " + *url);
    } else {
      LogError("http", "could not serve again on " + kept +
                           " (`trybox serve` takes another): " + url.status().message());
    }
  }
  housekeeping_ = std::thread([this] { Housekeeping(); });
  LogInfo("daemon", "listening on " + p.socket());
  return Status::Ok();
}

Status Daemon::Serve() { return server_->Serve(); }

void Daemon::Housekeeping() {
  MutexLock lock(mu_);
  auto last_prune = std::chrono::steady_clock::now();
  auto last_check = std::chrono::steady_clock::now();
  const auto check_every = opts_.store_check_interval;
  const auto tick = check_every.count() > 0
                        ? std::min<std::chrono::seconds>(kHousekeepingEvery, check_every)
                        : std::chrono::seconds(kHousekeepingEvery);
  for (;;) {
    auto next = std::chrono::steady_clock::now() + tick;
    while (!stopping_ && housekeeping_cv_.WaitUntil(mu_, next)) {
    }
    if (stopping_) return;
    mu_.Unlock();
    egress_->Housekeeping();
    vms_->EnforceDiskBudget();
    if (check_every.count() > 0 && std::chrono::steady_clock::now() - last_check >= check_every) {
      last_check = std::chrono::steady_clock::now();
      CheckStore();
    }
    const auto every = opts_.retention.interval;
    // Measured from before the previous prune, so that a prune every tick stays every tick.
    if (every.count() > 0 && std::chrono::steady_clock::now() - last_prune >= every) {
      last_prune = std::chrono::steady_clock::now();
      PruneAndLog();
    }
    mu_.Lock();
  }
}

void Daemon::PruneAndLog() {
  auto r = records_->Prune(false);
  if (!r.ok()) {
    LogError("store", "retention: " + r.status().message());
    return;
  }
  for (const auto& e : r->errors) LogError("store", "retention: " + e);
  if (r->vms + r->agent_runs + r->egress + r->exec_logs + r->run_dirs + r->collect_leftovers > 0) {
    LogInfo("store", "retention pruned " + std::to_string(r->vms) + " VM records (" +
                         std::to_string(r->execs) + " execs), " + std::to_string(r->agent_runs) +
                         " agent runs, " + std::to_string(r->egress) + " egress rows, " +
                         std::to_string(r->exec_logs + r->run_dirs + r->collect_leftovers) +
                         " directories (" + FormatMiB(r->bytes) + ")");
  }
}

void Daemon::CheckStore() {
  Status st = store::QuickCheck(opts_.paths.db());
  MutexLock lock(check_mu_);
  const bool was_ok = store_check_.value("ok", true);
  store_check_ = {{"ok", st.ok()},
                  {"at", static_cast<int64_t>(store::NowSeconds())},
                  {"detail", st.ok() ? "quick_check: ok" : st.message()}};
  if (!st.ok() && was_ok) {
    LogError("store", st.message() +
                          ". The daemon keeps serving from what it can read; stop it and see "
                          "docs/store.md (\"The file and its guard\") before the next start");
  } else if (st.ok() && !was_ok) {
    LogInfo("store", "the store passes its integrity check again");
  }
}

Status Daemon::Reload() {
  const size_t running = vms_ ? vms_->LiveVms() : 0;
  auto r = egress_->Reload();
  if (!r.ok()) {
    LogError("daemon", "reload refused, the settings in force stay: " + r.status().message());
    return r.status();
  }
  LogInfo("daemon", "reloaded egress.json: " + std::to_string(r->changed.size()) + " changes; " +
                        std::to_string(running) +
                        " running VMs keep the settings they were created with");
  for (const auto& key : r->restart_required) {
    LogInfo("daemon", "egress.json: " + key + " takes effect only after a restart");
  }
  return Status::Ok();
}

void Daemon::Stop(const std::string& why) {
  {
    MutexLock lock(mu_);
    if (stop_reason_.empty()) stop_reason_ = why;
  }
  if (server_) server_->Stop();
}

Daemon::~Daemon() {
  if (server_) server_->Stop();
  {
    MutexLock lock(mu_);
    stopping_ = true;
    housekeeping_cv_.SignalAll();
  }
  if (housekeeping_.joinable()) housekeeping_.join();
  // No HTTP request may start a VM while the VMs are being destroyed.
  http_.reset();
  heartbeat_.reset();
  // Background work (template rebuilds, spare refills) uses the launcher: it stops first.
  background_.reset();
  agents_.reset();
  if (launcher_) launcher_->DestroySpares();
  std::string why;
  {
    MutexLock lock(mu_);
    why = stop_reason_;
  }
  if (vms_) {
    vms_->DestroyAll("tryboxd was stopped" + (why.empty() ? std::string() : " (" + why + ")") +
                     " and destroyed every VM");
  }
  // Detached execs end with their VMs; they use the services below until they have.
  if (running_) running_->WaitDetached();
  // Egress handlers end with their VMs' streams; the gateway waits for them.
  supervisor_.reset();
  workspaces_.reset();
  egress_.reset();
}

}  // namespace trybox::daemon
