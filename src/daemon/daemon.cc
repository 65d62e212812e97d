#include "daemon/daemon.h"

#include <dirent.h>
#include <sys/file.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "image/image.h"
#include "util/log.h"
#include "util/names.h"
#include "util/sha256.h"

namespace trybox::daemon {
namespace {

using Kind = channel::Stream::Message::Kind;
using Clock = std::chrono::steady_clock;

constexpr int kMinMemoryMib = 128;
constexpr int kMaxMemoryMib = 65536;
constexpr int kMaxCpus = 64;

Status CheckString(const Json& req, const char* field, bool required) {
  if (!req.contains(field)) {
    return required ? InvalidArgument(std::string("missing field '") + field + "'") : Status::Ok();
  }
  if (!req[field].is_string())
    return InvalidArgument(std::string("'") + field + "' must be a string");
  return Status::Ok();
}

// Forwards everything the guest sends on `guest` to `client` until the guest's END. Returns
// the END body, or a body describing how the stream failed: a lost channel is its own
// outcome, never a borrowed success.
struct RelayResult {
  Json end;        // the guest's END body (empty if none arrived)
  Status failure;  // why no END arrived
  bool client_gone = false;
  int64_t bytes[3] = {0, 0, 0};
};

// How much of an output a capture keeps (its tail).
constexpr size_t kCaptureBytes = 256 * 1024;

RelayResult RelayFromGuest(channel::Stream& guest, channel::Stream* client,
                           std::string* capture = nullptr) {
  RelayResult r;
  for (;;) {
    auto m = guest.Next();
    if (!m.ok()) {
      r.failure = m.status();
      return r;
    }
    switch (m->kind) {
      case Kind::kData:
        r.bytes[m->channel] += static_cast<int64_t>(m->data.size());
        if (capture) {
          capture->append(m->data);
          if (capture->size() > 2 * kCaptureBytes) {
            capture->erase(0, capture->size() - kCaptureBytes);
          }
        }
        if (!client) break;
        if (!r.client_gone && !client->Write(m->channel, m->data).ok()) {
          // The caller went away: stop the guest's work rather than run it unobserved.
          r.client_gone = true;
          (void)guest.Reset("the client disconnected");
          r.failure = Unavailable("the client disconnected");
          return r;
        }
        break;
      case Kind::kEof:
        if (client) (void)client->CloseWrite(m->channel);
        break;
      case Kind::kEvent:
        if (client) (void)client->SendEvent(m->body);
        break;
      case Kind::kEnd:
        r.end = std::move(m->body);
        return r;
      case Kind::kReset:
        r.failure = Unavailable("the guest aborted the request: " +
                                m->body.value("reason", std::string("no reason given")));
        return r;
    }
  }
}

// Copies the client's input channel to the guest until EOF. After a guest-side failure it
// keeps draining so the client is never left blocked on credit.
void PumpToGuest(channel::Stream& client, channel::Stream& guest) {
  bool forwarding = true;
  for (;;) {
    auto m = client.Next();
    if (!m.ok()) break;
    if (m->kind == Kind::kData && forwarding) {
      if (!guest.Write(channel::kChanIn, m->data).ok()) forwarding = false;
    } else if (m->kind == Kind::kEof) {
      if (forwarding) (void)guest.CloseWrite(channel::kChanIn);
      break;
    } else if (m->kind == Kind::kReset || m->kind == Kind::kEnd) {
      (void)guest.Reset("the client cancelled the request");
      break;
    }
  }
}

// Reads and drops the client's upload until it ends, so a refused put never leaves the
// client blocked on credit.
void DrainInput(channel::Stream& client) {
  for (;;) {
    auto m = client.Next();
    if (!m.ok() || m->kind == Kind::kEof || m->kind == Kind::kReset || m->kind == Kind::kEnd) {
      return;
    }
  }
}

// Ends a put/get: the guest's END in the daemon's error shape, or why none came.
void FinishFileRelay(channel::Stream& client, vmm::Vm& vm, const RelayResult& r) {
  if (!r.end.is_null()) {
    (void)client.End(NormalizeGuestEnd(r.end));
    return;
  }
  std::string why = vm.death_reason();
  (void)client.End(
      ErrorReply(Unavailable(why.empty() ? r.failure.message() : "the guest is gone: " + why)));
}

}  // namespace

// Guest file errors arrive as {"ok":false,"error":"not_found","message":...}; callers get
// the daemon's one error shape, keeping the guest's kind.
Json NormalizeGuestEnd(Json end) {
  if (end.value("ok", false) || !end.contains("error") || !end["error"].is_string()) return end;
  std::string kind = end["error"];
  Code code = Code::kInternal;
  if (kind == "not_found") code = Code::kNotFound;
  if (kind == "no_space") code = Code::kResourceExhausted;
  if (kind == "not_a_directory" || kind == "bad_request" || kind == "unsupported") {
    code = Code::kInvalidArgument;
  }
  return {{"ok", false},
          {"error",
           {{"code", CodeName(code)}, {"kind", kind}, {"message", end.value("message", kind)}}}};
}

Json ErrorReply(const Status& st) {
  return {{"ok", false}, {"error", {{"code", CodeName(st.code())}, {"message", st.message()}}}};
}

Daemon::~Daemon() {
  std::map<std::string, std::shared_ptr<VmEntry>> vms;
  {
    std::lock_guard<std::mutex> lock(mu_);
    vms.swap(vms_);
  }
  for (auto& [id, e] : vms) {
    auto report = e->vm->Destroy();
    if (store_) (void)store_->UpdateVmState(id, "destroyed", report.ToJson().dump());
  }
}

Status Daemon::Init() {
  const Paths& p = opts_.paths;
  for (const auto& d : {p.state, p.runtime, p.vms()}) RETURN_IF_ERROR(MakeDirs(d, 0700));
  ASSIGN_OR_RETURN(lock_fd_, OpenFile(p.runtime + "/tryboxd.lock", O_RDWR | O_CREAT, 0600));
  if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    return Status(Code::kAlreadyExists, "another tryboxd is running for " + p.runtime);
  }
  ASSIGN_OR_RETURN(store_, store::Store::Open(p.db()));
  ReapLeftovers();
  ASSIGN_OR_RETURN(UnixListener l, UnixListener::Listen(p.socket()));
  listener_.emplace(std::move(l));
  LogInfo("daemon", "listening on " + p.socket());
  return Status::Ok();
}

void Daemon::ReapLeftovers() {
  auto running = store_->ListVms({"running"});
  if (running.ok()) {
    for (const auto& v : *running) {
      auto r = vmm::ReapOrphan(v.id, v.pid, v.dir);
      LogInfo("daemon", "reaped VM " + v.id + " left by a previous daemon: " + r.ToJson().dump());
      (void)store_->UpdateVmState(v.id, "reaped", r.ToJson().dump());
    }
  }
  // Directories with no record (a daemon that died between boot and insert).
  DIR* d = ::opendir(opts_.paths.vms().c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string dir = opts_.paths.vms() + "/" + name;
    auto pid_text = ReadFileToString(dir + "/qemu.pid");
    int64_t pid = pid_text.ok() ? std::atoll(pid_text->c_str()) : 0;
    auto r = vmm::ReapOrphan(name, pid, dir);
    LogInfo("daemon", "removed leftover VM directory " + name + ": " + r.ToJson().dump());
  }
  ::closedir(d);
}

Status Daemon::Serve() {
  for (;;) {
    auto c = listener_->Accept();
    if (!c.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return Status::Ok();
      return c.status();
    }
    auto cred = GetPeerCred(c->get());
    if (!cred.ok() || (cred->uid != ::geteuid() && cred->uid != 0)) {
      LogWarn("daemon", "refused a connection from uid " +
                            (cred.ok() ? std::to_string(cred->uid) : std::string("unknown")));
      continue;  // dropping the fd closes the connection
    }
    std::thread([this, fd = std::move(*c)]() mutable { HandleClient(std::move(fd)); }).detach();
  }
}

void Daemon::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  if (listener_) listener_->Shutdown();
}

void Daemon::HandleClient(UniqueFd fd) {
  // The client opens streams (odd ids), like the host does towards a guest.
  auto mux = std::make_shared<channel::Mux>(std::move(fd), channel::Role::kGuest);
  auto conn = std::make_shared<Connection>();
  std::promise<void> dead;
  auto fut = dead.get_future();
  mux->OnOpen([this, conn](std::shared_ptr<channel::Stream> s, Json req) {
    Dispatch(s, std::move(req), *conn);
  });
  mux->OnDeath([&dead](const std::string& why) {
    // A client that simply hung up is routine; anything else (a bad frame, a failed write)
    // is worth a line when a caller reports a dropped connection.
    if (why != "connection closed") LogWarn("daemon", "client connection lost: " + why);
    dead.set_value();
  });
  mux->Start();
  fut.wait();
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    conn->closed = true;
    ids.swap(conn->ephemeral);
  }
  // Usually already destroyed by the client itself; then this is a no-op error.
  for (const auto& id : ids) {
    Json r = DoDestroy({{"vm", id}});
    if (r.value("ok", false)) {
      LogInfo("daemon", "destroyed ephemeral VM " + id + " of a closed connection");
    }
  }
}

void Daemon::Dispatch(std::shared_ptr<channel::Stream> s, Json req, Connection& conn) {
  std::string verb = req.value("verb", "");
  try {
    if (verb == "exec") return DoExec(*s, req);
    if (verb == "put") return DoPut(*s, req);
    if (verb == "get") return DoGet(*s, req);
    if (verb == "workspace_in") return DoWorkspaceIn(*s, req);
    Json reply;
    if (verb == "create") {
      reply = DoCreate(req);
      if (reply.value("ok", false) && req.value("ephemeral", false)) {
        std::string id = reply["vm"]["id"];
        bool closed;
        {
          std::lock_guard<std::mutex> lock(conn.mu);
          closed = conn.closed;
          if (!closed) conn.ephemeral.push_back(id);
        }
        // The client left while the VM booted: nobody will ever use it.
        if (closed) reply = DoDestroy({{"vm", id}});
      }
    } else if (verb == "destroy") {
      reply = DoDestroy(req);
    } else if (verb == "list") {
      reply = DoList(req);
    } else if (verb == "doctor") {
      reply = DoDoctor(req);
    } else if (verb == "collect") {
      reply = DoCollect(req);
    } else if (verb == "diff") {
      reply = DoDiff(req);
    } else if (verb == "ping") {
      reply = {{"ok", true}, {"pid", ::getpid()}};
    } else {
      reply = ErrorReply(
          InvalidArgument("unknown verb " + QuoteForMessage(verb) +
                          " (verbs: create, exec, put, get, destroy, list, doctor, ping, "
                          "workspace_in, collect, diff)"));
    }
    (void)s->End(reply);
  } catch (const std::exception& e) {
    // A malformed request (wrong JSON types) fails alone; the daemon keeps serving.
    (void)s->End(ErrorReply(InvalidArgument(std::string("malformed request: ") + e.what())));
  }
}

vmm::AccelChoice Daemon::Accel(const std::string& image_dir) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (accel_) return *accel_;
  }
  vmm::AccelChoice c;
  if (!opts_.force_accel.empty()) {
    c = {opts_.force_accel, "forced by --accel " + opts_.force_accel};
  } else {
    c = vmm::ProbeAccel(image_dir, opts_.paths.runtime, opts_.qemu);
  }
  LogInfo("daemon", "acceleration: " + c.accel + " (" + c.reason + ")");
  (void)WriteFileAtomic(opts_.paths.state + "/accel.json",
                        Json{{"accel", c.accel}, {"reason", c.reason}}.dump());
  std::lock_guard<std::mutex> lock(mu_);
  if (!accel_) accel_ = c;
  return *accel_;
}

Json Daemon::DoCreate(const Json& req) {
  std::string image_name = req.value("image", "debian-12");
  Status st = ValidateName("image name", image_name);
  if (!st.ok()) return ErrorReply(st);
  int memory = req.value("memory_mib", 512);
  int cpus = req.value("cpus", 1);
  if (memory < kMinMemoryMib || memory > kMaxMemoryMib) {
    return ErrorReply(InvalidArgument("memory must be between " + std::to_string(kMinMemoryMib) +
                                      " and " + std::to_string(kMaxMemoryMib) + " MiB, got " +
                                      std::to_string(memory)));
  }
  if (cpus < 1 || cpus > kMaxCpus) {
    return ErrorReply(InvalidArgument("cpus must be between 1 and " + std::to_string(kMaxCpus) +
                                      ", got " + std::to_string(cpus)));
  }
  auto dir = image::ImageDir(opts_.paths.images, image_name);
  if (!dir.ok()) return ErrorReply(dir.status());
  st = image::VerifyImage(*dir);
  if (!st.ok()) return ErrorReply(st);
  auto manifest_sha = Sha256File(*dir + "/manifest.json");
  if (!manifest_sha.ok()) return ErrorReply(manifest_sha.status());
  vmm::AccelChoice accel = Accel(*dir);

  vmm::VmConfig cfg;
  cfg.id = NewId();
  cfg.image_dir = *dir;
  cfg.vm_dir = opts_.paths.vms() + "/" + cfg.id;
  cfg.memory_mib = memory;
  cfg.cpus = cpus;
  cfg.accel = accel.accel;
  cfg.qemu = opts_.qemu;
  auto vm = vmm::Vm::Boot(cfg, opts_.boot_timeout);
  if (!vm.ok()) {
    return ErrorReply(vm.status().Annotate("boot a " + image_name + " VM"));
  }
  // Recorded only now that the guest agent answered; a pid file lets a later daemon reap it.
  (void)WriteFileAtomic(cfg.vm_dir + "/qemu.pid", std::to_string((*vm)->pid()));
  auto entry = std::make_shared<VmEntry>();
  entry->record.id = cfg.id;
  entry->record.image = image_name;
  entry->record.image_sha256 = *manifest_sha;
  entry->record.state = "running";
  entry->record.pid = (*vm)->pid();
  entry->record.accel = cfg.accel;
  entry->record.memory_mib = memory;
  entry->record.cpus = cpus;
  entry->record.dir = cfg.vm_dir;
  entry->record.created_at = store::NowSeconds();
  double boot_ms = (*vm)->boot_ms();
  entry->vm = std::move(*vm);
  st = store_->InsertVm(entry->record);
  if (!st.ok()) {
    entry->vm->Destroy();
    return ErrorReply(st.Annotate("record the VM"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    vms_[cfg.id] = entry;
  }
  return {{"ok", true},
          {"vm",
           {{"id", cfg.id},
            {"image", image_name},
            {"accel", cfg.accel},
            {"memory_mib", memory},
            {"cpus", cpus},
            {"boot_ms", boot_ms}}}};
}

Result<std::shared_ptr<Daemon::VmEntry>> Daemon::Lookup(const Json& req) {
  RETURN_IF_ERROR(CheckString(req, "vm", true));
  std::string id = req["vm"];
  RETURN_IF_ERROR(ValidateName("VM id", id));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = vms_.find(id);
    if (it != vms_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(auto rec, store_->GetVm(id));
  if (rec) {
    return FailedPrecondition("VM " + id + " is already " + rec->state +
                              (rec->state == "destroyed" ? "" : ": " + rec->note));
  }
  return NotFound("no VM with id " + QuoteForMessage(id));
}

void Daemon::NoteDeath(VmEntry& e) {
  std::string why = e.vm->death_reason();
  std::lock_guard<std::mutex> lock(mu_);
  if (e.record.state != "running" || why.empty()) return;
  e.record.state = "dead";
  e.record.note = why;
  (void)store_->UpdateVmState(e.record.id, "dead", why);
}

Json Daemon::DoDestroy(const Json& req) {
  auto e = Lookup(req);
  if (!e.ok()) return ErrorReply(e.status());
  std::string id = (*e)->record.id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (vms_.erase(id) == 0)
      return ErrorReply(FailedPrecondition("VM " + id + " is already being destroyed"));
  }
  NoteDeath(**e);
  auto report = (*e)->vm->Destroy();
  Json r = report.ToJson();
  (void)store_->UpdateVmState(id, "destroyed", r.dump());
  r["id"] = id;
  return {{"ok", true}, {"report", r}};
}

Json Daemon::DoList(const Json&) {
  Json vms = Json::array();
  std::vector<std::shared_ptr<VmEntry>> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, e] : vms_) entries.push_back(e);
  }
  for (auto& e : entries) {
    if (!e->vm->alive()) NoteDeath(*e);
    std::lock_guard<std::mutex> lock(mu_);
    vms.push_back({{"id", e->record.id},
                   {"image", e->record.image},
                   {"state", e->record.state},
                   {"note", e->record.note},
                   {"accel", e->record.accel},
                   {"memory_mib", e->record.memory_mib},
                   {"cpus", e->record.cpus},
                   {"pid", e->record.pid},
                   {"created_at", e->record.created_at}});
  }
  return {{"ok", true}, {"vms", vms}};
}

Json Daemon::DoDoctor(const Json&) {
  Json images = Json::array();
  auto list = image::ListImages(opts_.paths.images);
  std::string first_valid;
  if (list.ok()) {
    for (const auto& im : *list) {
      images.push_back({{"name", im.name}, {"valid", im.valid}, {"problem", im.problem}});
      if (im.valid && first_valid.empty()) first_valid = im.dir;
    }
  }
  Json accel;
  if (!first_valid.empty()) {
    auto c = Accel(first_valid);
    accel = {{"accel", c.accel}, {"reason", c.reason}};
  } else {
    accel = {{"accel", nullptr},
             {"reason", "no image is built yet; the probe boots an image's kernel"}};
  }
  auto qv = RunCommand({opts_.qemu, "--version"}, std::chrono::seconds(10));
  std::string qemu_version =
      qv.ok() ? qv->output.substr(0, qv->output.find('\n')) : qv.status().message();
  return {{"ok", true},
          {"accel", accel},
          {"qemu", qemu_version},
          {"images", images},
          {"paths",
           {{"socket", opts_.paths.socket()},
            {"state", opts_.paths.state},
            {"images", opts_.paths.images},
            {"runtime", opts_.paths.runtime}}},
          {"daemon_pid", ::getpid()}};
}

void Daemon::DoExec(channel::Stream& client, const Json& req) {
  auto e = Lookup(req);
  if (!e.ok()) {
    (void)client.End(ErrorReply(e.status()));
    return;
  }
  if (!req.contains("argv") || !req["argv"].is_array() || req["argv"].empty()) {
    (void)client.End(ErrorReply(InvalidArgument("'argv' must be a non-empty array of strings")));
    return;
  }
  for (const auto& a : req["argv"]) {
    if (!a.is_string()) {
      (void)client.End(ErrorReply(InvalidArgument("'argv' must contain only strings")));
      return;
    }
  }
  Json env = req.value("env", Json::object());
  if (!env.is_object()) {
    (void)client.End(ErrorReply(InvalidArgument("'env' must be an object of strings")));
    return;
  }
  bool want_stdin = req.value("stdin", false);
  std::string default_cwd = "/root";
  {
    std::lock_guard<std::mutex> lock(mu_);
    if ((*e)->has_workspace) default_cwd = "/workspace";
  }
  Json greq = {{"op", "exec"},
               {"argv", req["argv"]},
               {"env", env},
               {"cwd", req.value("cwd", default_cwd)},
               {"timeout_ms", req.value("timeout_ms", 0)},
               {"stdin", want_stdin}};
  Json result = RunGuestExec(**e, greq, &client, want_stdin, nullptr, nullptr);
  (void)client.End({{"ok", true}, {"result", result}});
}

Json Daemon::RunGuestExec(VmEntry& e, const Json& greq, channel::Stream* client, bool want_stdin,
                          std::string* capture, int64_t* exec_id) {
  store::ExecRecord rec;
  rec.vm_id = e.record.id;
  rec.argv = greq["argv"];
  rec.cwd = greq["cwd"];
  rec.started_at = store::NowSeconds();
  rec.outcome = "running";
  auto id = store_->InsertExec(rec);
  rec.id = id.ok() ? *id : 0;
  if (exec_id) *exec_id = rec.id;

  Json result;
  auto guest = e.vm->Open(greq);
  if (!guest.ok()) {
    NoteDeath(e);
    result = {{"outcome", "channel_lost"}, {"message", guest.status().message()}};
  } else {
    std::thread pump;
    if (want_stdin && client) pump = std::thread([&] { PumpToGuest(*client, **guest); });
    RelayResult r = RelayFromGuest(**guest, client, capture);
    if (pump.joinable()) {
      if (!r.end.is_null() || !r.failure.ok()) (void)(*guest)->Reset("exec finished");
      pump.join();
    }
    rec.stdout_bytes = r.bytes[channel::kChanOut];
    rec.stderr_bytes = r.bytes[channel::kChanErr];
    if (!r.end.is_null()) {
      result = r.end;
    } else if (r.client_gone) {
      result = {{"outcome", "cancelled"}, {"message", "the client disconnected"}};
    } else {
      // The channel closed before an exit event: report that, never an exit code.
      if (!e.vm->alive()) NoteDeath(e);
      std::string why = e.vm->death_reason();
      result = {{"outcome", "channel_lost"},
                {"message", why.empty() ? r.failure.message() : "the guest is gone: " + why}};
    }
  }
  rec.ended_at = store::NowSeconds();
  rec.outcome = result.value("outcome", "error");
  if (rec.outcome == "exited" && result.contains("exit_code"))
    rec.exit_code = result["exit_code"].get<int>();
  if (rec.outcome == "signaled" && result.contains("signal"))
    rec.signal = result["signal"].get<int>();
  rec.error = result.value("message", result.value("error", ""));
  if (rec.id) (void)store_->FinishExec(rec);
  return result;
}

void Daemon::DoPut(channel::Stream& client, const Json& req) {
  auto e = Lookup(req);
  Status st = e.ok() ? CheckString(req, "path", true) : e.status();
  if (st.ok()) st = CheckString(req, "kind", true);
  if (!st.ok()) {
    // Drain the client's upload so it is not left blocked, then refuse.
    DrainInput(client);
    (void)client.End(ErrorReply(st));
    return;
  }
  Json greq = {{"op", "put"},
               {"path", req["path"]},
               {"kind", req["kind"]},
               {"mode", req.value("mode", 0644)},
               {"mtime_ns", req.value("mtime_ns", int64_t{0})},
               {"mkdirs", req.value("mkdirs", false)}};
  auto guest = (*e)->vm->Open(greq);
  if (!guest.ok()) {
    NoteDeath(**e);
    (void)client.End(ErrorReply(guest.status()));
    return;
  }
  std::thread pump([&] { PumpToGuest(client, **guest); });
  RelayResult r = RelayFromGuest(**guest, &client);
  if (r.end.is_null()) (void)(*guest)->Reset("put failed");
  pump.join();
  FinishFileRelay(client, *(*e)->vm, r);
}

void Daemon::DoGet(channel::Stream& client, const Json& req) {
  auto e = Lookup(req);
  Status st = e.ok() ? CheckString(req, "path", true) : e.status();
  if (!st.ok()) {
    (void)client.End(ErrorReply(st));
    return;
  }
  auto guest = (*e)->vm->Open({{"op", "get"}, {"path", req["path"]}});
  if (!guest.ok()) {
    NoteDeath(**e);
    (void)client.End(ErrorReply(guest.status()));
    return;
  }
  RelayResult r = RelayFromGuest(**guest, &client);
  FinishFileRelay(client, *(*e)->vm, r);
}

}  // namespace trybox::daemon
