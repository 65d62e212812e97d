#include "daemon/vm_service.h"

#include <dirent.h>

#include <future>
#include <mutex>

#include "image/image.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/names.h"
#include "util/sha256.h"

namespace trybox::daemon {

namespace {

// Where the guest finds the VM's egress CA (docs/secrets.md): appended to the system
// bundle, which most clients read, and on its own for Node's extra-CA variable.
constexpr char kGuestBundle[] = "/etc/ssl/certs/ca-certificates.crt";
constexpr char kGuestCaFile[] = "/etc/trybox/egress-ca.pem";
constexpr int64_t kMaxGuestBundle = 8 << 20;

Status InstallEgressCa(GuestChannel& guest, const std::string& pem) {
  std::string bundle;
  auto old = ReadFile(guest, kGuestBundle, kMaxGuestBundle);
  if (old.ok()) {
    if (old->truncated) return FailedPrecondition(std::string(kGuestBundle) + " is too large");
    bundle = std::move(old->data);
    if (!bundle.empty() && bundle.back() != '\n') bundle += '\n';
  } else if (old.status().code() != Code::kNotFound) {
    return old.status().Annotate("read the guest's CA bundle");
  }
  RETURN_IF_ERROR(WriteFile(guest, kGuestCaFile, pem, 0644, /*mkdirs=*/true));
  return WriteFile(guest, kGuestBundle, bundle + pem, 0644, /*mkdirs=*/true);
}

std::map<std::string, std::string> TrustEnv() {
  return {{"SSL_CERT_FILE", kGuestBundle},
          {"REQUESTS_CA_BUNDLE", kGuestBundle},
          {"CURL_CA_BUNDLE", kGuestBundle},
          {"GIT_SSL_CAINFO", kGuestBundle},
          {"NODE_EXTRA_CA_CERTS", kGuestCaFile}};
}

}  // namespace

Status VmService::Validate(const CreateRequest& req) const {
  ASSIGN_OR_RETURN(std::string dir, image::ImageDir(images_dir_, req.image));
  RETURN_IF_ERROR(image::VerifyImage(dir));
  RETURN_IF_ERROR(egress_.Reach(req.internet, req.allow, req.profiles, req.deny).status());
  if (req.secrets && !req.secrets->empty()) {
    RETURN_IF_ERROR(egress::SecretSet::Make(*req.secrets).status());
  }
  RETURN_IF_ERROR(egress::HttpRules::Make(req.http_rules).status());
  return disks_.Admit(DiskUses());
}

Result<CreatedVm> VmService::Create(const CreateRequest& req, const Progress& progress) {
  ASSIGN_OR_RETURN(std::string dir, image::ImageDir(images_dir_, req.image));
  RETURN_IF_ERROR(image::VerifyImage(dir));
  ASSIGN_OR_RETURN(std::string manifest_sha, Sha256File(dir + "/manifest.json"));
  ASSIGN_OR_RETURN(image::Manifest manifest, image::ReadManifest(dir));
  ASSIGN_OR_RETURN(egress::Reach reach,
                   egress_.Reach(req.internet, req.allow, req.profiles, req.deny));
  std::shared_ptr<const egress::SecretSet> secrets;
  if (req.secrets && !req.secrets->empty()) {
    ASSIGN_OR_RETURN(secrets, egress::SecretSet::Make(*req.secrets));
  }
  std::shared_ptr<const egress::HttpRules> rules;
  if (!req.http_rules.empty()) {
    ASSIGN_OR_RETURN(egress::HttpRules made, egress::HttpRules::Make(req.http_rules));
    rules = std::make_shared<const egress::HttpRules>(std::move(made));
  }
  RETURN_IF_ERROR(disks_.Admit(DiskUses()));
  // A VM the store could not record would run unrecorded: refused before it boots.
  RETURN_IF_ERROR(store_.CheckWritable());
  // Held until the VM is registered or gone: creates still booting count against the limits.
  std::optional<Admission::Ticket> admitted;
  if (admission_) {
    int64_t promised = 0;
    auto live = registry_.All();
    for (const auto& vm : live) promised += vm->record().memory_mib;
    ASSIGN_OR_RETURN(auto ticket, admission_->Admit(req.memory_mib,
                                                    static_cast<int64_t>(live.size()), promised));
    admitted.emplace(std::move(ticket));
  }

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
  rec.privileged = req.privileged;
  CreatedVm out;
  out.start = launched->start;
  out.boot_ms = launched->vm->boot_ms();
  auto eg = egress_.NewVm(std::move(reach), secrets, std::move(rules));
  if (!eg.ok()) {
    (void)launched->vm->Destroy();
    return eg.status().Annotate("set up the VM's egress");
  }
  launched->vm->SetGuestOpen(egress_.GuestHandler(cfg.id, *eg));
  out.entry = std::make_shared<VmEntry>(std::move(launched->vm), std::move(launched->uid), *eg, rec,
                                        disk_transfers_);
  std::map<std::string, std::string> env = manifest.env;
  if ((*eg)->policy()->model_route) {
    env["TRYBOX_MODEL_URL"] = std::string("http://") + egress::kModelHost;
  }
  if ((*eg)->ca) {  // secrets or HTTP rules: the guest trusts the VM's CA
    Status st = InstallEgressCa(*out.entry, (*eg)->ca->cert_pem());
    if (!st.ok()) {
      out.entry->Destroy();
      return st.Annotate("install the VM's egress CA in the guest");
    }
    for (auto& [k, v] : TrustEnv()) env[k] = v;
  }
  if (secrets) {
    for (auto& [k, v] : secrets->GuestEnv()) env[k] = v;
  }
  out.entry->set_image_env(std::move(env));
  Status st = store_.InsertVm(rec);
  if (!st.ok()) {
    out.entry->Destroy();
    return Status(st.code(),
                  "store_unavailable: the VM could not be recorded, so it was "
                  "destroyed: " +
                      st.message());
  }
  registry_.Add(out.entry);
  return out;
}

Result<egress::Reach> VmService::ChangeEgress(const std::string& id, const EgressChange& c) {
  ASSIGN_OR_RETURN(auto e, Get(id));
  return egress_.Change(id, *e->egress(), c);
}

Result<EgressGateway::RequestAnswer> VmService::AnswerNetworkRequest(const std::string& id,
                                                                     const std::string& entry,
                                                                     const std::string& who) {
  ASSIGN_OR_RETURN(auto e, Get(id));
  return egress_.AnswerRequest(id, *e->egress(), entry, who);
}

Status VmService::RefuseNetworkRequest(const std::string& id, const std::string& entry,
                                       const std::string& why) {
  ASSIGN_OR_RETURN(egress::AllowEntry e, egress::ParseAllowEntry(entry));
  egress_.RecordRefusedRequest(id, e, why);
  return Status::Ok();
}

Result<std::shared_ptr<VmEntry>> VmService::GetLive(const std::string& id) {
  ASSIGN_OR_RETURN(auto vm, Get(id));
  if (!vm->alive()) return Unavailable("the VM died: " + vm->death_reason());
  return vm;
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

void VmService::NoteCondition(VmEntry& vm, VmEntry::Condition c, const std::string& note) {
  const VmEntry::Condition before = vm.condition();
  if (!vm.SetCondition(c, note)) return;
  if (c == VmEntry::Condition::kRunning) {
    LogInfo("daemon", "VM " + vm.id() + " answers again (it was " + VmEntry::ConditionName(before) +
                          "); running");
  } else {
    LogError("daemon", "VM " + vm.id() + " is " + VmEntry::ConditionName(c) + ": " + note);
  }
}

void VmService::NoteDamage(VmEntry& vm, int64_t failed_writes) {
  auto free = vm.HostFreeBytes();
  const std::string note =
      std::to_string(failed_writes) +
      " of its disk writes failed on the host: the host's file system under " +
      vm.vm().config().vm_dir + " filled (" +
      (free ? std::to_string(*free >> 20) + " MiB free now" : std::string("free space unknown")) +
      "), and the guest saw each as an I/O error; its file systems may have gone read-only "
      "and stay so now that there is room. Files can still be read out (trybox cp " +
      vm.id() + ":PATH ., trybox collect " + vm.id() + "); then destroy it (trybox rm " + vm.id() +
      ") and start a new VM";
  if (!vm.MarkDamaged(note)) return;
  LogError("daemon", "VM " + vm.id() + " is damaged: " + note);
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

std::vector<DiskUse> VmService::DiskUses() const {
  std::vector<DiskUse> out;
  for (auto& e : registry_.All()) {
    // Its exec logs are its writes on the host too (docs/store.md, "Exec logs").
    out.push_back({e->id(), DiskBudget::VmBytes(e->vm().config().vm_dir) + logs_.VmBytes(e->id())});
  }
  return out;
}

std::vector<std::string> VmService::EnforceDiskBudget() {
  std::vector<std::string> destroyed;
  if (disks_.budget() <= 0) return destroyed;
  while (auto over = disks_.OverBudget(DiskUses())) {
    auto e = registry_.Find(over->vm_id);
    if (!e || !registry_.Remove(over->vm_id)) break;  // gone meanwhile, or being destroyed
    const std::string why = "destroyed by tryboxd: its disks and exec logs took " +
                            FormatMiB(over->bytes) +
                            " on the host, past the host-wide disk budget of " +
                            FormatMiB(disks_.budget()) + " (tryboxd --disk-budget)";
    LogError("daemon", "VM " + over->vm_id + " " + why);
    e->MarkDead(why);
    (void)e->Destroy();
    egress_.VmGone(over->vm_id);
    (void)store_.UpdateVmState(over->vm_id, "reaped", why);
    destroyed.push_back(over->vm_id);
  }
  return destroyed;
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
  // Without a workspace, a command runs in its account's home (/root for root, /home/user
  // for `user`), which the guest knows from its /etc/passwd.
  bool root = req.user.empty() || req.user == "root";
  spec.cwd = req.cwd.value_or(vm.has_workspace() ? "/workspace" : root ? "/root" : "");
  spec.timeout_ms = req.timeout_ms;
  spec.stdin = req.stdin;
  spec.user = req.user;
  spec.privileged = vm.privileged();
  spec.tty = req.tty;
  return spec;
}

Status VmService::Responsive(VmEntry& vm) {
  if (!vm.unresponsive()) return Status::Ok();
  store::VmRecord rec = vm.record();
  return Unavailable("VM " + vm.id() + " is " + rec.state + ": " + rec.note +
                     "; nothing was run (`trybox rm " + vm.id() + "` destroys it)");
}

Result<VmService::Recorded> VmService::Record(VmEntry& vm, const ExecSpec& spec) {
  Recorded r;
  r.rec.vm_id = vm.id();
  r.rec.argv = spec.argv;
  r.rec.cwd = spec.cwd.empty() ? "~" + spec.user : spec.cwd;  // "~user": that account's home
  r.rec.started_at = store::NowSeconds();
  r.started = std::chrono::steady_clock::now();
  r.rec.outcome = "running";
  // Nothing runs unrecorded: its start is committed before the guest hears of it, and
  // without room for its end it does not start.
  RETURN_IF_ERROR(store_.CheckRoom());
  auto id = store_.InsertExec(r.rec);
  if (!id.ok()) {
    return Status(id.status().code(),
                  "store_unavailable: the exec could not be recorded, so it was not run: " +
                      id.status().message());
  }
  r.rec.id = *id;
  r.log = logs_.Start(vm.id(), r.rec.id);
  return r;
}

ExecResult VmService::RunRecorded(VmEntry& vm, const ExecSpec& spec, const ExecIo& io, Recorded r) {
  store::ExecRecord& rec = r.rec;
  ExecIo mine = io;
  // The exec's log always; the caller's own sink too, when it gave one.
  struct Tee : OutputSink {
    OutputSink* log;
    OutputSink* caller;
    void Append(uint8_t channel, std::string_view data) override {
      log->Append(channel, data);
      caller->Append(channel, data);
    }
  } tee;
  tee.log = r.log.get();
  tee.caller = io.sink;
  mine.sink = io.sink ? static_cast<OutputSink*>(&tee) : r.log.get();
  mine.on_open = [&](std::shared_ptr<channel::Stream> s) {
    // A detached exec's input comes from the callers that started it (the HTTP API's
    // SendInput); one with a client takes it from the client alone.
    running_.Add(rec.id, s, io.client ? ExecInput{} : ExecInput{spec.stdin, spec.tty.has_value()});
    if (io.on_open) io.on_open(std::move(s));
  };
  // The image's env under the exec's own (docs/images.md, "Derived images").
  ExecSpec merged = spec;
  merged.env = image::MergeEnv(vm.image_env(), spec.env);
  ExecResult result = RunExec(vm, merged, mine);
  running_.Remove(rec.id);
  if (result.outcome == ExecOutcome::kChannelLost) NoteDeath(vm);
  rec.ended_at = store::NowSeconds();
  // On the monotonic clock: a step of the host's wall clock during the exec (NTP, an
  // operator's `date -s`) changes ended_at - started_at, not how long it ran (issue 51.7).
  rec.duration_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - r.started)
                        .count();
  rec.outcome = ExecOutcomeName(result.outcome);
  rec.exit_code = result.exit_code;
  rec.signal = result.signal;
  rec.error = result.message.empty() ? result.error : result.message;
  rec.stdout_bytes = result.stdout_bytes;
  rec.stderr_bytes = result.stderr_bytes;
  Status st = store_.FinishExec(rec);
  if (!st.ok()) LogError("daemon", "exec " + std::to_string(rec.id) + ": " + st.message());
  // After the record: a follower that sees the log end reads the final outcome.
  logs_.Finish(rec.id);
  // What the command wrote counts against the host-wide budget from now on.
  EnforceDiskBudget();
  return result;
}

Result<ExecResult> VmService::Exec(VmEntry& vm, const ExecSpec& spec, const ExecIo& io,
                                   int64_t* exec_id) {
  if (!vm.alive()) {
    NoteDeath(vm);
    ExecResult r;
    r.outcome = ExecOutcome::kNotStarted;
    r.message = "the guest is gone: " + vm.death_reason();
    return r;
  }
  RETURN_IF_ERROR(Responsive(vm));
  ASSIGN_OR_RETURN(Recorded r, Record(vm, spec));
  if (exec_id) *exec_id = r.rec.id;
  return RunRecorded(vm, spec, io, std::move(r));
}

Result<DetachedExec> VmService::ExecDetached(std::shared_ptr<VmEntry> vm, const ExecSpec& spec) {
  if (!vm->alive()) {
    NoteDeath(*vm);
    return Unavailable("the guest is gone: " + vm->death_reason());
  }
  RETURN_IF_ERROR(Responsive(*vm));
  ASSIGN_OR_RETURN(Recorded r, Record(*vm, spec));
  DetachedExec out;
  out.exec_id = r.rec.id;
  // Fulfilled once: by the started event, or by the end of an exec that never started.
  auto started = std::make_shared<std::promise<std::optional<ExecResult>>>();
  auto once = std::make_shared<std::once_flag>();
  running_.Detach([this, vm, spec, r = std::move(r), started, once]() mutable {
    ExecIo io;
    io.on_started = [&] { std::call_once(*once, [&] { started->set_value(std::nullopt); }); };
    ExecResult result = RunRecorded(*vm, spec, io, std::move(r));
    std::call_once(*once, [&] { started->set_value(result); });
  });
  out.ended = started->get_future().get();
  return out;
}

Result<store::VmRecord> VmService::Record(const std::string& id) {
  RETURN_IF_ERROR(ValidateName("VM id", id));
  ASSIGN_OR_RETURN(auto vm, store_.GetVm(id));
  if (!vm) return NotFound("no VM with id " + QuoteForMessage(id));
  return *vm;
}

Result<store::ExecRecord> VmService::GetExec(int64_t exec_id) {
  ASSIGN_OR_RETURN(auto rec, store_.GetExec(exec_id));
  if (!rec) return NotFound("no exec with id " + std::to_string(exec_id));
  return *rec;
}

Result<std::shared_ptr<ExecLog>> VmService::OpenExecLog(int64_t exec_id) {
  ASSIGN_OR_RETURN(store::ExecRecord rec, GetExec(exec_id));
  return logs_.Open(rec.vm_id, exec_id);
}

Status VmService::NotRunning(int64_t exec_id, const Status& why) {
  if (why.code() != Code::kFailedPrecondition) return why;
  // It ended meanwhile (or before): say how, from the record.
  auto rec = GetExec(exec_id);
  if (!rec.ok()) return why;
  if (rec->outcome == "running") return why;  // running, but not for this (no input, ...)
  std::string how = rec->outcome;
  if (rec->exit_code) how += " with code " + std::to_string(*rec->exit_code);
  if (rec->signal) how += " by signal " + std::to_string(*rec->signal);
  return FailedPrecondition("exec " + std::to_string(exec_id) + " is not running (it " + how + ")");
}

Status VmService::SignalExec(int64_t exec_id, int sig) {
  RETURN_IF_ERROR(GetExec(exec_id).status());
  Status st = running_.Signal(exec_id, sig);
  return st.ok() ? st : NotRunning(exec_id, st);
}

Result<ExecInput> VmService::ExecInputOf(int64_t exec_id) {
  RETURN_IF_ERROR(GetExec(exec_id).status());
  auto in = running_.InputOf(exec_id);
  if (!in.ok()) return NotRunning(exec_id, in.status());
  return in;
}

Status VmService::InputExec(int64_t exec_id, std::string_view data) {
  RETURN_IF_ERROR(GetExec(exec_id).status());
  Status st = running_.Input(exec_id, data);
  return st.ok() ? st : NotRunning(exec_id, st);
}

Status VmService::CloseExecInput(int64_t exec_id) {
  RETURN_IF_ERROR(GetExec(exec_id).status());
  Status st = running_.CloseInput(exec_id);
  return st.ok() ? st : NotRunning(exec_id, st);
}

Status VmService::ResizeExec(int64_t exec_id, TermSize size) {
  RETURN_IF_ERROR(GetExec(exec_id).status());
  Status st = running_.Resize(exec_id, size.rows, size.cols);
  return st.ok() ? st : NotRunning(exec_id, st);
}

Result<std::vector<store::ExecRecord>> VmService::Execs(const std::string& vm_id) {
  ASSIGN_OR_RETURN(store::VmRecord vm, Record(vm_id));
  ASSIGN_OR_RETURN(auto execs, store_.ListExecs(vm_id));
  for (auto& e : execs) {
    if (e.outcome != "running") continue;
    if (vm.state != "running" && !running_.Running(e.id)) {
      // Still "running" in the record, which stays as it is (nobody saw the end: a daemon
      // died before it); shown for what it is.
      e.outcome = "unknown";
      e.error = "its end was not observed: the daemon stopped before the exec ended";
      continue;
    }
    auto log = logs_.Open(vm_id, e.id);
    if (!log.ok()) continue;
    e.stdout_bytes = (*log)->total(ExecLog::kStdout);
    e.stderr_bytes = (*log)->total(ExecLog::kStderr);
  }
  return execs;
}

std::map<std::string, store::ExecCount> VmService::ExecCounts() {
  auto counts = store_.CountExecs();
  return counts.ok() ? *counts : std::map<std::string, store::ExecCount>{};
}

Result<store::PrunedVms> VmService::PruneRecords(double ended_before, int64_t keep_ended,
                                                 bool dry_run) {
  ASSIGN_OR_RETURN(store::PrunedVms pruned, store_.PruneVms(ended_before, keep_ended, dry_run));
  if (dry_run) return pruned;
  for (const auto& id : pruned.ids) {
    Status st = logs_.RemoveVm(id);
    if (!st.ok()) LogError("daemon", "remove the exec logs of VM " + id + ": " + st.message());
  }
  return pruned;
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

void VmService::DestroyAll(const std::string& why) {
  for (auto& e : registry_.TakeAll()) {
    auto report = e->Destroy(why);
    (void)store_.UpdateVmState(e->id(), "destroyed", report.ToJson().dump());
  }
}

}  // namespace trybox::daemon
