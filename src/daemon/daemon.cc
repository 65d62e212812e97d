#include "daemon/daemon.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "util/log.h"

namespace trybox::daemon {

Status Daemon::Init() {
  const Paths& p = opts_.paths;
  for (const auto& d : {p.state, p.runtime, p.vms()}) RETURN_IF_ERROR(MakeDirs(d, 0700));
  ASSIGN_OR_RETURN(lock_fd_, OpenFile(p.runtime + "/tryboxd.lock", O_RDWR | O_CREAT, 0600));
  if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    return Status(Code::kAlreadyExists, "another tryboxd is running for " + p.runtime);
  }
  ASSIGN_OR_RETURN(store_, store::Store::Open(p.db()));
  ASSIGN_OR_RETURN(egress_, EgressGateway::Make(p.config + "/egress.json", *store_));
  const egress::Config& eg = egress_->config();
  uids_ = std::make_unique<UidPool>(::geteuid() == 0 && eg.qemu_drop_uid, eg.qemu_uid_base);
  templates_ = std::make_unique<vmm::TemplateStore>(p.templates(), p.vms(), opts_.boot_timeout);
  background_ = std::make_unique<BackgroundQueue>();
  LauncherOptions lo;
  lo.vms_dir = p.vms();
  lo.templates_dir = p.templates();
  lo.probe_dir = p.runtime;
  lo.accel_file = p.state + "/accel.json";
  lo.qemu = opts_.qemu;
  lo.force_accel = opts_.force_accel;
  lo.boot_timeout = opts_.boot_timeout;
  lo.spares = opts_.spares;
  lo.netns = eg.qemu_netns;
  launcher_ = std::make_unique<VmLauncher>(lo, *templates_, *uids_, *background_);
  registry_ = std::make_unique<VmRegistry>();
  exec_logs_ = std::make_unique<ExecLogs>(p.state + "/execs", opts_.exec_log_cap);
  running_ = std::make_unique<RunningExecs>();
  vms_ = std::make_unique<VmService>(*store_, *registry_, *launcher_, *egress_, p.images,
                                     *exec_logs_, *running_, opts_.retention);
  vms_->ReapLeftovers(p.vms(), p.templates());
  vms_->Prune();
  workspaces_ = std::make_unique<WorkspaceService>(*store_, *vms_, p.state);
  supervisor_ = std::make_unique<Supervisor>(*vms_, *workspaces_, p.state);
  agents_ = std::make_unique<AgentRunner>(*store_, *vms_, *workspaces_, *supervisor_, p.state,
                                          opts_.agent_idle);
  services_.reset(new Services{opts_.paths, opts_.qemu, *vms_, *launcher_, *egress_, *workspaces_,
                               *agents_, *exec_logs_});
  AddVmVerbs(verbs_, *services_);
  AddWorkVerbs(verbs_, *services_);
  AddTerminalVerbs(verbs_, *services_);
  server_ = std::make_unique<ControlServer>(verbs_, [this](const std::string& id) {
    if (vms_->Destroy(id).ok())
      LogInfo("daemon", "destroyed ephemeral VM " + id + " of a closed connection");
  });
  RETURN_IF_ERROR(server_->Listen(p.socket()));
  LogInfo("daemon", "listening on " + p.socket());
  return Status::Ok();
}

Status Daemon::Serve() { return server_->Serve(); }

void Daemon::Stop() {
  if (server_) server_->Stop();
}

Daemon::~Daemon() {
  if (server_) server_->Stop();
  // Background work (template rebuilds, spare refills) uses the launcher: it stops first.
  background_.reset();
  agents_.reset();
  if (launcher_) launcher_->DestroySpares();
  if (vms_) vms_->DestroyAll();
  // Detached execs end with their VMs; they use the services below until they have.
  if (running_) running_->WaitDetached();
  // Egress handlers end with their VMs' streams; the gateway waits for them.
  supervisor_.reset();
  workspaces_.reset();
  egress_.reset();
}

}  // namespace trybox::daemon
