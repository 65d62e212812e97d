#include "image/image.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "image/hash_cache.h"
#include "util/fd.h"
#include "util/names.h"

namespace trybox::image {
namespace {

using Json = nlohmann::json;

bool IsSha256Hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// The part names of an image with `layers` layers: the base's four, then layer-1..N.
std::vector<std::string> PartNames(size_t layers) {
  std::vector<std::string> out(std::begin(kPartNames), std::end(kPartNames));
  for (size_t k = 1; k <= layers; ++k) out.push_back(LayerPartName(static_cast<int>(k)));
  return out;
}

Status Malformed(const std::string& what) {
  return FailedPrecondition("malformed manifest: " + what);
}

// `parent` qualifies the field name in errors: "files.vmlinux.sha256".
Status GetString(const Json& j, const char* key, std::string* out, const std::string& parent = "") {
  std::string field = parent.empty() ? key : parent + "." + key;
  auto it = j.find(key);
  if (it == j.end()) return Malformed("missing field '" + field + "'");
  if (!it->is_string()) return Malformed("field '" + field + "' is not a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

Status GetStringList(const Json& j, const char* key, std::vector<std::string>* out) {
  auto it = j.find(key);
  if (it == j.end()) return Malformed(std::string("missing field '") + key + "'");
  if (!it->is_array()) return Malformed(std::string("field '") + key + "' is not an array");
  out->clear();
  for (const Json& v : *it) {
    if (!v.is_string()) {
      return Malformed(std::string("field '") + key + "' has an element that is not a string");
    }
    out->push_back(v.get<std::string>());
  }
  return Status::Ok();
}

Status ParseParts(const Json& j, size_t layers, std::map<std::string, PartInfo>* out) {
  auto it = j.find("files");
  if (it == j.end()) return Malformed("missing field 'files'");
  if (!it->is_object()) return Malformed("field 'files' is not an object");
  const std::vector<std::string> names = PartNames(layers);
  for (const auto& [part, info] : it->items()) {
    // The part name becomes a path: only the known names are accepted.
    if (std::find(names.begin(), names.end(), part) == names.end()) {
      return Malformed("unknown part " + QuoteForMessage(part));
    }
    if (!info.is_object()) return Malformed("files." + part + " is not an object");
    PartInfo p;
    RETURN_IF_ERROR(GetString(info, "sha256", &p.sha256, "files." + part));
    if (!IsSha256Hex(p.sha256)) {
      return Malformed("files." + part + ".sha256 is not 64 lowercase hex digits");
    }
    auto size = info.find("size");
    if (size == info.end() || !size->is_number_unsigned()) {
      return Malformed("files." + part + ".size is not a non-negative integer");
    }
    p.size = size->get<uint64_t>();
    (*out)[part] = std::move(p);
  }
  for (const std::string& part : names) {
    if (!out->count(part)) return Malformed("files has no entry for " + part);
  }
  return Status::Ok();
}

Status ParseRef(const Json& j, const char* key, ImageRef* out) {
  auto it = j.find(key);
  if (it == j.end()) return Malformed(std::string("missing field '") + key + "'");
  if (!it->is_object()) return Malformed(std::string("field '") + key + "' is not an object");
  RETURN_IF_ERROR(GetString(*it, "name", &out->name, key));
  if (!ValidateName("image name", out->name).ok()) {
    return Malformed(std::string(key) + ".name is not a valid image name");
  }
  RETURN_IF_ERROR(GetString(*it, "manifest_sha256", &out->manifest_sha256, key));
  if (!IsSha256Hex(out->manifest_sha256)) {
    return Malformed(std::string(key) + ".manifest_sha256 is not 64 lowercase hex digits");
  }
  return Status::Ok();
}

// Format 2's own fields and the chain's consistency.
Status ParseDerived(const Json& j, Manifest* m) {
  RETURN_IF_ERROR(ParseRef(j, "base", &m->base));
  RETURN_IF_ERROR(ParseRef(j, "parent", &m->parent));
  auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array()) {
    return Malformed("field 'layers' is missing or not an array");
  }
  if (layers->empty() || layers->size() > static_cast<size_t>(kMaxLayers)) {
    return Malformed("'layers' must hold 1 to " + std::to_string(kMaxLayers) + " layers");
  }
  for (size_t k = 0; k < layers->size(); ++k) {
    const Json& l = (*layers)[k];
    std::string where = "layers[" + std::to_string(k) + "]";
    if (!l.is_object()) return Malformed(where + " is not an object");
    LayerInfo info;
    RETURN_IF_ERROR(GetString(l, "image", &info.image, where));
    RETURN_IF_ERROR(GetString(l, "part", &info.part, where));
    if (!ValidateName("image name", info.image).ok()) {
      return Malformed(where + ".image is not a valid image name");
    }
    if (info.part != LayerPartName(static_cast<int>(k + 1))) {
      return Malformed(where + ".part must be " + LayerPartName(static_cast<int>(k + 1)));
    }
    m->layers.push_back(std::move(info));
  }
  if (m->layers.back().image != m->name) {
    return Malformed("the last layer is not this image's own (it names '" + m->layers.back().image +
                     "')");
  }
  const std::string& below =
      m->layers.size() == 1 ? m->base.name : m->layers[m->layers.size() - 2].image;
  if (m->parent.name != below) {
    return Malformed("parent '" + m->parent.name + "' is not the image below this one's layer ('" +
                     below + "')");
  }
  if (m->layers.size() == 1 && m->parent != m->base) {
    return Malformed("a one-layer image's parent must be its base");
  }
  auto env = j.find("env");
  if (env == j.end() || !env->is_object())
    return Malformed("field 'env' is missing or not an object");
  for (const auto& [k, v] : env->items()) {
    if (!v.is_string()) return Malformed("env." + k + " is not a string");
    if (k.empty() || k.find('=') != std::string::npos) {
      return Malformed("env has a key that is empty or contains '='");
    }
    m->env[k] = v.get<std::string>();
  }
  RETURN_IF_ERROR(GetString(j, "vm", &m->vm));
  auto recipe = j.find("recipe");
  if (recipe == j.end() || !(recipe->is_null() || recipe->is_object())) {
    return Malformed("field 'recipe' is missing or neither null nor an object");
  }
  m->recipe = *recipe;
  RETURN_IF_ERROR(GetString(j, "recipe_sha256", &m->recipe_sha256));
  if (!m->recipe_sha256.empty() && !IsSha256Hex(m->recipe_sha256)) {
    return Malformed("recipe_sha256 is neither empty nor 64 lowercase hex digits");
  }
  if (auto pending = j.find("checks_pending"); pending != j.end()) {
    if (!pending->is_boolean()) return Malformed("field 'checks_pending' is not a boolean");
    m->checks_pending = pending->get<bool>();
  }
  return Status::Ok();
}

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Abbrev(const std::string& sha) { return sha.substr(0, 12) + ".."; }

Status VerifyPart(HashCache& cache, const std::string& image, const std::string& dir,
                  const std::string& part, const PartInfo& want) {
  std::string path = dir + "/" + part;
  std::string prefix = "image '" + image + "': " + part;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFound(prefix + " is missing (" + path + ")");
    return ErrnoError("stat " + path).Annotate("image '" + image + "'");
  }
  if (!S_ISREG(st.st_mode)) return FailedPrecondition(prefix + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) != want.size) {
    return FailedPrecondition(prefix + " does not match its manifest (size " +
                              std::to_string(st.st_size) + " != " + std::to_string(want.size) +
                              ")");
  }
  ASSIGN_OR_RETURN(std::string sha, cache.Sha256(path));
  if (sha != want.sha256) {
    return FailedPrecondition(prefix + " does not match its manifest (sha256 " + Abbrev(sha) +
                              " != " + Abbrev(want.sha256) + ")");
  }
  return Status::Ok();
}

}  // namespace

std::string LayerPartName(int k) { return "layer-" + std::to_string(k) + ".ext4"; }

std::map<std::string, std::string> MergeEnv(const std::map<std::string, std::string>& parent,
                                            const std::map<std::string, std::string>& own) {
  std::map<std::string, std::string> out = own;
  out.insert(parent.begin(), parent.end());  // insert keeps own's value for an equal key
  return out;
}

std::string CreatedFor(const Manifest& fresh, const Manifest& installed) {
  Manifest same = fresh;
  same.created = installed.created;
  return same == installed ? installed.created : fresh.created;
}

std::string ManifestToJson(const Manifest& m) {
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  for (const auto& [part, info] : m.files) {
    files[part] = {{"sha256", info.sha256}, {"size", info.size}};
  }
  nlohmann::ordered_json j;
  j["format"] = m.format;
  j["name"] = m.name;
  j["created"] = m.created;
  j["suite"] = m.suite;
  j["kernel_version"] = m.kernel_version;
  j["kernel_package"] = m.kernel_package;
  j["packages"] = m.packages;
  j["modules"] = m.modules;
  j["init_sha256"] = m.init_sha256;
  if (m.format == kDerivedManifestFormat) {
    j["base"] = {{"name", m.base.name}, {"manifest_sha256", m.base.manifest_sha256}};
    j["parent"] = {{"name", m.parent.name}, {"manifest_sha256", m.parent.manifest_sha256}};
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (const LayerInfo& l : m.layers) layers.push_back({{"image", l.image}, {"part", l.part}});
    j["layers"] = layers;
    j["env"] = m.env;
    j["vm"] = m.vm;
    j["recipe"] = m.recipe;
    j["recipe_sha256"] = m.recipe_sha256;
    if (m.checks_pending) j["checks_pending"] = true;
  }
  j["files"] = files;
  return j.dump(2) + "\n";
}

Result<Manifest> ParseManifest(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Malformed("not valid JSON");
  if (!j.is_object()) return Malformed("not a JSON object");
  Manifest m;
  auto format = j.find("format");
  if (format == j.end() || !format->is_number_integer()) {
    return Malformed("field 'format' is missing or not an integer");
  }
  const int64_t fmt = format->get<int64_t>();
  if (fmt != kManifestFormat && fmt != kDerivedManifestFormat) {
    return FailedPrecondition("manifest format " + std::to_string(fmt) +
                              " is not supported (this trybox reads formats " +
                              std::to_string(kManifestFormat) + " and " +
                              std::to_string(kDerivedManifestFormat) + "; rebuild the image)");
  }
  m.format = static_cast<int>(fmt);
  RETURN_IF_ERROR(GetString(j, "name", &m.name));
  Status name_ok = ValidateName("image name", m.name);
  if (!name_ok.ok()) return Malformed(name_ok.message());
  RETURN_IF_ERROR(GetString(j, "created", &m.created));
  RETURN_IF_ERROR(GetString(j, "suite", &m.suite));
  RETURN_IF_ERROR(GetString(j, "kernel_version", &m.kernel_version));
  RETURN_IF_ERROR(GetString(j, "kernel_package", &m.kernel_package));
  RETURN_IF_ERROR(GetStringList(j, "packages", &m.packages));
  RETURN_IF_ERROR(GetStringList(j, "modules", &m.modules));
  RETURN_IF_ERROR(GetString(j, "init_sha256", &m.init_sha256));
  if (!IsSha256Hex(m.init_sha256)) return Malformed("init_sha256 is not 64 lowercase hex digits");
  if (m.format == kDerivedManifestFormat) RETURN_IF_ERROR(ParseDerived(j, &m));
  RETURN_IF_ERROR(ParseParts(j, m.layers.size(), &m.files));
  return m;
}

Result<Manifest> ReadManifest(const std::string& image_dir) {
  std::string path = image_dir + "/manifest.json";
  Result<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    if (text.status().code() == Code::kNotFound) {
      return NotFound("image directory " + image_dir + " has no manifest.json");
    }
    return text.status();
  }
  Result<Manifest> m = ParseManifest(*text);
  if (!m.ok()) return m.status().Annotate(path);
  std::string dir_name = BaseName(image_dir);
  if (m->name != dir_name) {
    return FailedPrecondition(path + ": names image '" + m->name + "' but the directory is '" +
                              dir_name + "'");
  }
  return m;
}

Status VerifyImage(const std::string& image_dir) {
  static HashCache cache;
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(image_dir));
  for (const auto& [part, info] : m.files) {
    RETURN_IF_ERROR(VerifyPart(cache, m.name, image_dir, part, info));
  }
  return Status::Ok();
}

Result<std::vector<ImageEntry>> ListImages(const std::string& images_root) {
  std::vector<ImageEntry> out;
  DIR* d = ::opendir(images_root.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return out;
    return ErrnoError("open images directory " + images_root);
  }
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    // Dot-directories are builds in progress or being removed.
    if (e->d_name[0] != '.') names.emplace_back(e->d_name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    std::string dir = images_root + "/" + name;
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (::stat((dir + "/manifest.json").c_str(), &st) != 0) continue;
    ImageEntry entry;
    entry.name = name;
    entry.dir = dir;
    Result<Manifest> m = ReadManifest(dir);
    entry.valid = m.ok();
    if (m.ok()) {
      entry.manifest = std::move(m).value();
    } else {
      entry.problem = m.status().message();
    }
    out.push_back(std::move(entry));
  }
  return out;
}

Result<std::string> ImageDir(const std::string& images_root, const std::string& name) {
  RETURN_IF_ERROR(ValidateName("image name", name));
  std::string dir = images_root + "/" + name;
  struct stat st;
  if (::stat((dir + "/manifest.json").c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return NotFound("image '" + name + "' is not built (run: trybox image build " + name + ")");
    }
    return ErrnoError("stat " + dir + "/manifest.json");
  }
  return dir;
}

}  // namespace trybox::image
