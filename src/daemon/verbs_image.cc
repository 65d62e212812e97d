// The image verbs (docs/protocol/daemon.md): commit, image_ls, image_rm, image_rm_template,
// image_prune. Their parsers, the ImageService calls, and their result writers.
#include "daemon/image_service.h"
#include "daemon/verbs.h"

namespace trybox::daemon {
namespace {

Json Ref(const image::ImageRef& r) {
  return {{"name", r.name}, {"manifest_sha256", r.manifest_sha256}};
}

}  // namespace

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
  t.AddUnary("image_rm_template", [&images](const Json& j, Connection&) -> Json {
    auto req = ParseImageName(j);
    if (!req.ok()) return ErrorReply(req.status());
    return {{"ok", true}, {"removed", images.RemoveTemplates(req->name)}};
  });
  t.AddUnary("image_prune", [&images](const Json& j, Connection&) -> Json {
    PruneOptions opts;
    const std::pair<const char*, bool*> flags[] = {{"dry_run", &opts.dry_run},
                                                   {"all", &opts.rootfs_cache}};
    for (auto [key, flag] : flags) {
      if (!j.contains(key)) continue;
      if (!j[key].is_boolean())
        return ErrorReply(InvalidArgument(std::string(key) + ": not a boolean"));
      *flag = j[key].get<bool>();
    }
    auto pruned = images.Prune(opts);
    if (!pruned.ok()) return ErrorReply(pruned.status());
    auto rows = [](const std::vector<Freed>& list, uint64_t* total) {
      Json out = Json::array();
      for (const auto& f : list) {
        out.push_back({{"what", f.what}, {"path", f.path}, {"bytes", f.bytes}});
        *total += f.bytes;
      }
      return out;
    };
    uint64_t freed = 0, kept = 0;
    Json freed_rows = rows(pruned->freed, &freed);
    Json kept_rows = rows(pruned->kept, &kept);
    return {{"ok", true},     {"dry_run", opts.dry_run}, {"freed", freed_rows},
            {"bytes", freed}, {"kept", kept_rows},       {"kept_bytes", kept}};
  });
}

}  // namespace trybox::daemon
