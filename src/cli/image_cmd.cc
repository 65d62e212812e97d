#include "cli/image_cmd.h"

#include <cstdio>

#include "daemon/image_listing.h"
#include "util/paths.h"
#include "util/utf8.h"

namespace trybox::cli {
namespace {

using Json = nlohmann::json;

int Failed(std::ostream& err, const Status& st) {
  err << "trybox: " << OneLine(st.message()) << "\n";
  return 1;
}

// What trybox itself failed to do (the daemon refused, or went away): 125, like every other
// verb that asks the daemon (docs/daemon.md).
int DaemonFailed(std::ostream& err, const Status& st) {
  err << "trybox: " << st.message() << "\n";
  return 125;
}

std::string Size(uint64_t bytes) {
  char buf[32];
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.1fG", static_cast<double>(bytes) / (1 << 30));
  } else if (bytes >= (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.1fM", static_cast<double>(bytes) / (1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.0fK", static_cast<double>(bytes) / 1024);
  }
  return buf;
}

// A text field as printed: OneLine (util/utf8.h), since an image name or problem can come from
// a guest or a damaged manifest.
std::string Str(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? OneLine(it->get<std::string>()) : "-";
}

uint64_t Num(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

}  // namespace

int CmdCommit(Client& c, const std::string& vm, const std::string& name, bool json,
              std::ostream& out, std::ostream& err) {
  auto r = c.Call({{"verb", "commit"}, {"vm", vm}, {"name", name}});
  if (!r.ok()) return DaemonFailed(err, r.status());
  const Json& im = (*r)["image"];
  if (json) {
    out << im.dump(2) << "\n";
    return 0;
  }
  out << Str(im, "name") << "\n";
  err << "trybox: image " << Str(im, "name") << " from VM " << vm << " (parent "
      << Str(im["parent"], "name") << "); its layer takes " << Size(Num(im, "layer_bytes"))
      << " on disk\n";
  return 0;
}

int CmdImageLs(bool json, std::ostream& out, std::ostream& err) {
  // The running daemon's view (it knows which VMs use an image) when it serves this images
  // directory; else the directory as it is. Listing never starts a daemon.
  const Paths paths = Paths::FromEnvironment();
  Json images;
  if (auto c = Client::Connect(paths, /*autostart=*/false); c.ok()) {
    auto r = (*c)->Call({{"verb", "image_ls"}});
    if (r.ok() && r->value("images_dir", "") == paths.images) images = (*r)["images"];
  }
  if (images.is_null()) {
    auto list = daemon::ListImageViews(paths.images, {});
    if (!list.ok()) return Failed(err, list.status());
    images = daemon::ImageListJson(*list, paths.state);
  }
  if (json) {
    out << images.dump(2) << "\n";
    return 0;
  }
  char line[512];
  std::snprintf(line, sizeof line, "%-20s %-20s %-8s %-8s %-21s %-9s %-6s %s\n", "NAME", "PARENT",
                "OWN", "CHAIN", "CREATED", "TEMPLATE", "IN USE", "PROBLEM");
  out << line;
  for (const Json& im : images) {
    const bool valid = im.value("valid", false);
    std::string parent = im.contains("parent") && im["parent"].is_string()
                             ? OneLine(im["parent"].get<std::string>())
                             : (valid ? "(base)" : "-");
    const Json& tpl = im.contains("template") ? im["template"] : Json();
    std::string tstate = tpl.is_object() ? Str(tpl, "state") : "-";
    std::snprintf(line, sizeof line, "%-20s %-20s %-8s %-8s %-21s %-9s %-6s %s\n",
                  Str(im, "name").c_str(), parent.c_str(),
                  valid ? Size(Num(im, "own_bytes")).c_str() : "-",
                  valid ? Size(Num(im, "total_bytes")).c_str() : "-", Str(im, "created").c_str(),
                  tstate.c_str(), std::to_string(im.value("in_use", 0)).c_str(),
                  valid ? "" : Str(im, "problem").c_str());
    out << line;
  }
  return 0;
}

int CmdImageRm(Client& c, const std::string& name, std::ostream& out, std::ostream& err) {
  auto r = c.Call({{"verb", "image_rm"}, {"name", name}});
  if (!r.ok()) return Failed(err, r.status());
  out << name << "\n";
  err << "trybox: removed image " << name << ", freed " << Size(Num((*r)["removed"], "bytes"))
      << "\n";
  return 0;
}

int CmdImageRmTemplate(Client& c, const std::string& name, std::ostream& out, std::ostream& err) {
  auto r = c.Call({{"verb", "image_rm_template"}, {"name", name}});
  if (!r.ok()) return Failed(err, r.status());
  const Json removed = r->value("removed", Json::array());
  for (const Json& d : removed) {
    if (d.is_string()) out << d.get<std::string>() << "\n";
  }
  err << "trybox: removed " << removed.size() << " template(s) of " << name
      << (removed.empty() ? "" : "; the next create rebuilds one") << "\n";
  return 0;
}

int CmdImagePrune(Client& c, bool dry_run, bool all, const PruneAsk& ask, bool json,
                  std::ostream& out, std::ostream& err) {
  if (!all && !dry_run && ask) {
    // A look first: the question only when there is a rootfs cache to lose.
    auto look = c.Call({{"verb", "image_prune"}, {"dry_run", true}});
    if (!look.ok()) return Failed(err, look.status());
    uint64_t cached = Num(*look, "kept_bytes");
    if (cached > 0) {
      all = ask("trybox: also remove the cached root filesystem (" + Size(cached) +
                "; the next base image build makes it again, 14 minutes on two cores)?");
    }
  }
  auto r = c.Call({{"verb", "image_prune"}, {"dry_run", dry_run}, {"all", all}});
  if (!r.ok()) return Failed(err, r.status());
  if (json) {
    out << Json{{"dry_run", dry_run},
                {"freed", (*r)["freed"]},
                {"bytes", Num(*r, "bytes")},
                {"kept", (*r)["kept"]},
                {"kept_bytes", Num(*r, "kept_bytes")}}
               .dump(2)
        << "\n";
    return 0;
  }
  if (dry_run) out << "would remove (dry run, nothing removed):\n";
  for (const Json& f : (*r)["freed"]) {
    out << Str(f, "what") << " " << Str(f, "path") << " " << Size(Num(f, "bytes")) << "\n";
  }
  out << (dry_run ? "would free " : "freed ") << Size(Num(*r, "bytes")) << "\n";
  for (const Json& f : (*r)["kept"]) {
    out << "kept " << Str(f, "what") << " " << Str(f, "path") << " " << Size(Num(f, "bytes"))
        << " (--all removes it)\n";
  }
  return 0;
}

}  // namespace trybox::cli
