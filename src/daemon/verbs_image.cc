// The image verbs (docs/protocol/daemon.md): commit, image_ls, image_rm, image_prune. Their
// parsers, the ImageService calls, and their result writers.
#include <unistd.h>

#include "daemon/image_service.h"
#include "daemon/verbs.h"
#include "util/fd.h"

namespace trybox::daemon {
namespace {

Json Ref(const image::ImageRef& r) {
  return {{"name", r.name}, {"manifest_sha256", r.manifest_sha256}};
}

Json ImageJson(const ImageView& v, const Json& template_state) {
  const image::ImageEntry& e = v.entry;
  Json j = {{"name", e.name}, {"valid", e.valid}};
  if (!e.valid) {
    j["problem"] = e.problem;
    return j;
  }
  const image::Manifest& m = e.manifest;
  const bool derived = m.format == image::kDerivedManifestFormat;
  Json chain = Json::array();
  for (const auto& l : m.layers) chain.push_back(l.image);
  j.update({{"format", m.format},
            {"created", m.created},
            {"base", derived ? m.base.name : e.name},
            {"parent", derived ? Json(m.parent.name) : Json(nullptr)},
            {"chain", chain},
            {"layers", m.layers.size()},
            {"own_bytes", v.own_bytes},
            {"total_bytes", v.total_bytes},
            {"env", m.env},
            {"template", template_state},
            {"in_use", v.in_use},
            {"derived", v.derived}});
  if (derived) j["vm"] = m.vm;
  return j;
}

}  // namespace

Json ImageListJson(const std::vector<ImageView>& list, const std::string& state_dir) {
  // The template state needs the accelerator: the one the daemon chose and kept
  // (vmm/accel.h); before any choice it is unknown, and listing never probes.
  auto kept = ReadFileToString(state_dir + "/accel.json");
  Json a = kept.ok() ? Json::parse(*kept, nullptr, false) : Json();
  const std::string accel = a.is_object() && a.contains("accel") && a["accel"].is_string()
                                ? a["accel"].get<std::string>()
                                : "";
  Json out = Json::array();
  for (const auto& v : list) {
    Json tpl = v.entry.valid && !accel.empty()
                   ? vmm::DescribeImageTemplate(state_dir + "/templates", v.entry.name, v.entry.dir,
                                                accel, "qemu-system-x86_64", ::geteuid() == 0)
                   : Json{{"state", "unknown"},
                          {"reason", v.entry.valid ? "tryboxd has not chosen an accelerator yet"
                                                   : "the image is not valid"}};
    out.push_back(ImageJson(v, tpl));
  }
  return out;
}

void AddImageVerbs(VerbTable& t, ImageService& images, Services& s) {
  t.AddStreaming("commit", [&images](channel::Stream& client, const Json& j, Connection&) {
    auto reply = [&]() -> Json {
      auto req = ParseCommit(j);
      if (!req.ok()) return ErrorReply(req.status());
      Progress progress = [&client](const std::string& stage, const std::string& message) {
        (void)client.SendEvent({{"progress", {{"stage", stage}, {"message", message}}}});
      };
      ImageError error;
      auto c = images.Commit(*req, progress, &error);
      if (!c.ok()) return ErrorReply(c.status(), error.kind);
      const image::Manifest& m = c->manifest;
      return {{"ok", true},
              {"image",
               {{"name", m.name},
                {"parent", Ref(m.parent)},
                {"base", Ref(m.base)},
                {"vm", m.vm},
                {"layer", m.layers.back().part},
                {"layer_bytes", c->layer_bytes},
                {"created", m.created},
                {"manifest_sha256", c->manifest_sha256},
                {"replaced", c->replaced}}}};
    }();
    (void)client.End(reply);
  });
  t.AddUnary("image_ls", [&images, &s](const Json&, Connection&) -> Json {
    auto list = images.List();
    if (!list.ok()) return ErrorReply(list.status());
    return {{"ok", true},
            {"images", ImageListJson(*list, s.paths.state)},
            {"images_dir", s.paths.images}};
  });
  t.AddUnary("image_rm", [&images](const Json& j, Connection&) -> Json {
    auto req = ParseImageName(j);
    if (!req.ok()) return ErrorReply(req.status());
    ImageError error;
    auto r = images.Remove(req->name, &error);
    if (!r.ok()) return ErrorReply(r.status(), error.kind);
    return {{"ok", true},
            {"removed", {{"name", r->name}, {"bytes", r->bytes}, {"templates", r->templates}}}};
  });
  t.AddUnary("image_prune", [&images](const Json&, Connection&) -> Json {
    auto freed = images.Prune();
    if (!freed.ok()) return ErrorReply(freed.status());
    Json rows = Json::array();
    uint64_t total = 0;
    for (const auto& f : *freed) {
      rows.push_back({{"what", f.what}, {"path", f.path}, {"bytes", f.bytes}});
      total += f.bytes;
    }
    return {{"ok", true}, {"freed", rows}, {"bytes", total}};
  });
}

}  // namespace trybox::daemon
