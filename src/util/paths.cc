#include "util/paths.h"

#include <unistd.h>

#include <cstdlib>

namespace trybox {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : "";
}

std::string XdgDir(const char* var, const char* fallback_under_home) {
  std::string v = Env(var);
  if (!v.empty()) return v;
  std::string home = Env("HOME");
  if (home.empty()) home = "/root";
  return home + "/" + fallback_under_home;
}

}  // namespace

Paths Paths::FromEnvironment() {
  Paths p;
  std::string home = Env("TRYBOX_HOME");
  if (!home.empty()) {
    p.state = home + "/state";
    p.runtime = home + "/run";
    p.config = home + "/config";
    p.images = home + "/images";
    p.cache = home + "/cache";
  } else {
    p.state = XdgDir("XDG_STATE_HOME", ".local/state") + "/trybox";
    p.config = XdgDir("XDG_CONFIG_HOME", ".config") + "/trybox";
    p.images = XdgDir("XDG_DATA_HOME", ".local/share") + "/trybox/images";
    p.cache = XdgDir("XDG_CACHE_HOME", ".cache") + "/trybox";
    std::string rt = Env("XDG_RUNTIME_DIR");
    p.runtime = rt.empty() ? "/tmp/trybox-" + std::to_string(::getuid()) : rt + "/trybox";
  }
  if (!Env("TRYBOX_IMAGES").empty()) p.images = Env("TRYBOX_IMAGES");
  if (!Env("TRYBOX_CACHE").empty()) p.cache = Env("TRYBOX_CACHE");
  return p;
}

}  // namespace trybox
