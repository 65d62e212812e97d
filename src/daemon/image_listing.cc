#include "daemon/image_listing.h"

#include <unistd.h>

#include "image/derive.h"
#include "util/fd.h"
#include "vmm/template.h"

namespace trybox::daemon {
namespace {

using Json = nlohmann::json;

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

Result<std::vector<ImageView>> ListImageViews(const std::string& images_root,
                                              std::map<std::string, int> in_use) {
  ASSIGN_OR_RETURN(auto entries, image::ListImages(images_root));
  std::vector<ImageView> out;
  for (auto& e : entries) {
    ImageView v;
    v.in_use = in_use[e.name];
    if (e.valid) {
      const image::Manifest& m = e.manifest;
      for (const auto& [part, info] : m.files) {
        uint64_t b = image::DiskBytes(e.dir + "/" + part);
        v.total_bytes += b;
        bool own = m.layers.empty() || part == m.layers.back().part;
        if (own) v.own_bytes += b;
      }
      v.own_bytes += image::DiskBytes(e.dir + "/manifest.json");
      v.total_bytes += image::DiskBytes(e.dir + "/manifest.json");
      for (const auto& other : entries) {
        if (other.valid && other.manifest.format == image::kDerivedManifestFormat &&
            other.manifest.parent.name == e.name && other.name != e.name) {
          v.derived.push_back(other.name);
        }
      }
    }
    v.entry = std::move(e);
    out.push_back(std::move(v));
  }
  return out;
}

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
    // A recipe build's staged image whose checks have not passed is not an image yet.
    if (v.entry.valid && v.entry.manifest.checks_pending) continue;
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

}  // namespace trybox::daemon
