// Image-from-recipe benchmark (issue 11). Prints figures; asserts nothing.
//
//   build      `trybox image build NAME` from the recipe (the built-in debian-12-dev by
//              default, or -f RECIPE), with the daemon's and apt's caches as they are: run
//              it twice for the warm-cache figure (apt's lists and .debs are kept)
//   no-op      the same command again: decided from the manifest, no VM starts
//   first run  `trybox run --image NAME -- true`: builds the image's template
//   later run  the same again, restoring that template (median of --runs)
//   layer      the bytes the image's own layer takes on disk (image_ls own_bytes)
//
// Usage: image_bench [--name NAME] [-f RECIPE] [--runs N]
// Images go to TRYBOX_IMAGES (give a private one: this builds and removes NAME).
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "tests/e2e/harness.h"

using Json = nlohmann::json;
using trybox::bench::Clock;
using trybox::bench::Die;
using trybox::bench::Ms;
using trybox::bench::Pct;

int main(int argc, char** argv) {
  std::string name = "debian-12-dev", recipe;
  int runs = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--name")) name = argv[i + 1];
    if (!std::strcmp(argv[i], "-f")) recipe = argv[i + 1];
    if (!std::strcmp(argv[i], "--runs")) runs = std::atoi(argv[i + 1]);
  }
  auto h = trybox::e2e::Harness::Start();
  if (!h.ok()) Die("harness", h.status());
  std::vector<std::string> build = {"image", "build", name, "--quiet"};
  if (!recipe.empty()) build.insert(build.end(), {"-f", recipe});
  (void)(*h)->Call({{"verb", "image_rm"}, {"name", name}});

  auto t0 = Clock::now();
  auto b = (*h)->Cli(build);
  auto t1 = Clock::now();
  if (b.code != 0) Die("build", trybox::Internal(b.err));
  std::printf("build %-16s %10.0f ms\n", name.c_str(), Ms(t0, t1));

  auto n0 = Clock::now();
  auto again = (*h)->Cli(build);
  auto n1 = Clock::now();
  if (again.code != 0) Die("no-op rebuild", trybox::Internal(again.err));
  std::printf("no-op rebuild          %10.1f ms\n", Ms(n0, n1));

  auto r0 = Clock::now();
  auto first = (*h)->Cli({"run", "--image", name, "--quiet", "--", "true"});
  auto r1 = Clock::now();
  if (first.code != 0) Die("first run", trybox::Internal(first.err));
  std::printf("first run (template)   %10.0f ms\n", Ms(r0, r1));
  std::vector<double> later;
  for (int i = 0; i < runs; ++i) {
    auto a = Clock::now();
    auto r = (*h)->Cli({"run", "--image", name, "--quiet", "--", "true"});
    auto z = Clock::now();
    if (r.code != 0) Die("later run", trybox::Internal(r.err));
    later.push_back(Ms(a, z));
  }
  std::printf("later run (restored)   %10.0f ms median of %d\n", Pct(later, 50), runs);

  auto ls = (*h)->Call({{"verb", "image_ls"}});
  if (ls.ok()) {
    for (const auto& im : (*ls)["images"]) {
      if (im.value("name", "") == name) {
        std::printf("own layer on disk      %10.1f MiB\n",
                    static_cast<double>(im.value("own_bytes", int64_t{0})) / (1 << 20));
      }
    }
  }
  return 0;
}
