#include "daemon/vm_service.h"

#include <dirent.h>

#include "image/image.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/names.h"
#include "util/sha256.h"

namespace trybox::daemon {

Status VmService::Validate(const CreateRequest& req) const {
  ASSIGN_OR_RETURN(std::string dir, image::ImageDir(images_dir_, req.image));
  RETURN_IF_ERROR(image::VerifyImage(dir));
  return egress_.AllowList(req.allow, req.profiles).status();
}

Result<CreatedVm> VmService::Create(const CreateRequest& req, const Progress& progress) {
  ASSIGN_OR_RETURN(std::string dir, image::ImageDir(images_dir_, req.image));
  RETURN_IF_ERROR(image::VerifyImage(dir));
  ASSIGN_OR_RETURN(std::string manifest_sha, Sha256File(dir + "/manifest.json"));
  ASSIGN_OR_RETURN(egress::AllowList allow, egress_.AllowList(req.allow, req.profiles));

  LaunchSpec spec{req.image, dir, manifest_sha, req.memory_mib, req.cpus, req.cold, progress};
  auto launched = launcher_.Launch(spec);
  if (!launched.ok()) return launched.status().Annotate("boot a " + req.image + " VM");

  const vmm::VmConfig& cfg = launched->vm->config();
  store::VmRecord rec;
  rec.id = cfg.id;
  rec.image = req.image;
  rec.image_sha256 = manifest_sha;
  rec.state = "running";
  rec.pid = launched->vm->pid();
  rec.accel = cfg.accel;
  rec.memory_mib = req.memory_mib;
  rec.cpus = req.cpus;
  rec.dir = cfg.vm_dir;
  rec.created_at = store::NowSeconds();
  CreatedVm out;
  out.allow = allow.ToStrings();
  out.start = launched->start;
  out.boot_ms = launched->vm->boot_ms();
  auto eg = egress_.NewVm(std::move(allow));
  launched->vm->SetGuestOpen(egress_.GuestHandler(cfg.id, eg));
  out.entry = std::make_shared<VmEntry>(std::move(launched->vm), std::move(launched->uid), eg, rec,
                                        req.privileged, disk_transfers_);
  Status st = store_.InsertVm(rec);
  if (!st.ok()) {
    out.entry->Destroy();
    return st.Annotate("record the VM");
  }
  registry_.Add(out.entry);
  return out;
}

Result<std::shared_ptr<VmEntry>> VmService::Get(const std::string& id) {
  RETURN_IF_ERROR(ValidateName("VM id", id));
  if (auto e = registry_.Find(id)) return e;
  ASSIGN_OR_RETURN(auto rec, store_.GetVm(id));
  if (rec) {
    return FailedPrecondition("VM " + id + " is already " + rec->state +
                              (rec->state == "destroyed" ? "" : ": " + rec->note));
  }
  return NotFound("no VM with id " + QuoteForMessage(id));
}

void VmService::NoteDeath(VmEntry& vm) {
  if (vm.alive()) return;
  std::string why = vm.death_reason();
  if (vm.MarkDead(why)) (void)store_.UpdateVmState(vm.id(), "dead", why);
}

Result<vmm::DestroyReport> VmService::Destroy(const std::string& id) {
  ASSIGN_OR_RETURN(auto e, Get(id));
  if (!registry_.Remove(id)) {
    return FailedPrecondition("VM " + id + " is already being destroyed");
  }
  NoteDeath(*e);
  vmm::DestroyReport report = e->Destroy();
  egress_.VmGone(id);
  (void)store_.UpdateVmState(id, "destroyed", report.ToJson().dump());
  return report;
}

std::vector<store::VmRecord> VmService::List() {
  std::vector<store::VmRecord> out;
  for (auto& e : registry_.All()) {
    NoteDeath(*e);
    out.push_back(e->record());
  }
  return out;
}

ExecSpec VmService::SpecFor(const VmEntry& vm, const ExecRequest& req) const {
  ExecSpec spec;
  spec.argv = req.argv;
  spec.env = req.env;
  spec.cwd = req.cwd.value_or(vm.has_workspace() ? "/workspace" : "/root");
  spec.timeout_ms = req.timeout_ms;
  spec.stdin = req.stdin;
  spec.user = req.user;
  spec.privileged = vm.privileged();
  return spec;
}

Result<ExecResult> VmService::Exec(VmEntry& vm, const ExecSpec& spec, const ExecIo& io,
                                   int64_t* exec_id) {
  if (!vm.alive()) {
    NoteDeath(vm);
    ExecResult r;
    r.outcome = ExecOutcome::kChannelLost;
    r.message = "the guest is gone: " + vm.death_reason();
    return r;
  }
  store::ExecRecord rec;
  rec.vm_id = vm.id();
  rec.argv = spec.argv;
  rec.cwd = spec.cwd;
  rec.started_at = store::NowSeconds();
  rec.outcome = "running";
  auto id = store_.InsertExec(rec);
  if (!id.ok()) {
    // Nothing runs unrecorded.
    return Status(id.status().code(),
                  "the exec could not be recorded, so it was not run: " + id.status().message());
  }
  rec.id = *id;
  if (exec_id) *exec_id = rec.id;
  ExecResult result = RunExec(vm, spec, io);
  if (result.outcome == ExecOutcome::kChannelLost) NoteDeath(vm);
  rec.ended_at = store::NowSeconds();
  rec.outcome = ExecOutcomeName(result.outcome);
  rec.exit_code = result.exit_code;
  rec.signal = result.signal;
  rec.error = result.message.empty() ? result.error : result.message;
  rec.stdout_bytes = result.stdout_bytes;
  rec.stderr_bytes = result.stderr_bytes;
  Status st = store_.FinishExec(rec);
  if (!st.ok()) LogError("daemon", "exec " + std::to_string(rec.id) + ": " + st.message());
  return result;
}

void VmService::ReapLeftovers(const std::string& vms_dir, const std::string& templates_dir) {
  auto running = store_.ListVms({"running"});
  if (running.ok()) {
    for (const auto& v : *running) {
      auto r = vmm::ReapOrphan(v.id, v.pid, v.dir);
      LogInfo("daemon", "reaped VM " + v.id + " left by a previous daemon: " + r.ToJson().dump());
      (void)store_.UpdateVmState(v.id, "reaped", r.ToJson().dump());
    }
  }
  // Directories with no record (a daemon that died between boot and insert).
  if (DIR* d = ::opendir(vms_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      std::string dir = vms_dir + "/" + name;
      auto pid_text = ReadFileToString(dir + "/qemu.pid");
      int64_t pid = pid_text.ok() ? std::atoll(pid_text->c_str()) : 0;
      auto r = vmm::ReapOrphan(name, pid, dir);
      LogInfo("daemon", "removed leftover VM directory " + name + ": " + r.ToJson().dump());
    }
    ::closedir(d);
  }
  // Half-built templates of a daemon that died mid-build.
  if (DIR* d = ::opendir(templates_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.rfind(".building-", 0) != 0) continue;
      (void)RemoveTree(templates_dir + "/" + name);
      LogInfo("daemon", "removed half-built template " + name);
    }
    ::closedir(d);
  }
}

void VmService::DestroyAll() {
  for (auto& e : registry_.TakeAll()) {
    auto report = e->Destroy();
    (void)store_.UpdateVmState(e->id(), "destroyed", report.ToJson().dump());
  }
}

}  // namespace trybox::daemon
