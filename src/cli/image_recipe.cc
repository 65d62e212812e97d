#include "cli/image_recipe.h"

#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <iostream>
#include <ostream>
#include <thread>

#include "cli/cli.h"
#include "cli/reply.h"
#include "cli/transfer.h"
#include "image/debs.h"
#include "image/image.h"
#include "image/recipe.h"
#include "util/fd.h"
#include "util/names.h"
#include "util/process.h"
#include "util/sha256.h"

namespace trybox::cli {

using Kind = channel::Stream::Message::Kind;

namespace {

constexpr size_t kTailBytes = 4096;
constexpr size_t kTailLines = 20;
constexpr const char* kGuestDebs = "/var/cache/trybox-debs";

std::string LastLines(const std::string& s) {
  size_t pos = s.size();
  for (size_t n = 0; n <= kTailLines && pos > 0; ++n) {
    size_t nl = s.rfind('\n', pos - 1);
    if (nl == std::string::npos) return s;
    if (n == kTailLines) return s.substr(nl + 1);
    pos = nl;
  }
  return s;
}

std::string OneLine(const std::string& s, size_t max = 72) {
  std::string out;
  for (char c : s) out += c == '\n' ? ' ' : c;
  return out.size() > max ? out.substr(0, max - 3) + "..." : out;
}

Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return FailedPrecondition(path + " is not JSON");
  return j;
}

// The Debian suite of an image: its own manifest's, else its parent's.
Result<std::string> SuiteOf(const std::string& images_root, const std::string& name) {
  std::string at = name;
  for (int depth = 0; depth < 32; ++depth) {
    ASSIGN_OR_RETURN(std::string dir, image::ImageDir(images_root, at));
    ASSIGN_OR_RETURN(nlohmann::json m, ReadJsonFile(dir + "/manifest.json"));
    if (m.contains("suite") && m["suite"].is_string()) return m["suite"].get<std::string>();
    // Format 2: "parent": {"name", "manifest_sha256"} (docs/images.md).
    if (!m.contains("parent") || !m["parent"].is_object() || !m["parent"].contains("name") ||
        !m["parent"]["name"].is_string()) {
      break;
    }
    at = m["parent"]["name"].get<std::string>();
  }
  return FailedPrecondition("image " + name + " names no Debian suite in its manifest");
}

}  // namespace

struct RecipeBuild::Parsed {
  image::Recipe recipe;
  std::string recipe_dir;  // "" for a built-in recipe: no copy steps can resolve
  std::string sha256;
  std::string base_sha256;  // of the base's manifest.json
};

RecordedBuild RecordedBuildOf(const nlohmann::json& m) {
  RecordedBuild r;
  auto str = [](const nlohmann::json& o, const char* k) {
    return o.is_object() && o.contains(k) && o[k].is_string() ? o[k].get<std::string>() : "";
  };
  r.recipe_sha256 = str(m, "recipe_sha256");
  if (m.is_object() && m.contains("parent")) {
    r.base_manifest_sha256 = str(m["parent"], "manifest_sha256");
  }
  return r;
}

void RecipeBuild::Interrupt() {
  interrupted_ = true;
  std::lock_guard<std::mutex> lock(client_mu_);
  if (client_) client_->Shutdown();
}

void RecipeBuild::Step(const std::string& what) {
  ++step_;
  if (opts_.progress) {
    err_ << "[" << step_ << "/" << steps_ << "] " << what << "\n";
    err_.flush();
  }
}

Result<RecipeBuildResult> RecipeBuild::Run() {
  auto r = Build();
  if (r.ok()) return r;
  Status st = r.status();
  if (interrupted_) st = Cancelled("interrupted; the build was stopped");
  Status cleaned = Cleanup();
  if (!cleaned.ok()) {
    err_ << "trybox: cleaning up after the failed build: " << cleaned.message() << "\n";
  }
  return st;
}

Result<RecipeBuildResult> RecipeBuild::Build() {
  RETURN_IF_ERROR(ValidateName("image name", opts_.name));
  p_ = std::make_shared<Parsed>();
  std::string text;
  if (opts_.recipe_file.empty()) {
    auto builtin = image::BuiltinRecipe(opts_.name);
    if (!builtin.ok()) {
      return NotFound("no recipe for image " + opts_.name + " (give one with -f RECIPE)");
    }
    text = *builtin;
  } else {
    char real[PATH_MAX];
    if (!::realpath(opts_.recipe_file.c_str(), real)) {
      return ErrnoError("recipe " + opts_.recipe_file);
    }
    ASSIGN_OR_RETURN(text, ReadFileToString(real));
    std::string path = real;
    p_->recipe_dir = path.substr(0, path.rfind('/'));
    if (p_->recipe_dir.empty()) p_->recipe_dir = "/";
  }
  ASSIGN_OR_RETURN(p_->recipe, image::ParseRecipe(text));
  const image::Recipe& recipe = p_->recipe;
  if (recipe.from == opts_.name) {
    return InvalidArgument("recipe: $.from: an image cannot be built from itself (" + opts_.name +
                           ")");
  }
  auto base_dir = image::ImageDir(paths_.images, recipe.from);
  if (!base_dir.ok()) return base_dir.status().Annotate("recipe: unknown base");
  ASSIGN_OR_RETURN(p_->base_sha256, Sha256File(*base_dir + "/manifest.json"));
  if (p_->recipe_dir.empty()) {
    for (const auto& s : recipe.steps) {
      if (s.kind == image::RecipeStep::Kind::kCopy) {
        return InvalidArgument("a built-in recipe cannot copy files");
      }
    }
    p_->recipe_dir = "/nonexistent";
  }
  ASSIGN_OR_RETURN(p_->sha256, image::RecipeSha256(recipe, p_->recipe_dir));

  RecipeBuildResult result;
  result.recipe_sha256 = p_->sha256;
  result.base = recipe.from;
  auto existing = ReadJsonFile(paths_.images + "/" + opts_.name + "/manifest.json");
  bool replace = false;
  if (existing.ok()) {
    replace = true;
    RecordedBuild had = RecordedBuildOf(*existing);
    existing_recipe_sha_ = had.recipe_sha256;
    const bool checked = !(existing->is_object() && existing->value("checks_pending", false));
    if (checked && had.recipe_sha256 == p_->sha256 && had.base_manifest_sha256 == p_->base_sha256) {
      result.unchanged = true;
      return result;
    }
  }

  steps_ = 2 + (recipe.packages.empty() ? 0 : 1) + static_cast<int>(recipe.steps.size()) +
           (recipe.check.empty() ? 0 : 4);
  {
    ASSIGN_OR_RETURN(auto c, Client::Connect(paths_));
    std::lock_guard<std::mutex> lock(client_mu_);
    client_ = std::move(c);
  }
  if (interrupted_) return Cancelled("interrupted");
  RETURN_IF_ERROR(RemoveUncheckedLeftovers());

  Step("create: a VM of " + recipe.from +
       (recipe.allow.empty()
            ? ""
            : " (egress: " + OneLine(image::RecipeToJson(recipe)["allow"].dump()) + ")"));
  ASSIGN_OR_RETURN(std::string vm, Create(recipe.from, recipe.allow));

  if (!recipe.check.empty()) {
    Step("check on the base " + recipe.from);
    ASSIGN_OR_RETURN(bool all_pass, RunChecks(vm, /*must_pass=*/false));
    if (all_pass) {
      err_ << "trybox: warning: every check already passes on " << recipe.from
           << "; does the recipe install anything?\n";
    }
  }
  if (!recipe.packages.empty()) {
    std::string list;
    for (const auto& p : recipe.packages) list += (list.empty() ? "" : " ") + p;
    Step("packages: " + OneLine(list));
    RETURN_IF_ERROR(InstallPackages(vm));
  }
  for (size_t i = 0; i < recipe.steps.size(); ++i) {
    const image::RecipeStep& s = recipe.steps[i];
    const std::string where = "step " + std::to_string(i + 1);
    if (s.kind == image::RecipeStep::Kind::kCopy) {
      Step("copy: " + OneLine(s.copy) + " -> " + OneLine(s.to));
      ASSIGN_OR_RETURN(std::string src, image::ResolveCopySource(p_->recipe_dir, s.copy));
      std::string parent = s.to.substr(0, s.to.rfind('/'));
      std::string tail;
      if (!parent.empty()) {
        ASSIGN_OR_RETURN(int rc,
                         Exec(vm, "mkdir -p -- \"$1\"", "", {{"TRYBOX_ARG", parent}}, &tail));
        (void)rc;  // put names a missing parent itself
      }
      auto put = PutPath(*client_, vm, src, s.to);
      if (!put.ok()) return put.status().Annotate(where + " (copy " + s.copy + ")");
      continue;
    }
    Step("run: " + OneLine(s.run));
    std::map<std::string, std::string> env = recipe.env;
    for (const auto& [k, v] : s.env) env[k] = v;
    std::string tail;
    ASSIGN_OR_RETURN(int rc, Exec(vm, s.run, s.workdir, env, &tail));
    if (rc != 0) {
      return FailedPrecondition(where + " (run: " + OneLine(s.run) + ") failed with exit code " +
                                std::to_string(rc) + "; its last output:\n" + LastLines(tail));
    }
  }
  if (recipe.check.empty()) {
    Step("commit: freeze " + opts_.name + (replace ? " (replacing the old one)" : ""));
    RETURN_IF_ERROR(Commit(vm, opts_.name, &result));
    RETURN_IF_ERROR(Destroy(vm));
    return result;
  }
  // The name is given only to an image that passed every check in this build: the build VM
  // is frozen under a staged name marked checks_pending (never listed, never "unchanged"),
  // checked in a fresh VM of that, then frozen again (it has not changed) under the real
  // name, which swaps any old image out in one rename. A build killed before that leaves
  // only the staged image, which the next build of the name (or image prune) removes.
  staged_ = StagedPrefix() + RandomHex(8);
  Step("commit: freeze as " + staged_ + " until its checks pass");
  RETURN_IF_ERROR(Commit(vm, staged_, &result, /*checks_pending=*/true));
  RETURN_IF_ERROR(CheckFresh(staged_));
  Step("commit: freeze " + opts_.name + (replace ? " (replacing the old one)" : ""));
  RETURN_IF_ERROR(Commit(vm, opts_.name, &result, /*checks_pending=*/false));
  RETURN_IF_ERROR(Destroy(vm));
  RETURN_IF_ERROR(client_->Call({{"verb", "image_rm"}, {"name", staged_}}).status());
  staged_.clear();
  return result;
}

Status RecipeBuild::CheckFresh(const std::string& image) {
  Step("create: a fresh VM of " + image);
  ASSIGN_OR_RETURN(std::string check_vm, Create(image, {}));
  Step("check on " + image);
  RETURN_IF_ERROR(RunChecks(check_vm, /*must_pass=*/true).status());
  return Destroy(check_vm);
}

Result<std::string> RecipeBuild::Create(const std::string& image,
                                        const std::vector<std::string>& allow) {
  ASSIGN_OR_RETURN(auto s, client_->Open({{"verb", "create"},
                                          {"image", image},
                                          {"memory_mib", opts_.memory_mib},
                                          {"cpus", 1},
                                          {"allow", allow},
                                          {"ephemeral", true}}));
  for (;;) {
    ASSIGN_OR_RETURN(auto m, s->Next());
    if (m.kind == Kind::kReset) return StatusFromReset(m.body, "the create");
    if (m.kind != Kind::kEnd) continue;
    RETURN_IF_ERROR(StatusFromReply(m.body));
    ASSIGN_OR_RETURN(ReplyView v, ReplyView(m.body).Object("vm"));
    ASSIGN_OR_RETURN(std::string id, v.String("id"));
    if (!ValidateName("VM id", id).ok()) return MalformedReply("vm.id", "must be a VM id");
    vms_.push_back(id);
    return id;
  }
}

Status RecipeBuild::Destroy(const std::string& vm) {
  RETURN_IF_ERROR(client_->Call({{"verb", "destroy"}, {"vm", vm}}).status());
  std::erase(vms_, vm);
  return Status::Ok();
}

Result<int> RecipeBuild::Exec(const std::string& vm, const std::string& command,
                              const std::string& cwd, const std::map<std::string, std::string>& env,
                              std::string* tail) {
  std::vector<std::string> argv = {"/bin/sh", "-c", command};
  // An argument travels in the environment, never spliced into the command text.
  if (env.count("TRYBOX_ARG")) {
    argv = {"/bin/sh", "-c", command, "sh", env.at("TRYBOX_ARG")};
  }
  nlohmann::json e = nlohmann::json::object();
  for (const auto& [k, v] : env) {
    if (k != "TRYBOX_ARG") e[k] = v;
  }
  nlohmann::json req = {{"verb", "exec"}, {"vm", vm},        {"argv", argv},
                        {"env", e},       {"timeout_ms", 0}, {"stdin", false}};
  if (!cwd.empty()) req["cwd"] = cwd;
  ASSIGN_OR_RETURN(auto s, client_->Open(req));
  for (;;) {
    ASSIGN_OR_RETURN(auto m, s->Next());
    switch (m.kind) {
      case Kind::kData:
        *tail += m.data;
        if (tail->size() > 2 * kTailBytes) tail->erase(0, tail->size() - kTailBytes);
        if (opts_.progress) {
          err_.flush();
          (void)WriteFull(2, m.data);
        }
        break;
      case Kind::kEnd: {
        RETURN_IF_ERROR(StatusFromReply(m.body));
        ASSIGN_OR_RETURN(ReplyView result, ReplyView(m.body).Object("result"));
        std::string msg;
        int code = ExitCodeFor(result.json(), &msg);
        if (!msg.empty()) *tail += "\n(" + msg + ")";
        return code;
      }
      case Kind::kReset:
        return StatusFromReset(m.body, "the exec");
      default:
        break;
    }
  }
}

Result<bool> RecipeBuild::RunChecks(const std::string& vm, bool must_pass) {
  bool all = true;
  for (size_t i = 0; i < p_->recipe.check.size(); ++i) {
    const std::string& c = p_->recipe.check[i];
    std::string tail;
    ASSIGN_OR_RETURN(int rc, Exec(vm, c, "", p_->recipe.env, &tail));
    if (rc == 0) continue;
    all = false;
    if (must_pass) {
      return FailedPrecondition("check " + std::to_string(i + 1) + " (" + OneLine(c) +
                                ") failed in a fresh VM of " + opts_.name + " with exit code " +
                                std::to_string(rc) + "; its last output:\n" + LastLines(tail));
    }
  }
  return all;
}

Status RecipeBuild::InstallPackages(const std::string& vm) {
  RETURN_IF_ERROR(MakeDirs(paths_.cache + "/tmp"));
  ASSIGN_OR_RETURN(TempDir tmp, TempDir::Make(paths_.cache + "/tmp", "recipe-"));
  // Dependencies are resolved against what the guest has, not the host.
  RETURN_IF_ERROR(GetPath(*client_, vm, "/var/lib/dpkg/status", tmp.path() + "/status").status());
  ASSIGN_OR_RETURN(std::string suite, SuiteOf(paths_.images, p_->recipe.from));
  image::FetchDebsOptions fo;
  fo.packages = p_->recipe.packages;
  fo.suite = suite;
  fo.dpkg_status = tmp.path() + "/status";
  fo.cache_dir = paths_.cache;
  if (opts_.progress) fo.progress = [this](const std::string& l) { err_ << "  " << l << "\n"; };
  ASSIGN_OR_RETURN(image::FetchedDebs fetched, image::FetchDebs(fo));
  if (interrupted_) return Cancelled("interrupted");
  if (fetched.debs.empty()) {
    if (opts_.progress) err_ << "  every package is already in " << p_->recipe.from << "\n";
    return Status::Ok();
  }
  const std::string debs = tmp.path() + "/debs";
  RETURN_IF_ERROR(MakeDirs(debs));
  for (size_t i = 0; i < fetched.debs.size(); ++i) {
    const std::string from = fetched.archives + "/" + fetched.debs[i].file;
    // Numbered in apt's order, so the guest's apt sees them as it would have.
    const std::string to = debs + "/" + fetched.debs[i].file;
    if (::link(from.c_str(), to.c_str()) != 0) RETURN_IF_ERROR(CopyFile(from, to, 0644));
  }
  if (opts_.progress) err_ << "  copying " << fetched.debs.size() << " .debs into the VM\n";
  RETURN_IF_ERROR(PutPath(*client_, vm, debs, kGuestDebs).status());
  // dpkg, not apt: the guest has no package lists, and apt refuses local .debs then. One
  // dpkg call in apt's order unpacks the whole set before configuring it, so their
  // dependencies on each other are met.
  std::string files;
  for (const auto& d : fetched.debs) files += std::string(" ") + kGuestDebs + "/" + d.file;
  std::string tail;
  ASSIGN_OR_RETURN(int rc, Exec(vm,
                                "dpkg -i --force-confdef --force-confold" + files +
                                    "; rc=$?; rm -rf " + kGuestDebs + "; exit $rc",
                                "/", {{"DEBIAN_FRONTEND", "noninteractive"}}, &tail));
  if (rc != 0) {
    return FailedPrecondition("installing the packages in the VM (dpkg -i) failed with exit code " +
                              std::to_string(rc) + "; its last output:\n" + LastLines(tail));
  }
  return Status::Ok();
}

std::string RecipeBuild::StagedPrefix() const { return opts_.name.substr(0, 40) + "-next-"; }

Status RecipeBuild::RemoveUncheckedLeftovers() {
  auto names = ListDir(paths_.images);
  if (!names.ok()) return Status::Ok();  // no images directory yet
  for (const std::string& n : *names) {
    if (!n.starts_with(StagedPrefix())) continue;
    auto m = ReadJsonFile(paths_.images + "/" + n + "/manifest.json");
    if (!m.ok() || !m->is_object() || !m->value("checks_pending", false)) continue;
    auto r = client_->Call({{"verb", "image_rm"}, {"name", n}});
    if (r.ok()) {
      err_ << "trybox: removed " << n << ", the unchecked image of an interrupted build\n";
    } else if (r.status().code() != Code::kNotFound) {
      err_ << "trybox: warning: could not remove " << n
           << " (an interrupted build's): " << r.status().message() << "\n";
    }
  }
  return Status::Ok();
}

Status RecipeBuild::Commit(const std::string& vm, const std::string& name,
                           RecipeBuildResult* result, bool checks_pending) {
  if (name == opts_.name) commit_started_ = true;
  ASSIGN_OR_RETURN(auto s, client_->Open({{"verb", "commit"},
                                          {"vm", vm},
                                          {"name", name},
                                          {"env", p_->recipe.env},
                                          {"recipe", image::RecipeToJson(p_->recipe)},
                                          {"recipe_sha256", p_->sha256},
                                          {"packages", p_->recipe.packages},
                                          {"checks_pending", checks_pending},
                                          {"replace", true}}));
  for (;;) {
    ASSIGN_OR_RETURN(auto m, s->Next());
    if (m.kind == Kind::kReset) return StatusFromReset(m.body, "the commit");
    if (m.kind == Kind::kEvent) {
      auto progress = ReplyView(m.body).OptionalObject("progress");
      if (progress.ok() && *progress && opts_.progress) {
        auto msg = (*progress)->StringOr("message", "");
        if (msg.ok() && !msg->empty()) err_ << "  " << *msg << "\n";
      }
      continue;
    }
    if (m.kind != Kind::kEnd) continue;
    RETURN_IF_ERROR(StatusFromReply(m.body));
    auto img = ReplyView(m.body).OptionalObject("image");
    if (img.ok() && *img) {
      auto bytes = (*img)->IntOr("layer_bytes", -1, -1);
      if (bytes.ok()) result->layer_bytes = *bytes;
    }
    return Status::Ok();
  }
}

Status RecipeBuild::Cleanup() {
  if (vms_.empty() && !commit_started_ && staged_.empty()) return Status::Ok();
  Status first = Status::Ok();
  auto note = [&first](const Status& st) {
    if (!st.ok() && st.code() != Code::kNotFound && first.ok()) first = st;
  };
  std::unique_ptr<Client> c;
  {
    std::lock_guard<std::mutex> lock(client_mu_);
    if (!interrupted_) c = std::move(client_);
  }
  if (!c) {
    // The old connection was cut: its ephemeral VMs are being destroyed by the daemon.
    ASSIGN_OR_RETURN(c, Client::Connect(paths_, /*autostart=*/false));
  }
  for (const auto& vm : vms_) {
    // A destroy already under way (the daemon's, for a cut connection) is refused while it
    // runs; what counts is that the VM is gone before the image is removed.
    for (int attempt = 0;; ++attempt) {
      auto r = c->Call({{"verb", "destroy"}, {"vm", vm}});
      if (r.ok() || r.status().code() == Code::kNotFound || attempt == 50) {
        if (!r.ok()) note(r.status());
        break;
      }
      ::usleep(200 * 1000);
    }
  }
  vms_.clear();
  if (!staged_.empty()) note(c->Call({{"verb", "image_rm"}, {"name", staged_}}).status());
  if (commit_started_) {
    // Remove what this build committed, and only that: a commit cut short leaves any older
    // image of the name in place, and it names another recipe hash (or none).
    auto m = ReadJsonFile(paths_.images + "/" + opts_.name + "/manifest.json");
    if (m.ok() && RecordedBuildOf(*m).recipe_sha256 == p_->sha256) {
      note(c->Call({{"verb", "image_rm"}, {"name", opts_.name}}).status());
    }
  }
  return first;
}

bool UsesRecipe(const std::string& name, const std::string& recipe_file) {
  return !recipe_file.empty() || image::BuiltinRecipe(name).ok();
}

Status BuildOnFirstUse(const Paths& paths, const std::string& image, bool progress,
                       std::ostream& err) {
  auto dir = image::ImageDir(paths.images, image);
  if (dir.ok() || dir.status().code() != Code::kNotFound || !UsesRecipe(image, "")) {
    return Status::Ok();
  }
  err << "trybox: image " << image << " is not built yet; building it from its recipe"
      << (progress ? "" : " (minutes; progress with trybox image build " + image + ")") << "\n";
  RecipeBuild build(paths, {.name = image, .progress = progress}, err);
  return build.Run().status().Annotate("building " + image);
}

int CmdImageBuildRecipe(const Invocation& inv) {
  RecipeBuildOptions o;
  o.name = inv.image_name;
  o.recipe_file = inv.recipe_file;
  o.progress = ShowProgress(inv.quiet);
  // Shared with the signal thread, which outlives this call.
  auto build = std::make_shared<RecipeBuild>(Paths::FromEnvironment(), o, std::cerr);
  // Ctrl-C: cut the daemon connection (its ephemeral VMs go with it) and kill apt if it
  // runs; Run() then removes what the build made.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set, build] {
    int sig;
    if (sigwait(&set, &sig) == 0) {
      std::cerr << "trybox: interrupted; stopping the build\n";
      SignalAllChildren(SIGKILL);
      build->Interrupt();
    }
  }).detach();
  auto r = build->Run();
  if (!r.ok()) {
    std::cerr << "trybox: " << r.status().message() << "\n";
    return r.status().code() == Code::kCancelled ? 130 : 125;
  }
  if (r->unchanged) {
    std::cout << "image " << inv.image_name << " is up to date (recipe "
              << r->recipe_sha256.substr(0, 12) << ", base " << r->base << " unchanged)\n";
    return 0;
  }
  std::cout << "image " << inv.image_name << " built from " << r->base;
  if (r->layer_bytes >= 0) std::cout << " (its layer: " << r->layer_bytes << " bytes)";
  std::cout << "\n";
  return 0;
}

}  // namespace trybox::cli
