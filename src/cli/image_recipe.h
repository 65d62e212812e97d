// `trybox image build NAME -f RECIPE`: an image built from a recipe (image/recipe.h) by
// composing the daemon's verbs, never by running a step on the host (docs/images.md,
// "Recipes"):
//
//   create (the base, the recipe's allow-list, ephemeral) -> checks on the base (a warning
//   when all pass) -> packages (resolved and downloaded on the host, image/debs.h; put into
//   the VM; installed there by apt offline) -> steps (exec as root / put) -> commit (the
//   freeze, with the recipe, its hash and the packages) -> destroy -> create (the new image)
//   -> checks -> destroy.
//
// With checks, the image is first committed under a staged name marked checks_pending and
// gets its own name only after every check passed in a fresh VM of it; an image listed under
// the name has passed them in this build. Any failure or interruption destroys the VMs it
// created and removes what it committed, so nothing is listed; a build killed outright
// leaves only the unlisted staged image, removed by the next build of the name. Unchanged recipe
// and base (hashes in the manifest): no VM starts. One build runs at a time per RecipeBuild object;
// not thread-safe except Interrupt().
#pragma once

#include <atomic>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <string>

#include "cli/client.h"
#include "util/paths.h"
#include "util/status.h"

namespace trybox::cli {

struct RecipeBuildOptions {
  std::string name;         // the image to build
  std::string recipe_file;  // "" = the built-in recipe of that name (images/NAME.json)
  bool progress = true;     // per-step lines and the steps' output on `err`
  int64_t memory_mib = 1024;
};

struct RecipeBuildResult {
  bool unchanged = false;  // the image already holds this recipe over this base
  std::string recipe_sha256;
  std::string base;
  int64_t layer_bytes = -1;  // from the commit reply, when it says
};

class RecipeBuild {
 public:
  RecipeBuild(Paths paths, RecipeBuildOptions opts, std::ostream& err)
      : paths_(std::move(paths)), opts_(std::move(opts)), err_(err) {}

  // Builds. kCancelled "interrupted" after Interrupt().
  Result<RecipeBuildResult> Run();

  // From another thread (a signal handler's thread): closes the daemon connection, so the
  // ephemeral VMs go and the waiting call returns; Run() then cleans up and returns.
  void Interrupt();

 private:
  Result<RecipeBuildResult> Build();
  Status Cleanup();
  Result<std::string> Create(const std::string& image, const std::vector<std::string>& allow);
  Status Destroy(const std::string& vm);
  // Runs `command` (sh -c) as root; its output streams to err_ when progress is on; the
  // last lines are kept in `*tail`. Returns the exit code (125 if trybox failed).
  Result<int> Exec(const std::string& vm, const std::string& command, const std::string& cwd,
                   const std::map<std::string, std::string>& env, std::string* tail);
  // All of the recipe's checks in `vm`; the first failure as an error when `must_pass`.
  Result<bool> RunChecks(const std::string& vm, bool must_pass);
  Status InstallPackages(const std::string& vm);
  // Creates a fresh VM of `image`, runs every check there (the first failure is the error),
  // and destroys it.
  Status CheckFresh(const std::string& image);
  // Freezes `vm` as the image `name` (marked checks_pending: a staged image, image/image.h).
  Status Commit(const std::string& vm, const std::string& name, RecipeBuildResult* result,
                bool checks_pending = false);
  // "NAME-next-": the staged images of this name's builds.
  std::string StagedPrefix() const;
  // Removes staged images of this name still marked checks_pending: an interrupted build's.
  Status RemoveUncheckedLeftovers();
  void Step(const std::string& what);

  Paths paths_;
  RecipeBuildOptions opts_;
  std::ostream& err_;
  std::unique_ptr<Client> client_;
  std::mutex client_mu_;  // Interrupt() vs client_ changes
  std::atomic<bool> interrupted_{false};

  // What the build has made, for Cleanup().
  std::vector<std::string> vms_;
  bool commit_started_ = false;
  // A rebuild with checks commits here first, so a failing check keeps the old image.
  std::string staged_;
  std::string existing_recipe_sha_;  // of the image `name` before this build ("" if none)

  // Set by Build() once parsed.
  struct Parsed;
  std::shared_ptr<Parsed> p_;
  int step_ = 0, steps_ = 0;
};

struct Invocation;

// Whether `trybox image build NAME [-f FILE]` builds from a recipe: with -f, or when NAME
// has a built-in recipe (debian-12-dev). debian-12 itself is the base build (image/image.h).
bool UsesRecipe(const std::string& name, const std::string& recipe_file);

// An image with a built-in recipe (debian-12-dev) that is not built yet is built now, with
// a line on `err` saying so (and its progress when `progress`); any other image, or one
// already built, is left to the daemon (which names a missing one). For run, create, agent
// and the MCP tool alike.
Status BuildOnFirstUse(const Paths& paths, const std::string& image, bool progress,
                       std::ostream& err);

// The command: progress on stderr (ShowProgress), Ctrl-C stops and cleans up (exit 130).
int CmdImageBuildRecipe(const Invocation& inv);

// The base sha256 and recipe sha256 an image's manifest records ("" when absent); used for
// the no-op decision. Exposed for tests.
struct RecordedBuild {
  std::string recipe_sha256;
  std::string base_manifest_sha256;
};
RecordedBuild RecordedBuildOf(const nlohmann::json& manifest);

}  // namespace trybox::cli
