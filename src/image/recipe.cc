#include "image/recipe.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "egress/allowlist.h"
#include "image/builtin_recipes.h"
#include "util/fd.h"
#include "util/names.h"
#include "util/sha256.h"

namespace trybox::image {
namespace {

using Json = nlohmann::json;

Status Bad(const std::string& path, const std::string& why) {
  return InvalidArgument("recipe: " + path + ": " + why);
}

const char* TypeName(const Json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "an array";
  return "an object";
}

Status WrongType(const std::string& path, const char* want, const Json& got) {
  return Bad(path, std::string("must be ") + want + ", not " + TypeName(got));
}

Status CheckKeys(const Json& obj, const std::string& path,
                 std::initializer_list<std::string_view> known) {
  for (const auto& [key, ignored] : obj.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Bad(path + "." + key, "unknown key");
    }
  }
  return Status::Ok();
}

Result<std::string> String(const Json& j, const std::string& path) {
  if (!j.is_string()) return WrongType(path, "a string", j);
  std::string s = j.get<std::string>();
  if (s.find('\0') != std::string::npos) return Bad(path, "contains a NUL byte");
  return s;
}

Result<std::string> NonEmptyString(const Json& j, const std::string& path) {
  ASSIGN_OR_RETURN(std::string s, String(j, path));
  if (s.empty()) return Bad(path, "must not be empty");
  return s;
}

Result<std::string> AbsolutePath(const Json& j, const std::string& path) {
  ASSIGN_OR_RETURN(std::string s, String(j, path));
  if (s.empty() || s[0] != '/') return Bad(path, "must be an absolute path");
  return s;
}

Result<std::vector<std::string>> StringArray(const Json& j, const std::string& path) {
  if (!j.is_array()) return WrongType(path, "an array of strings", j);
  std::vector<std::string> out;
  for (size_t i = 0; i < j.size(); ++i) {
    ASSIGN_OR_RETURN(std::string s, NonEmptyString(j[i], path + "[" + std::to_string(i) + "]"));
    out.push_back(std::move(s));
  }
  return out;
}

bool ValidEnvName(const std::string& k) {
  if (k.empty()) return false;
  for (size_t i = 0; i < k.size(); ++i) {
    char c = k[i];
    bool ok = c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

Result<std::map<std::string, std::string>> EnvObject(const Json& j, const std::string& path) {
  if (!j.is_object()) return WrongType(path, "an object of strings", j);
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : j.items()) {
    const std::string p = path + "." + k;
    if (!ValidEnvName(k)) return Bad(p, "is not a valid environment variable name");
    ASSIGN_OR_RETURN(out[k], String(v, p));
  }
  return out;
}

// Debian policy 5.6.1: lowercase letters, digits, + - . ; at least two; starts alphanumeric
// (so a name can never be read as an apt option).
bool ValidPackageName(const std::string& s) {
  if (s.size() < 2 || s.size() > 128) return false;
  if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= '0' && s[0] <= '9'))) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

Result<RecipeStep> ParseStep(const Json& j, const std::string& path) {
  if (!j.is_object()) return WrongType(path, "an object", j);
  RecipeStep step;
  const bool run = j.contains("run");
  const bool copy = j.contains("copy");
  if (run == copy) return Bad(path, "a step has exactly one of \"run\" and \"copy\"");
  if (run) {
    RETURN_IF_ERROR(CheckKeys(j, path, {"run", "workdir", "env"}));
    step.kind = RecipeStep::Kind::kRun;
    ASSIGN_OR_RETURN(step.run, NonEmptyString(j["run"], path + ".run"));
    if (j.contains("workdir")) {
      ASSIGN_OR_RETURN(step.workdir, AbsolutePath(j["workdir"], path + ".workdir"));
    }
    if (j.contains("env")) {
      ASSIGN_OR_RETURN(step.env, EnvObject(j["env"], path + ".env"));
    }
    return step;
  }
  RETURN_IF_ERROR(CheckKeys(j, path, {"copy", "to"}));
  step.kind = RecipeStep::Kind::kCopy;
  ASSIGN_OR_RETURN(step.copy, NonEmptyString(j["copy"], path + ".copy"));
  if (step.copy[0] == '/') return Bad(path + ".copy", "must be relative to the recipe's folder");
  if (!j.contains("to")) return Bad(path + ".to", "missing (a copy step needs \"to\")");
  ASSIGN_OR_RETURN(step.to, AbsolutePath(j["to"], path + ".to"));
  return step;
}

// What a copied file or tree contributes to the hash.
Status HashTree(const std::string& path, const std::string& rel, std::string* out) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoError("recipe copy: lstat " + path);
  const std::string mode = std::to_string(st.st_mode & 07777);
  if (S_ISLNK(st.st_mode)) {
    char target[PATH_MAX];
    ssize_t n = ::readlink(path.c_str(), target, sizeof target);
    if (n < 0) return ErrnoError("recipe copy: readlink " + path);
    *out += "l " + rel + " " + std::string(target, static_cast<size_t>(n)) + "\n";
    return Status::Ok();
  }
  if (S_ISREG(st.st_mode)) {
    ASSIGN_OR_RETURN(std::string sha, Sha256File(path));
    *out += "f " + rel + " " + mode + " " + sha + "\n";
    return Status::Ok();
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgument("recipe copy: " + path + " is neither a file, a directory nor a link");
  }
  *out += "d " + rel + " " + mode + "\n";
  auto listed = ListDir(path);
  if (!listed.ok()) return listed.status().Annotate("recipe copy");
  std::vector<std::string> names = std::move(*listed);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) RETURN_IF_ERROR(HashTree(path + "/" + n, rel + "/" + n, out));
  return Status::Ok();
}

}  // namespace

Result<Recipe> ParseRecipe(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("recipe: not valid JSON");
  if (!j.is_object()) return WrongType("$", "an object", j);
  RETURN_IF_ERROR(CheckKeys(j, "$", {"from", "packages", "allow", "env", "steps", "check"}));
  Recipe r;
  if (!j.contains("from")) return Bad("$.from", "missing (the base image)");
  ASSIGN_OR_RETURN(r.from, String(j["from"], "$.from"));
  if (Status st = ValidateName("base image name", r.from); !st.ok()) {
    return Bad("$.from", st.message());
  }
  if (j.contains("packages")) {
    ASSIGN_OR_RETURN(r.packages, StringArray(j["packages"], "$.packages"));
    for (size_t i = 0; i < r.packages.size(); ++i) {
      if (!ValidPackageName(r.packages[i])) {
        return Bad("$.packages[" + std::to_string(i) + "]",
                   QuoteForMessage(r.packages[i]) + " is not a Debian package name");
      }
    }
  }
  if (j.contains("allow")) {
    ASSIGN_OR_RETURN(r.allow, StringArray(j["allow"], "$.allow"));
    for (size_t i = 0; i < r.allow.size(); ++i) {
      auto e = egress::ParseAllowEntry(r.allow[i]);
      if (!e.ok()) return Bad("$.allow[" + std::to_string(i) + "]", e.status().message());
    }
  }
  if (j.contains("env")) {
    ASSIGN_OR_RETURN(r.env, EnvObject(j["env"], "$.env"));
  }
  if (j.contains("steps")) {
    const Json& steps = j["steps"];
    if (!steps.is_array()) return WrongType("$.steps", "an array of steps", steps);
    for (size_t i = 0; i < steps.size(); ++i) {
      ASSIGN_OR_RETURN(RecipeStep s, ParseStep(steps[i], "$.steps[" + std::to_string(i) + "]"));
      r.steps.push_back(std::move(s));
    }
  }
  if (j.contains("check")) {
    ASSIGN_OR_RETURN(r.check, StringArray(j["check"], "$.check"));
  }
  return r;
}

Json RecipeToJson(const Recipe& r) {
  Json steps = Json::array();
  for (const auto& s : r.steps) {
    Json o = Json::object();
    if (s.kind == RecipeStep::Kind::kRun) {
      o["run"] = s.run;
      if (!s.workdir.empty()) o["workdir"] = s.workdir;
      if (!s.env.empty()) o["env"] = s.env;
    } else {
      o["copy"] = s.copy;
      o["to"] = s.to;
    }
    steps.push_back(std::move(o));
  }
  return {{"from", r.from},     {"packages", r.packages}, {"allow", r.allow},
          {"env", Json(r.env)}, {"steps", steps},         {"check", r.check}};
}

Result<std::string> ResolveCopySource(const std::string& recipe_dir, const std::string& rel) {
  if (rel.empty() || rel[0] == '/') {
    return InvalidArgument("recipe copy " + QuoteForMessage(rel) +
                           ": must be relative to the recipe's folder");
  }
  char root[PATH_MAX], real[PATH_MAX];
  if (!::realpath(recipe_dir.c_str(), root)) return ErrnoError("recipe folder " + recipe_dir);
  const std::string joined = std::string(root) + "/" + rel;
  if (!::realpath(joined.c_str(), real)) {
    if (errno == ENOENT) return NotFound("recipe copy " + QuoteForMessage(rel) + ": no such file");
    return ErrnoError("recipe copy " + QuoteForMessage(rel));
  }
  const std::string r = real, base = root;
  if (r == base || (r.size() > base.size() && r.compare(0, base.size(), base) == 0 &&
                    (base == "/" || r[base.size()] == '/'))) {
    return r;
  }
  return InvalidArgument("recipe copy " + QuoteForMessage(rel) +
                         " escapes the recipe's folder (resolves to " + QuoteForMessage(r) + ")");
}

Result<std::string> RecipeSha256(const Recipe& recipe, const std::string& recipe_dir) {
  std::string material = "trybox-recipe 1\n" + RecipeToJson(recipe).dump() + "\n";
  for (const auto& s : recipe.steps) {
    if (s.kind != RecipeStep::Kind::kCopy) continue;
    ASSIGN_OR_RETURN(std::string src, ResolveCopySource(recipe_dir, s.copy));
    material += "copy " + s.copy + "\n";
    RETURN_IF_ERROR(HashTree(src, ".", &material));
  }
  return Sha256Hex(material);
}

ImageDescription DescribeImage(const std::string& images_root, const std::string& name) {
  ImageDescription d;
  std::string at = name;
  bool checks_read = false;
  for (int depth = 0; depth < 32; ++depth) {
    if (!ValidateName("image name", at).ok()) break;
    auto text = ReadFileToString(images_root + "/" + at + "/manifest.json");
    if (!text.ok()) break;
    Json m = Json::parse(*text, nullptr, false);
    if (!m.is_object()) break;
    if (!checks_read && m.contains("recipe")) {
      checks_read = true;  // the newest recipe's checks cover what its parents installed
      auto r = ParseRecipe(m["recipe"].dump());
      if (r.ok()) d.checks = r->check;
    }
    if (m.contains("suite") && m["suite"].is_string()) {
      const std::string suite = m["suite"].get<std::string>();
      static const std::map<std::string, std::string> kVersions = {
          {"bullseye", "11"}, {"bookworm", "12"}, {"trixie", "13"}};
      auto v = kVersions.find(suite);
      d.distribution =
          v == kVersions.end() ? "Debian " + suite : "Debian " + v->second + " (" + suite + ")";
      break;
    }
    // Format 2: "parent": {"name", "manifest_sha256"} (docs/images.md).
    if (!m.contains("parent") || !m["parent"].is_object() || !m["parent"].contains("name") ||
        !m["parent"]["name"].is_string()) {
      break;
    }
    at = m["parent"]["name"].get<std::string>();
  }
  return d;
}

std::vector<std::string> BuiltinRecipeNames() {
  std::vector<std::string> names;
  for (const auto& b : kBuiltinRecipes) names.push_back(b.name);
  return names;
}

Result<std::string> BuiltinRecipe(const std::string& name) {
  for (const auto& b : kBuiltinRecipes) {
    if (name == b.name) return std::string(b.text);
  }
  return NotFound("no built-in recipe " + QuoteForMessage(name));
}

}  // namespace trybox::image
