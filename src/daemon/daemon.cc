#include "daemon/daemon.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
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

constexpr int kMinMemoryMib = 128;
constexpr int kMaxMemoryMib = 65536;
constexpr int kMaxCpus = 64;
constexpr auto kRefillDelay = std::chrono::milliseconds(1000);

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
// Watches an exec's client stream until `done`: forwards its input to the guest when
// `forward` (stdin), and resets the guest stream, which kills the command's process tree,
// when the client resets the request or its connection dies. Sets `*cancelled` then.
// Polls `done` every 100 ms: nothing else wakes a Next() on the client's stream when the
// command ends first and the client has not closed its input.
void WatchExecClient(channel::Stream& client, channel::Stream& guest, bool forward,
                     const std::atomic<bool>& done, std::atomic<bool>* cancelled) {
  bool forwarding = forward;
  while (!done) {
    auto m = client.Next(Clock::now() + std::chrono::milliseconds(100));
    if (!m.ok() && m.status().code() == Code::kDeadlineExceeded) continue;
    if (!m.ok() || m->kind == Kind::kReset || m->kind == Kind::kEnd) {
      if (!done) {
        *cancelled = true;
        (void)guest.Reset("the client cancelled the request");
      }
      return;
    }
    if (m->kind == Kind::kData && forwarding) {
      if (!guest.Write(channel::kChanIn, m->data).ok()) forwarding = false;
    } else if (m->kind == Kind::kEof && forwarding) {
      (void)guest.CloseWrite(channel::kChanIn);
      forwarding = false;
    }
  }
}

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

namespace {

// The audit record of egress decisions is the store's egress table.
class StoreAudit : public egress::AuditSink {
 public:
  explicit StoreAudit(store::Store& store) : store_(store) {}

  int64_t Decided(const egress::Decision& d) override {
    LogInfo("egress", "vm " + d.vm_id + " " + d.method + " " + d.host + ":" +
                          std::to_string(d.port) + " -> " + d.verdict + ": " + d.reason);
    auto id = store_.InsertEgress(Record(d));
    if (!id.ok()) LogError("egress", "audit insert failed: " + id.status().message());
    return id.ok() ? *id : -1;
  }

  void Closed(int64_t id, const egress::Decision& d) override {
    if (id < 0) return;
    store::EgressRecord r = Record(d);
    r.id = id;
    r.ended_at = store::NowSeconds();
    Status st = store_.FinishEgress(r);
    if (!st.ok()) LogError("egress", "audit update failed: " + st.message());
  }

 private:
  static store::EgressRecord Record(const egress::Decision& d) {
    store::EgressRecord r;
    r.vm_id = d.vm_id;
    r.started_at = d.started_at;
    r.method = d.method;
    r.host = d.host;
    r.port = d.port;
    r.address = d.address;
    r.verdict = d.verdict;
    r.reason = d.reason;
    r.override_used = d.override_used;
    r.status = d.status;
    r.bytes_up = d.bytes_up;
    r.bytes_down = d.bytes_down;
    r.duration_ms = d.duration_ms;
    return r;
  }

  store::Store& store_;
};

Json EgressJson(const store::EgressRecord& e) {
  return {{"id", e.id},
          {"vm", e.vm_id},
          {"started_at", e.started_at},
          {"ended_at", e.ended_at},
          {"method", e.method},
          {"host", e.host},
          {"port", e.port},
          {"address", e.address},
          {"verdict", e.verdict},
          {"reason", e.reason},
          {"override", e.override_used},
          {"status", e.status},
          {"bytes_up", e.bytes_up},
          {"bytes_down", e.bytes_down},
          {"duration_ms", e.duration_ms}};
}

}  // namespace

Json ErrorReply(const Status& st) {
  return {{"ok", false}, {"error", {{"code", CodeName(st.code())}, {"message", st.message()}}}};
}

Daemon::~Daemon() {
  std::map<std::string, std::vector<Spare>> spares;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    tasks_cv_.notify_all();
    reaper_cv_.notify_all();
  }
  if (background_.joinable()) background_.join();
  if (run_reaper_.joinable()) run_reaper_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    spares.swap(spares_);
  }
  for (auto& [dir, list] : spares) {
    for (auto& s : list) s.vm->Destroy();
  }
  std::map<std::string, std::shared_ptr<VmEntry>> vms;
  {
    std::lock_guard<std::mutex> lock(mu_);
    vms.swap(vms_);
  }
  for (auto& [id, e] : vms) {
    auto report = e->vm->Destroy();
    if (store_) (void)store_->UpdateVmState(id, "destroyed", report.ToJson().dump());
  }
  // Egress handlers use the store and the resolver; their streams died with the VMs, so
  // they end promptly (an upstream dial is bounded by connect_timeout).
  auto give_up = Clock::now() + egress_.connect_timeout + std::chrono::seconds(5);
  while (egress_in_flight_ > 0 && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Status Daemon::Init() {
  const Paths& p = opts_.paths;
  for (const auto& d : {p.state, p.runtime, p.vms()}) RETURN_IF_ERROR(MakeDirs(d, 0700));
  ASSIGN_OR_RETURN(lock_fd_, OpenFile(p.runtime + "/tryboxd.lock", O_RDWR | O_CREAT, 0600));
  if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    return Status(Code::kAlreadyExists, "another tryboxd is running for " + p.runtime);
  }
  ASSIGN_OR_RETURN(egress_, egress::LoadConfig(p.config + "/egress.json"));
  if (egress_.resolve.is_null()) {
    resolver_ = std::make_unique<egress::SystemResolver>();
  } else {
    ASSIGN_OR_RETURN(resolver_, egress::MapResolver::FromJson(egress_.resolve));
    LogInfo("daemon", "egress resolves names through the configured map, never DNS");
  }
  for (const auto& o : egress_.internal_allow) {
    LogWarn("daemon", "egress may reach internal address " + o.text + " (internal_allow)");
  }
  ASSIGN_OR_RETURN(store_, store::Store::Open(p.db()));
  templates_ = std::make_unique<vmm::TemplateStore>(p.templates(), p.vms(), opts_.boot_timeout);
  audit_ = std::make_unique<StoreAudit>(*store_);
  ReapLeftovers();
  background_ = std::thread([this] { RunBackground(); });
  run_reaper_ = std::thread([this] { ExpireIdleRuns(); });
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
  // Half-built templates of a daemon that died mid-build.
  d = ::opendir(opts_.paths.templates().c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(".building-", 0) != 0) continue;
    (void)RemoveTree(opts_.paths.templates() + "/" + name);
    LogInfo("daemon", "removed half-built template " + name);
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
    tasks_cv_.notify_all();
    reaper_cv_.notify_all();
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
    if (verb == "agent") return DoAgent(*s, req);
    if (verb == "agent_answer") return DoAgentContinue(*s, req, /*answer=*/true);
    if (verb == "agent_resume") return DoAgentContinue(*s, req, /*answer=*/false);
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
    } else if (verb == "audit") {
      reply = DoAudit(req);
    } else if (verb == "collect") {
      reply = DoCollect(req);
    } else if (verb == "diff") {
      reply = DoDiff(req);
    } else if (verb == "agent_show") {
      reply = DoAgentShow(req);
    } else if (verb == "ping") {
      reply = {{"ok", true}, {"pid", ::getpid()}};
    } else {
      reply = ErrorReply(InvalidArgument(
          "unknown verb " + QuoteForMessage(verb) +
          " (verbs: create, exec, put, get, destroy, list, doctor, audit, ping, "
          "workspace_in, collect, diff, agent, agent_answer, agent_resume, agent_show)"));
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
  int memory = req.value("memory_mib", vmm::kDefaultMemoryMib);
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
  auto allow = EgressAllowList(req);
  if (!allow.ok()) return ErrorReply(allow.status());
  vmm::AccelChoice accel = Accel(*dir);

  auto entry = std::make_shared<VmEntry>();
  entry->egress = std::make_shared<EgressVm>(egress_.max_tunnels_per_vm);
  entry->egress->policy.allow = *allow;
  entry->egress->policy.overrides = egress_.internal_allow;
  entry->egress->policy.head_timeout = egress_.head_timeout;
  entry->egress->policy.connect_timeout = egress_.connect_timeout;

  vmm::VmConfig cfg;
  cfg.id = NewId();
  cfg.image_dir = *dir;
  cfg.vm_dir = opts_.paths.vms() + "/" + cfg.id;
  cfg.memory_mib = memory;
  cfg.cpus = cpus;
  cfg.accel = accel.accel;
  cfg.qemu = opts_.qemu;
  cfg.netns = egress_.qemu_netns;
  vmm::TemplateShape shape{image_name, *dir,        *manifest_sha, memory,
                           cpus,       accel.accel, opts_.qemu,    QemuOwnUid()};
  Json start;
  auto vm = StartVm(cfg, shape, req.value("cold", false), &entry->qemu_uid, &start);
  if (!vm.ok()) {
    ReleaseQemuUid(entry->qemu_uid);
    return ErrorReply(vm.status().Annotate("boot a " + image_name + " VM"));
  }
  // A spare clone comes with its own id, directory and uid.
  cfg = (*vm)->config();
  (*vm)->SetGuestOpen(
      [this, id = cfg.id, eg = entry->egress](std::shared_ptr<channel::Stream> s, Json greq) {
        ServeGuestStream(id, *eg, *s, greq);
      });
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
    ReleaseQemuUid(entry->qemu_uid);
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
            {"boot_ms", boot_ms},
            {"boot_id", entry->vm->boot_id()},
            {"phases_ms", entry->vm->phases()},
            {"start", start},
            {"egress",
             {{"allow", allow->ToStrings()},
              {"max_tunnels", egress_.max_tunnels_per_vm},
              {"qemu_netns", cfg.netns},
              {"qemu_uid", cfg.qemu_uid ? Json(*cfg.qemu_uid) : Json(nullptr)}}}}}};
}

Result<egress::AllowList> Daemon::EgressAllowList(const Json& req) {
  std::vector<std::string> entries;
  for (const char* field : {"allow", "profiles"}) {
    if (!req.contains(field)) continue;
    const Json& list = req[field];
    if (!list.is_array()) {
      return InvalidArgument(std::string("'") + field + "' must be an array of strings");
    }
    for (const auto& v : list) {
      if (!v.is_string()) {
        return InvalidArgument(std::string("'") + field + "' must be an array of strings");
      }
      std::string text = v.get<std::string>();
      if (std::string(field) == "allow") {
        entries.push_back(text);
        continue;
      }
      auto p = egress_.profiles.find(text);
      if (p == egress_.profiles.end()) {
        return NotFound("no egress profile " + QuoteForMessage(text) +
                        " in the config file (egress.json)");
      }
      entries.insert(entries.end(), p->second.begin(), p->second.end());
    }
  }
  return egress::AllowList::Parse(entries);
}

void Daemon::ServeGuestStream(const std::string& vm_id, EgressVm& eg, channel::Stream& s,
                              const Json& req) {
  ++egress_in_flight_;
  ++eg.streams;
  struct Done {
    std::atomic<int>& a;
    std::atomic<int>& b;
    ~Done() {
      --b;
      --a;
    }
  } done{egress_in_flight_, eg.streams};
  // Undecided connections hold a thread each; beyond four times the tunnel cap they are
  // refused before their request head is even read.
  if (eg.streams > 4 * eg.slots.max()) {
    egress::Decision d;
    d.vm_id = vm_id;
    d.started_at = store::NowSeconds();
    d.verdict = "refused";
    d.status = 503;
    d.reason = "too many open egress connections for this VM (" +
               std::to_string(4 * eg.slots.max()) + ", undecided ones included)";
    audit_->Closed(audit_->Decided(d), d);
    egress::StreamClient client(s);
    (void)client.Write(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: "
        "close\r\nX-Trybox-Reason: " +
        d.reason + "\r\n\r\n");
    (void)client.CloseWrite();
    (void)s.End({{"ok", true}, {"verdict", d.verdict}, {"status", d.status}});
    return;
  }
  if (req.value("op", "") != "egress") {
    // The guest is untrusted: it may open egress streams and nothing else.
    (void)s.End(
        {{"ok", false}, {"error", "bad_request"}, {"message", "the host serves only egress"}});
    return;
  }
  egress::StreamClient client(s);
  egress::Decision d = egress::ServeConnection(
      client, {&eg.policy, resolver_.get(), &eg.slots, audit_.get(), vm_id});
  (void)s.End({{"ok", true},
               {"verdict", d.verdict},
               {"status", d.status},
               {"bytes_up", d.bytes_up},
               {"bytes_down", d.bytes_down}});
}

bool Daemon::QemuOwnUid() const { return ::geteuid() == 0 && egress_.qemu_drop_uid; }

Result<Daemon::UidLease> Daemon::AllocateQemuUid() {
  UidLease lease;
  if (!QemuOwnUid()) return lease;
  // Leases live in a root-only directory; a flock is held for the VM's life and dies with
  // the daemon, so two daemons on one host never give their QEMUs the same uid.
  const std::string dir = "/run/trybox-qemu-uids";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError("mkdir " + dir);
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t i = 0; i < 65536; ++i) {
    uid_t uid = egress_.qemu_uid_base + i;
    if (qemu_uids_.count(uid)) continue;
    std::string path = dir + "/" + std::to_string(uid);
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoError("open " + path);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;  // another daemon's VM
    qemu_uids_.insert(uid);
    lease.uid = uid;
    lease.lock = std::move(fd);
    return lease;
  }
  return ResourceExhausted("no free uid for QEMU in 65536 from the configured base");
}

void Daemon::ReleaseQemuUid(UidLease& lease) {
  if (!lease.uid) return;
  std::lock_guard<std::mutex> lock(mu_);
  qemu_uids_.erase(*lease.uid);
  lease.uid.reset();
  lease.lock.Reset();
}

Json Daemon::DoAudit(const Json& req) {
  std::string vm;
  if (req.contains("vm")) {
    Status st = CheckString(req, "vm", false);
    if (!st.ok()) return ErrorReply(st);
    vm = req["vm"];
    st = ValidateName("VM id", vm);
    if (!st.ok()) return ErrorReply(st);
  }
  int64_t limit = req.value("limit", int64_t{1000});
  if (limit < 1) return ErrorReply(InvalidArgument("'limit' must be at least 1"));
  auto rows = store_->ListEgress(vm, limit);
  if (!rows.ok()) return ErrorReply(rows.status());
  Json out = Json::array();
  for (const auto& r : *rows) out.push_back(EgressJson(r));
  return {{"ok", true}, {"egress", out}};
}

Result<std::unique_ptr<vmm::Vm>> Daemon::StartVm(vmm::VmConfig cfg, const vmm::TemplateShape& shape,
                                                 bool cold, UidLease* lease, Json* start) {
  if (!cold) {
    if (auto spare = TakeSpare(shape, lease)) {
      Status st = spare->Identify(Clock::now() + opts_.boot_timeout);
      if (st.ok()) {
        *start = {{"mode", "restored"}, {"spare", true}};
        RefillLater(shape);
        return spare;
      }
      LogWarn("daemon", "a spare clone failed its identity; restoring another: " + st.message());
      spare->Destroy();
      ReleaseQemuUid(*lease);
    }
  }
  ASSIGN_OR_RETURN(*lease, AllocateQemuUid());
  cfg.qemu_uid = lease->uid;
  if (cold) {
    *start = {{"mode", "cold"}, {"note", "a full boot was asked for (--cold)"}};
    return vmm::Vm::Boot(cfg, opts_.boot_timeout);
  }
  auto tpl = GetTemplate(shape);
  if (!tpl.ok()) {
    // No template means no restore, not no VM: the cold boot may still work.
    std::string why = tpl.status().message();
    *start = {{"mode", "cold"},
              {"note",
               "no template could be built (" + why.substr(0, why.find('\n')) + "); booted cold"}};
    LogWarn("daemon", start->value("note", ""));
    return vmm::Vm::Boot(cfg, opts_.boot_timeout);
  }
  Json template_info = {{"built", tpl->built}};
  if (tpl->built) {
    template_info["why"] = tpl->built_why;
    template_info["build_ms"] = tpl->build_ms;
  }
  vmm::VmConfig restore = cfg;
  restore.mode = vmm::StartMode::kRestore;
  restore.template_dir = tpl->dir;
  restore.memory_fd = tpl->memory_fd;
  auto vm = vmm::Vm::Restore(restore, opts_.boot_timeout);
  tpl->hold.unlock();
  if (vm.ok()) {
    *start = {{"mode", "restored"}, {"spare", false}, {"template", template_info}};
    RefillLater(shape);
    return vm;
  }
  std::string why = vm.status().message();
  why = why.substr(0, why.find('\n'));
  templates_->Discard(shape, "restore failed: " + why);
  RebuildLater(shape);
  *start = {{"mode", "cold"},
            {"note", "the template failed to restore (" + why +
                         "); it was discarded and is being rebuilt; this VM booted cold"}};
  LogWarn("daemon", start->value("note", ""));
  return vmm::Vm::Boot(cfg, opts_.boot_timeout);
}

Result<vmm::TemplateStore::Lease> Daemon::GetTemplate(const vmm::TemplateShape& shape) {
  ASSIGN_OR_RETURN(UidLease uid, AllocateQemuUid());
  vmm::TemplateStore::Sandbox sandbox{egress_.qemu_netns, uid.uid};
  auto lease = templates_->Get(shape, sandbox);
  ReleaseQemuUid(uid);  // the template VM, if one was booted, is gone
  return lease;
}

void Daemon::Enqueue(const std::string& task, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || !queued_.insert(task).second) return;
  tasks_.emplace_back(task, std::move(fn));
  tasks_cv_.notify_one();
}

void Daemon::RunBackground() {
  for (;;) {
    std::pair<std::string, std::function<void()>> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      tasks_cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (stopping_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task.second();
    std::lock_guard<std::mutex> lock(mu_);
    queued_.erase(task.first);
  }
}

void Daemon::RebuildLater(const vmm::TemplateShape& shape) {
  Enqueue("rebuild " + templates_->DirFor(shape), [this, shape] {
    auto lease = GetTemplate(shape);
    if (!lease.ok()) LogWarn("daemon", "template rebuild failed: " + lease.status().message());
  });
  RefillLater(shape);
}

void Daemon::RefillLater(const vmm::TemplateShape& shape) {
  if (opts_.spares <= 0) return;
  const std::string dir = templates_->DirFor(shape);
  // The create that just took a spare is about to run its caller's first commands;
  // restoring the next spare at the same moment would take a core from them.
  auto not_before = Clock::now() + kRefillDelay;
  Enqueue("refill " + dir, [this, shape, dir, not_before] {
    {
      std::unique_lock<std::mutex> lock(mu_);
      tasks_cv_.wait_until(lock, not_before, [&] { return stopping_; });
    }
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_ || static_cast<int>(spares_[dir].size()) >= opts_.spares) return;
      }
      auto key = vmm::ComputeTemplateKey(shape);
      auto lease = GetTemplate(shape);
      auto uid = AllocateQemuUid();
      if (!key.ok() || !lease.ok() || !uid.ok()) return;
      vmm::VmConfig cfg;
      cfg.id = NewId();
      cfg.image_dir = shape.image_dir;
      cfg.vm_dir = opts_.paths.vms() + "/" + cfg.id;
      cfg.memory_mib = shape.memory_mib;
      cfg.cpus = shape.cpus;
      cfg.accel = shape.accel;
      cfg.qemu = shape.qemu;
      cfg.mode = vmm::StartMode::kRestore;
      cfg.template_dir = lease->dir;
      cfg.memory_fd = lease->memory_fd;
      cfg.netns = egress_.qemu_netns;
      cfg.qemu_uid = uid->uid;
      auto vm = vmm::Vm::Restore(cfg, opts_.boot_timeout, /*identify=*/false);
      lease->hold.unlock();
      Status st = vm.ok() ? (*vm)->Warm(Clock::now() + opts_.boot_timeout) : vm.status();
      if (!st.ok()) {
        LogWarn("daemon", "could not prepare a spare clone: " + st.message());
        ReleaseQemuUid(*uid);
        return;
      }
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) {
        lock.unlock();
        (*vm)->Destroy();
        ReleaseQemuUid(*uid);
        return;
      }
      spares_[dir].push_back({std::move(*vm), key->hash, std::move(*uid)});
    }
  });
}

std::unique_ptr<vmm::Vm> Daemon::TakeSpare(const vmm::TemplateShape& shape, UidLease* lease) {
  auto key = vmm::ComputeTemplateKey(shape);
  if (!key.ok()) return nullptr;
  std::vector<Spare> stale;
  std::unique_ptr<vmm::Vm> found;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = spares_[templates_->DirFor(shape)];
    while (!list.empty() && !found) {
      Spare s = std::move(list.back());
      list.pop_back();
      // A spare of an older template (the image or QEMU changed since) is not this shape.
      if (s.key == key->hash && s.vm->alive()) {
        found = std::move(s.vm);
        *lease = std::move(s.qemu_uid);
      } else {
        stale.push_back(std::move(s));
      }
    }
  }
  for (auto& s : stale) {
    s.vm->Destroy();
    ReleaseQemuUid(s.qemu_uid);
  }
  return found;
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
  ReleaseQemuUid((*e)->qemu_uid);
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
      if (im.valid && first_valid.empty()) first_valid = im.dir;
    }
  }
  Json accel = {{"accel", nullptr},
                {"reason", "no image is built yet; the probe boots an image's kernel"}};
  if (!first_valid.empty()) {
    auto c = Accel(first_valid);
    accel = {{"accel", c.accel}, {"reason", c.reason}};
  }
  for (const auto& im : list.ok() ? *list : std::remove_reference_t<decltype(*list)>{}) {
    Json entry = {{"name", im.name}, {"valid", im.valid}, {"problem", im.problem}};
    if (im.valid && accel["accel"].is_string()) {
      entry["template"] = vmm::DescribeImageTemplate(opts_.paths.templates(), im.name, im.dir,
                                                     accel["accel"], opts_.qemu, QemuOwnUid());
    }
    images.push_back(entry);
  }
  Json spares = Json::object();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [dir, list] : spares_) {
      spares[dir.substr(dir.rfind('/') + 1)] = list.size();
    }
  }
  auto qv = vmm::QemuVersion(opts_.qemu);  // the same line the template key uses
  std::string qemu_version = qv.ok() ? *qv : qv.status().message();
  return {{"ok", true},
          {"accel", accel},
          {"qemu", qemu_version},
          {"images", images},
          {"spares", spares},
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
    std::atomic<bool> done{false}, cancelled{false};
    std::thread watch;
    if (client) {
      watch = std::thread([&] { WatchExecClient(*client, **guest, want_stdin, done, &cancelled); });
    }
    RelayResult r = RelayFromGuest(**guest, client, capture);
    done = true;
    if (watch.joinable()) {
      // A watcher blocked writing input to a guest stream that has ended is released. Only
      // then: a reset kills what the command left running in the background.
      if (want_stdin && (!r.end.is_null() || !r.failure.ok())) {
        (void)(*guest)->Reset("exec finished");
      }
      watch.join();
    }
    if (cancelled) r.client_gone = true;
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
