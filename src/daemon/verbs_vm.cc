#include <unistd.h>

#include "daemon/verbs.h"
#include "image/image.h"
#include "util/version.h"

namespace trybox::daemon {
namespace {

Json CreatedJson(const CreatedVm& c) {
  VmEntry& e = *c.entry;
  const vmm::VmConfig& cfg = e.vm().config();
  store::VmRecord rec = e.record();
  Json egress = EgressPolicyJson(e.egress()->policy()->reach);
  egress["max_tunnels"] = e.egress()->slots.max();
  egress["qemu_netns"] = cfg.netns;
  egress["qemu_uid"] = cfg.qemu_uid ? Json(*cfg.qemu_uid) : Json(nullptr);
  Json created = {{"ok", true},
                  {"vm",
                   {{"id", e.id()},
                    {"image", rec.image},
                    {"accel", cfg.accel},
                    {"memory_mib", rec.memory_mib},
                    {"cpus", rec.cpus},
                    {"boot_ms", c.boot_ms},
                    {"boot_id", e.vm().boot_id()},
                    {"phases_ms", e.vm().phases()},
                    {"start", c.start},
                    {"egress", egress}}}};
  AddPrivilegeFields(created["vm"], e.privileged());
  return created;
}

Json VmJson(const store::VmRecord& r, const store::ExecCount& execs) {
  Json v = {{"id", r.id},
            {"image", r.image},
            {"state", r.state},
            {"note", r.note},
            {"accel", r.accel},
            {"memory_mib", r.memory_mib},
            {"cpus", r.cpus},
            {"pid", r.pid},
            {"created_at", r.created_at},
            {"execs", execs.total},
            {"running_execs", execs.running}};
  AddPrivilegeFields(v, r.privileged);
  return v;
}

Json Doctor(Services& s, bool probe) {
  Json images = Json::array();
  auto list = image::ListImages(s.paths.images);
  std::string first_valid;
  if (list.ok()) {
    for (const auto& im : *list) {
      if (im.valid && first_valid.empty()) first_valid = im.dir;
    }
  }
  Json accel = {{"accel", nullptr},
                {"reason", "no image is built yet; the probe boots an image's kernel"}};
  if (!first_valid.empty()) {
    auto c = probe ? s.launcher.Reprobe(first_valid) : s.launcher.Accel(first_valid);
    accel = {{"accel", c.accel}, {"reason", c.reason}};
  } else if (probe) {
    return ErrorReply(
        FailedPrecondition("no image is built yet; the probe boots an image's kernel"));
  }
  if (list.ok()) {
    for (const auto& im : *list) {
      Json entry = {{"name", im.name}, {"valid", im.valid}, {"problem", im.problem}};
      if (im.valid && accel["accel"].is_string()) {
        entry["template"] = s.launcher.DescribeTemplate(im.name, im.dir, accel["accel"]);
      }
      images.push_back(entry);
    }
  }
  auto qv = vmm::QemuVersion(s.qemu);  // the same line the template key uses
  // VMs the heartbeat finds unwell (docs/reliability.md): unresponsive, paused, dead.
  Json unwell = Json::array();
  for (const auto& v : s.vms.List()) {
    if (v.state != "running") {
      unwell.push_back({{"id", v.id}, {"state", v.state}, {"note", v.note}, {"pid", v.pid}});
    }
  }
  Json memory = nullptr;
  if (const Admission* adm = s.vms.admission()) {
    Admission::Memory m = adm->Describe();
    int64_t promised = 0;
    for (const auto& v : s.vms.List()) promised += v.memory_mib;
    memory = {{"total_mib", m.total_mib},        {"total_from_setting", m.total_from_setting},
              {"reserve_mib", m.reserve_mib},    {"overcommit", m.overcommit},
              {"budget_mib", m.budget_mib},      {"promised_mib", promised + m.booting_mib},
              {"available_mib", m.available_mib}};
  }
  return {{"ok", true},
          {"memory", memory},
          {"unwell_vms", unwell},
          {"accel", accel},
          {"qemu", qv.ok() ? *qv : qv.status().message()},
          {"images", images},
          {"spares", s.launcher.SpareCounts()},
          {"spare_pool", s.launcher.DescribeSpares()},
          {"paths",
           {{"socket", s.paths.socket()},
            {"state", s.paths.state},
            {"images", s.paths.images},
            {"runtime", s.paths.runtime}}},
          {"daemon_pid", ::getpid()},
          {"store", StoreHealthJson(s.records.Health())},
          {"version", Version()}};
}

}  // namespace

void AddVmVerbs(VerbTable& t, Services& s) {
  t.AddStreaming("create", [&s](channel::Stream& client, Json& j, Connection& conn) {
    auto reply = [&]() -> Json {
      auto req = ParseCreate(j);
      WipeSecretValues(&j);
      if (!req.ok()) return ErrorReply(req.status());
      // Steps that may take seconds are announced as they start (the CLI prints those that
      // outlast a second).
      Progress progress = [&client](const std::string& stage, const std::string& message) {
        (void)client.SendEvent({{"progress", {{"stage", stage}, {"message", message}}}});
      };
      auto c = s.vms.Create(*req, progress);
      if (!c.ok()) return ErrorReply(c.status(), AdmissionErrorKind(c.status()));
      if (req->ephemeral && !conn.AddEphemeral(c->entry->id())) {
        // The client left while the VM booted: nobody will ever use it.
        (void)s.vms.Destroy(c->entry->id());
        return ErrorReply(Unavailable("the client left while the VM booted; it was destroyed"));
      }
      return CreatedJson(*c);
    }();
    (void)client.End(reply);
  });
  t.AddStreaming("exec", [&s](channel::Stream& client, const Json& j, Connection&) {
    auto req = ParseExec(j);
    auto vm = req.ok() ? s.vms.Get(req->vm) : Result<std::shared_ptr<VmEntry>>(req.status());
    if (!vm.ok()) {
      (void)client.End(ErrorReply(vm.status()));
      return;
    }
    ExecSpec spec = s.vms.SpecFor(**vm, *req);
    if (req->detach) {
      auto d = s.vms.ExecDetached(*vm, spec);
      if (!d.ok()) {
        (void)client.End(ErrorReply(d.status()));
        return;
      }
      Json reply = {{"ok", true}, {"exec_id", d->exec_id}};
      if (d->ended) reply["result"] = d->ended->ToJson();
      AddPrivilegeFields(reply, (*vm)->privileged());
      (void)client.End(reply);
      return;
    }
    ExecIo io;
    io.client = &client;
    int64_t exec_id = 0;
    auto result = s.vms.Exec(**vm, spec, io, &exec_id);
    if (!result.ok()) {
      (void)client.End(ErrorReply(result.status()));
      return;
    }
    Json reply = {{"ok", true}, {"result", result->ToJson()}};
    if (exec_id > 0) reply["exec_id"] = exec_id;
    AddPrivilegeFields(reply, (*vm)->privileged());
    (void)client.End(reply);
  });
  t.AddStreaming("put", [&s](channel::Stream& client, const Json& j, Connection&) {
    auto req = ParsePut(j);
    auto vm = req.ok() ? s.vms.Get(req->vm) : Result<std::shared_ptr<VmEntry>>(req.status());
    if (!vm.ok()) {
      // Drain the client's upload so it is not left blocked, then refuse.
      DrainInput(client);
      (void)client.End(ErrorReply(vm.status()));
      return;
    }
    Json greq = {{"op", "put"},
                 {"path", req->path},
                 {"kind", req->kind},
                 {"mode", req->mode},
                 {"mkdirs", req->mkdirs}};
    if (req->mtime_ns) greq["mtime_ns"] = *req->mtime_ns;
    RelayPut(**vm, greq, client);
    s.vms.NoteDeath(**vm);
  });
  t.AddStreaming("get", [&s](channel::Stream& client, const Json& j, Connection&) {
    auto req = ParseGet(j);
    auto vm = req.ok() ? s.vms.Get(req->vm) : Result<std::shared_ptr<VmEntry>>(req.status());
    if (!vm.ok()) {
      (void)client.End(ErrorReply(vm.status()));
      return;
    }
    RelayGet(**vm, {{"op", "get"}, {"path", req->path}}, client);
    s.vms.NoteDeath(**vm);
  });
  t.AddUnary("destroy", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseVmRequest(j);
    if (!req.ok()) return ErrorReply(req.status());
    auto report = s.vms.Destroy(req->vm);
    if (!report.ok()) return ErrorReply(report.status());
    Json r = report->ToJson();
    r["id"] = req->vm;
    return {{"ok", true}, {"report", r}};
  });
  t.AddUnary("list", [&s](const Json&, Connection&) -> Json {
    Json vms = Json::array();
    auto counts = s.vms.ExecCounts();
    for (const auto& r : s.vms.List()) {
      Json v = VmJson(r, counts[r.id]);
      if (auto e = s.vms.Get(r.id); e.ok())
        v["egress"] = EgressPolicyJson((*e)->egress()->policy()->reach);
      vms.push_back(std::move(v));
    }
    return {{"ok", true}, {"vms", vms}};
  });
  t.AddUnary("doctor", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseDoctor(j);
    if (!req.ok()) return ErrorReply(req.status());
    return Doctor(s, req->probe);
  });
  t.AddUnary("audit", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseAudit(j);
    if (!req.ok()) return ErrorReply(req.status());
    auto page = s.egress.Audit(req->vm, req->limit, req->before_id);
    if (!page.ok()) return ErrorReply(page.status());
    Json rows = Json::array();
    for (const auto& r : page->rows) rows.push_back(EgressJson(r));
    return {{"ok", true},
            {"egress", rows},
            {"next_before_id", page->next_before_id ? Json(*page->next_before_id) : Json(nullptr)}};
  });
  t.AddUnary("egress", [&s](const Json& j, Connection& conn) -> Json {
    auto req = ParseEgress(j);
    if (!req.ok()) return ErrorReply(req.status());
    EgressChange c{req->allow, req->deny, "uid " + std::to_string(conn.uid())};
    auto reach = s.vms.ChangeEgress(req->vm, c);
    if (!reach.ok()) return ErrorReply(reach.status());
    return {{"ok", true}, {"egress", EgressPolicyJson(*reach)}};
  });
  t.AddUnary("ping", [](const Json&, Connection&) -> Json {
    return {{"ok", true}, {"pid", ::getpid()}};
  });
}

}  // namespace trybox::daemon
