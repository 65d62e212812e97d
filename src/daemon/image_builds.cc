#include "daemon/image_builds.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <csignal>
#include <string_view>

extern char** environ;

#include "image/recipe.h"
#include "util/log.h"
#include "util/names.h"
#include "util/utf8.h"

namespace trybox::daemon {

namespace {

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// How long a build has to clean up after SIGINT when the daemon stops.
constexpr auto kStopGrace = std::chrono::seconds(30);

}  // namespace

ImageBuilds::~ImageBuilds() { Shutdown(); }

Result<std::string> ImageBuilds::Start(const std::string& name, const Json& recipe) {
  RETURN_IF_ERROR(ValidateName("image name", name));
  std::string recipe_path;
  if (recipe.is_null()) {
    // The built-in recipe of that name, as `trybox image build NAME` finds it.
    RETURN_IF_ERROR(image::BuiltinRecipe(name).status().Annotate(
        "no recipe was given and none is built in for " + name));
  } else {
    if (!recipe.is_object()) return InvalidArgument("recipe must be a JSON object");
    const std::string text = recipe.dump();
    ASSIGN_OR_RETURN(image::Recipe parsed, image::ParseRecipe(text));
    for (const image::RecipeStep& step : parsed.steps) {
      if (step.kind == image::RecipeStep::Kind::kCopy) {
        return InvalidArgument(
            "a recipe sent over HTTP has no folder to copy from: its copy steps need "
            "`trybox image build NAME -f RECIPE` on the host");
      }
    }
    RETURN_IF_ERROR(MakeDirs(settings_.work_dir, 0700));
    recipe_path = settings_.work_dir + "/" + NewId() + ".json";
    RETURN_IF_ERROR(WriteFileAtomic(recipe_path, text, 0600));
  }

  auto b = std::make_shared<Build>();
  b->id = NewId();
  b->name = name;
  b->recipe = recipe_path.empty() ? "builtin" : "posted";
  b->started_at = UnixNow();

  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return ErrnoError("pipe for an image build");
  UniqueFd read_end(out[0]), write_end(out[1]);
  SpawnOptions opts;
  // The name after "--": checked above, and still never an option of the CLI.
  opts.argv = {settings_.trybox_binary, "image", "build"};
  if (!recipe_path.empty()) {
    opts.argv.push_back("-f");
    opts.argv.push_back(recipe_path);
  }
  opts.argv.push_back("--");
  opts.argv.push_back(name);
  // The daemon's own environment, with the CLI's per-step progress on although its output
  // is no terminal: the progress is what a follower watches.
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    if (std::string_view(*e).rfind("TRYBOX_PROGRESS=", 0) != 0) env.emplace_back(*e);
  }
  env.emplace_back("TRYBOX_PROGRESS=always");
  opts.env = std::move(env);
  opts.stdout_fd = write_end.get();
  opts.stderr_fd = write_end.get();

  MutexLock lock(mu_);
  if (stopping_) return Unavailable("the daemon is stopping");
  for (const auto& other : builds_) {
    if (other->name == name && other->state == "running") {
      return FailedPrecondition("image " + name + " is being built (build " + other->id + ")");
    }
  }
  ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Spawn(opts));
  write_end.Reset();  // the child's copy is the only one: EOF when it exits
  b->child.emplace(std::move(child));
  LogInfo("image", "build " + b->id + " of " + name + " from the " + b->recipe +
                       " recipe started (pid " + std::to_string(b->child->pid()) + ")");
  b->reader =
      std::thread([this, b, fd = std::move(read_end)]() mutable { Read(b, std::move(fd)); });
  // Ended builds past the cap go, the oldest first.
  size_t ended = 0;
  for (const auto& x : builds_) ended += x->state != "running";
  for (auto it = builds_.begin(); ended >= settings_.max_builds && it != builds_.end();) {
    if ((*it)->state != "running") {
      if ((*it)->reader.joinable()) (*it)->reader.join();
      it = builds_.erase(it);
      --ended;
    } else {
      ++it;
    }
  }
  builds_.push_back(b);
  return b->id;
}

void ImageBuilds::KeepLine(Build& b, std::string_view line) {
  b.lines.push_back(JsonSafe(line));
  if (b.lines.size() > settings_.max_lines) {
    const size_t drop = b.lines.size() - settings_.max_lines;
    b.lines.erase(b.lines.begin(), b.lines.begin() + static_cast<std::ptrdiff_t>(drop));
    b.dropped += static_cast<int64_t>(drop);
  }
}

void ImageBuilds::AddOutput(Build& b, std::string_view bytes) {
  b.partial.append(bytes);
  size_t start = 0;
  for (size_t nl; (nl = b.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    KeepLine(b, std::string_view(b.partial).substr(start, nl - start));
  }
  b.partial.erase(0, start);
  if (b.partial.size() > 64 * 1024) {  // a line with no end: cut it where it is
    KeepLine(b, b.partial);
    b.partial.clear();
  }
}

void ImageBuilds::Read(std::shared_ptr<Build> b, UniqueFd out) {
  // Until the child exits: its output as it comes. Not until the output's end: a process
  // the child left behind may hold the pipe open long after (a `sleep` in a step).
  // The child is reaped under the lock, as Cancel signals it under the lock: no signal can
  // reach a pid reused after the reap.
  std::optional<ExitInfo> exit;
  char buf[16 * 1024];
  bool open = true;
  for (;;) {
    pollfd p = {out.get(), POLLIN, 0};
    const int ready = open ? ::poll(&p, 1, 200) : 0;
    if (ready > 0) {
      const ssize_t n = ::read(out.get(), buf, sizeof buf);
      if (n > 0) {
        MutexLock lock(mu_);
        AddOutput(*b, std::string_view(buf, static_cast<size_t>(n)));
        changed_.SignalAll();
        continue;
      }
      if (n == 0 || errno != EINTR) open = false;
    } else if (!open) {
      ::usleep(200 * 1000);
    }
    MutexLock lock(mu_);
    const pid_t group = b->child->pid();
    Result<std::optional<ExitInfo>> done = b->child->TryWait();
    if (!done.ok() || done->has_value()) {
      if (done.ok()) exit = **done;
      // What the child left running goes with it; the output it had written is kept.
      ::kill(-group, SIGKILL);
      break;
    }
  }
  // What was written before the exit and is still in the pipe; without waiting for a
  // writer of another process group, if one kept the pipe.
  (void)::fcntl(out.get(), F_SETFL, ::fcntl(out.get(), F_GETFL) | O_NONBLOCK);
  for (ssize_t n; open && (n = ::read(out.get(), buf, sizeof buf)) > 0;) {
    MutexLock lock(mu_);
    AddOutput(*b, std::string_view(buf, static_cast<size_t>(n)));
  }
  MutexLock lock(mu_);
  if (!b->partial.empty()) {
    KeepLine(*b, b->partial);
    b->partial.clear();
  }
  b->ended_at = UnixNow();
  if (exit && exit->exited) b->exit_code = exit->code;
  if (b->cancel_asked) {
    b->state = "cancelled";
  } else {
    b->state = b->exit_code && *b->exit_code == 0 ? "built" : "failed";
  }
  LogInfo("image", "build " + b->id + " of " + b->name + ": " + b->state +
                       (b->exit_code ? " (exit " + std::to_string(*b->exit_code) + ")" : ""));
  changed_.SignalAll();
}

Json ImageBuilds::Summary(const Build& b) {
  Json j = {{"id", b.id},
            {"name", b.name},
            {"recipe", b.recipe},
            {"state", b.state},
            {"started_at", b.started_at},
            {"ended_at", b.state == "running" ? Json(nullptr) : Json(b.ended_at)},
            {"lines", b.dropped + static_cast<int64_t>(b.lines.size())}};
  if (b.exit_code) j["exit_code"] = *b.exit_code;
  if (!b.lines.empty()) j["last_line"] = b.lines.back();
  return j;
}

Json ImageBuilds::List() {
  MutexLock lock(mu_);
  Json list = Json::array();
  for (auto it = builds_.rbegin(); it != builds_.rend(); ++it) list.push_back(Summary(**it));
  return {{"builds", list}};
}

Result<Json> ImageBuilds::Show(const std::string& id) {
  MutexLock lock(mu_);
  for (const auto& b : builds_) {
    if (b->id == id) return Json{{"build", Summary(*b)}};
  }
  return NotFound("no image build with id '" + id + "'");
}

Result<ImageBuilds::Chunk> ImageBuilds::Follow(const std::string& id, int64_t from,
                                               std::chrono::steady_clock::time_point until) {
  MutexLock lock(mu_);
  std::shared_ptr<Build> b;
  for (const auto& x : builds_) {
    if (x->id == id) b = x;
  }
  if (!b) return NotFound("no image build with id '" + id + "'");
  for (;;) {
    const int64_t end = b->dropped + static_cast<int64_t>(b->lines.size());
    const bool ended = b->state != "running";
    if (from < end || ended || stopping_ || std::chrono::steady_clock::now() >= until) {
      Chunk c;
      c.first = std::max(from, b->dropped);
      for (int64_t i = c.first; i < end; ++i) c.lines.push_back(b->lines[i - b->dropped]);
      c.ended = ended;
      return c;
    }
    (void)changed_.WaitUntil(mu_, until);
  }
}

Status ImageBuilds::Cancel(const std::string& id) {
  MutexLock lock(mu_);
  for (const auto& b : builds_) {
    if (b->id != id) continue;
    if (b->state != "running") {
      return FailedPrecondition("image build " + id + " has ended (" + b->state + ")");
    }
    b->cancel_asked = true;
    // The CLI answers SIGINT by cutting its daemon connection and removing what it made.
    return b->child->Signal(SIGINT);
  }
  return NotFound("no image build with id '" + id + "'");
}

void ImageBuilds::Shutdown() {
  std::vector<std::shared_ptr<Build>> builds;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    builds = builds_;
    for (const auto& b : builds) {
      if (b->state == "running") {
        b->cancel_asked = true;
        (void)b->child->Signal(SIGINT);
      }
    }
    changed_.SignalAll();
  }
  const auto deadline = std::chrono::steady_clock::now() + kStopGrace;
  for (const auto& b : builds) {
    {
      MutexLock lock(mu_);
      while (b->state == "running" && std::chrono::steady_clock::now() < deadline) {
        (void)changed_.WaitUntil(mu_, deadline);
      }
      if (b->state == "running") (void)b->child->Signal(SIGKILL);
    }
    if (b->reader.joinable()) b->reader.join();
  }
}

}  // namespace trybox::daemon
