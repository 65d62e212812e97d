// ImageBuilds: recipe builds started over HTTP (the dashboard's Images page,
// docs/dashboard.md "Image builds"), each a `trybox image build NAME [-f RECIPE]` child of
// the daemon, so that a build over HTTP is exactly the CLI's (docs/images.md "Recipes": the
// same verbs, checks and clean-up) and a build that fails takes nothing of the daemon with
// it. The child's output is kept, line by line, for followers that come and go; Cancel sends
// it SIGINT, which the CLI answers by removing what the build made.
//
// Thread-safe. Lock order: mu_ alone.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "util/fd.h"
#include "util/mutex.h"
#include "util/process.h"
#include "util/status.h"

namespace trybox::daemon {

struct ImageBuildSettings {
  std::string trybox_binary;  // the CLI that runs a build
  std::string work_dir;       // where posted recipes are written (private)
  size_t max_lines = 20000;   // lines kept per build; older ones are dropped
  size_t max_builds = 50;     // ended builds kept for showing; the oldest go first
};

using Json = nlohmann::json;

class ImageBuilds {
 public:
  explicit ImageBuilds(ImageBuildSettings settings) : settings_(std::move(settings)) {}
  // Interrupts every running build and waits for it (Shutdown).
  ~ImageBuilds();
  ImageBuilds(const ImageBuilds&) = delete;
  ImageBuilds& operator=(const ImageBuilds&) = delete;

  // Starts building image `name` from `recipe` (a recipe's JSON; docs/images.md), or from
  // the built-in recipe of that name when `recipe` is null. Its id. INVALID_ARGUMENT for a
  // bad name, a recipe that does not parse or has `copy` steps (a posted recipe has no
  // folder), NOT_FOUND for no built-in recipe of that name, FAILED_PRECONDITION while a
  // build of that name runs.
  Result<std::string> Start(const std::string& name, const Json& recipe) EXCLUDES(mu_);
  // {builds: [...]}: each build's summary (below), newest first.
  Json List() EXCLUDES(mu_);
  // {build: {id, name, recipe, state, started_at, ended_at, exit_code?, lines}} where
  // `state` is running, built, failed or cancelled; NOT_FOUND for an unknown id.
  Result<Json> Show(const std::string& id) EXCLUDES(mu_);

  struct Chunk {
    int64_t first = 0;               // the line number of lines[0] (0-based, whole build)
    std::vector<std::string> lines;  // from `from` on (or the oldest kept, past it)
    bool ended = false;              // and nothing more will come
  };
  // Lines from number `from` on, waiting until `until` for some when there are none yet.
  Result<Chunk> Follow(const std::string& id, int64_t from,
                       std::chrono::steady_clock::time_point until) EXCLUDES(mu_);
  // SIGINT to a running build: FAILED_PRECONDITION once it ended.
  Status Cancel(const std::string& id) EXCLUDES(mu_);
  // Interrupts every running build; waits up to 30 s for each, then kills it.
  void Shutdown() EXCLUDES(mu_);

 private:
  struct Build {
    std::string id, name, recipe;  // recipe: "builtin" or "posted"
    double started_at = 0, ended_at = 0;
    std::string state = "running";
    std::optional<int> exit_code;
    bool cancel_asked = false;
    int64_t dropped = 0;  // lines dropped from the front
    std::vector<std::string> lines;
    std::string partial;  // the last line, until its newline
    std::optional<ChildProcess> child;
    std::thread reader;
  };
  Json Summary(const Build& b) REQUIRES(mu_);
  void Read(std::shared_ptr<Build> b, UniqueFd out) EXCLUDES(mu_);
  void AddOutput(Build& b, std::string_view bytes) REQUIRES(mu_);
  void KeepLine(Build& b, std::string_view line) REQUIRES(mu_);

  const ImageBuildSettings settings_;
  Mutex mu_;
  CondVar changed_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<Build>> builds_ GUARDED_BY(mu_);  // oldest first
};

}  // namespace trybox::daemon
