// trybox-image-build: builds a base image from its built-in recipe (image::BuildImage), as a
// program of its own. `trybox image build NAME` execs it: the kernel and initramfs code it
// needs brings libarchive, and the CLI would map that before main on every command
// (docs/performance.md, "The CLI's start").
//
// Usage (by trybox only): trybox-image-build NAME [--rebuild-rootfs] [--progress]
// The paths come from the environment as for trybox (util/paths.h). Exit 0 when built; 125
// with "trybox: <reason>" on stderr as the CLI's own failures; 130 when interrupted.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <thread>

#include "image/image.h"
#include "util/paths.h"
#include "util/process.h"

namespace {

constexpr int kFailed = 125;
constexpr int kInterrupted = 130;

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::cerr << "usage: trybox-image-build NAME [--rebuild-rootfs] [--progress] (started by "
                 "trybox image build)\n";
    return 2;
  }
  trybox::Paths paths = trybox::Paths::FromEnvironment();
  trybox::image::BuildOptions o;
  o.name = argv[1];
  o.images_root = paths.images;
  o.cache_dir = paths.cache;
  o.init_binary = trybox::BinaryBesideSelf("trybox-init");
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rebuild-rootfs") == 0) {
      o.rebuild_rootfs = true;
    } else if (std::strcmp(argv[i], "--progress") == 0) {
      o.progress = [](const std::string& line) { std::cerr << line << "\n"; };
    } else {
      std::cerr << "trybox-image-build: unknown argument " << argv[i] << "\n";
      return 2;
    }
  }
  // Ctrl-C: kill the build's children (mmdebstrap runs in its own process group and would
  // not see the terminal's signal), so the build fails and removes its partial output.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  static std::atomic<bool> interrupted{false};
  o.cancelled = [] { return interrupted.load(); };
  std::thread([set] {
    int sig;
    if (sigwait(&set, &sig) == 0) {
      interrupted = true;
      std::cerr << "trybox: interrupted; stopping the build\n";
      trybox::SignalAllChildren(SIGKILL);
    }
  }).detach();
  trybox::Status st = trybox::image::BuildImage(o);
  if (interrupted) return kInterrupted;
  if (!st.ok()) {
    std::cerr << "trybox: " << st.message() << "\n";
    return kFailed;
  }
  std::cout << "image " << o.name << " built in " << paths.images << "/" << o.name << "\n";
  return 0;
}
