// Workspace benchmark (issue 5). Prints figures; asserts nothing.
//
//   inject  (workspace_in: git ls-files, sha256 + git blobs of every file, tar, guest untar)
//   collect (guest tar, safe extraction on the host, manifest, diff, commit of one change)
//   beside  host `tar -c | tar -x` of the same tree, the host-only planning step, and the
//           same tree through the plain put/get verbs (trybox cp)
//
// Usage: workspace_bench [--files N] [--mib N] [--quick] [--figures FILE]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/baseline.h"
#include "bench/bench_util.h"
#include "cli/client.h"
#include "cli/transfer.h"
#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "workspace/testing.h"
#include "workspace/workspace.h"

using trybox::Status;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using Kind = trybox::channel::Stream::Message::Kind;

namespace {

double Sec(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A failed step throws (bench_util.h's Fail), so that the repository's temporary directory
// and the harness's daemon and VMs are cleaned up on the way out of Run.
[[noreturn]] void Die(const std::string& what, const Status& st) { trybox::bench::Fail(what, st); }

void Row(const char* what, double s, double mib) {
  std::printf("  %-44s %7.2f s  %7.1f MB/s\n", what, s, mib * 1.048576 / s);
}

}  // namespace

int Run(int argc, char** argv) {
  int files = 5000, mib = 200;
  std::string figures_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      files = 1000;
      mib = 40;
      continue;
    }
    const bool valued = !std::strcmp(argv[i], "--files") || !std::strcmp(argv[i], "--mib") ||
                        !std::strcmp(argv[i], "--figures");
    if (!valued || i + 1 >= argc) {
      std::fprintf(stderr,
                   "usage: workspace_bench [--quick] [--files N] [--mib N] [--figures FILE]\n");
      return 2;
    }
    if (!std::strcmp(argv[i], "--files")) files = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--mib")) mib = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--figures")) figures_path = argv[i + 1];
    ++i;
  }
  if (files <= 0 || mib <= 0) {
    std::fprintf(stderr, "workspace_bench: --files and --mib take a positive number\n");
    return 2;
  }
  trybox::bench::FiguresFile figures(figures_path);
  auto tmp = trybox::TempDir::Make("/tmp", "tbx-wsbench-");
  if (!tmp.ok()) Die("tmp", tmp.status());
  std::string home = tmp->path() + "/home", repo = tmp->path() + "/repo";
  (void)trybox::MakeDirs(home);
  std::fprintf(stderr, "making a %d-file, %d MiB repository...\n", files, mib);
  auto made = trybox::workspace::testing::Sh(
      home, "git init -q -b main '" + repo + "' && cd '" + repo +
                "' && python3 -c \"\nimport os\nn=" + std::to_string(files) +
                "\nsize=" + std::to_string(mib) +
                "*1048576//n\nfor i in range(n):\n d='src/d%03d' % (i % 100)\n "
                "os.makedirs(d, exist_ok=True)\n open('%s/f%05d.bin' % (d, i), "
                "'wb').write(os.urandom(size))\n\" && git add -A && git commit -qm init");
  if (!made.ok()) Die("make repo", made.status());

  std::printf("workspace: %d files, %d MiB (random bytes), one TCG guest\n", files, mib);
  // The host's own copy, the baseline: three runs, each into a fresh directory, and their
  // median (one run moved by 4x here with the writeback of the repository just made).
  std::vector<double> tar_runs;
  for (int k = 0; k < 3; ++k) {
    const std::string x = tmp->path() + "/x" + std::to_string(k);
    auto t = Clock::now();
    auto tar = trybox::workspace::testing::Sh(home, "mkdir '" + x + "' && tar -C '" + repo +
                                                        "' --exclude=.git -cf - . | tar -C '" + x +
                                                        "' -xf -");
    tar_runs.push_back(Sec(t, Clock::now()));
    if (!tar.ok()) Die("host tar", tar.status());
  }
  std::vector<double> sorted_tar = tar_runs;
  std::sort(sorted_tar.begin(), sorted_tar.end());
  const double host_tar = sorted_tar[1];
  auto t1 = Clock::now();
  auto plan = trybox::workspace::PlanInject(repo, 0);
  auto t2 = Clock::now();
  if (!plan.ok()) Die("plan", plan.status());

  auto h = trybox::e2e::Harness::Start();
  if (!h.ok()) Die("harness", h.status());
  ::setenv("TRYBOX_HOME", (*h)->home().c_str(), 1);
  auto client = trybox::cli::Client::Connect(trybox::Paths::FromEnvironment(), false);
  if (!client.ok()) Die("connect", client.status());
  auto& c = **client;
  auto vm = c.Call({{"verb", "create"}});
  if (!vm.ok()) Die("create", vm.status());
  std::string id = (*vm)["vm"]["id"];

  auto t3 = Clock::now();
  auto in = c.Call({{"verb", "workspace_in"}, {"vm", id}, {"dir", repo}});
  auto t4 = Clock::now();
  if (!in.ok()) Die("workspace_in", in.status());
  auto ex = c.Call(
      {{"verb", "exec"}, {"vm", id}, {"argv", {"sh", "-c", "echo x >> src/d000/f00000.bin"}}});
  if (!ex.ok()) Die("exec", ex.status());
  auto t5 = Clock::now();
  auto nc = c.Call({{"verb", "collect"}, {"vm", id}, {"commit", false}});
  auto t6 = Clock::now();
  if (!nc.ok()) Die("collect", nc.status());
  auto col = c.Call({{"verb", "collect"}, {"vm", id}, {"command", "bench"}});
  auto t7 = Clock::now();
  if (!col.ok()) Die("collect", col.status());
  // The same tree through the plain put/get verbs (trybox cp), for the transport's share.
  auto t8 = Clock::now();
  auto put = trybox::cli::PutPath(c, id, repo + "/src", "/srv/copy");
  auto t9 = Clock::now();
  if (!put.ok()) Die("cp in", put.status());
  auto get = trybox::cli::GetPath(c, id, "/srv/copy", tmp->path() + "/back");
  auto t10 = Clock::now();
  if (!get.ok()) Die("cp out", get.status());
  (void)c.Call({{"verb", "destroy"}, {"vm", id}});

  double total = static_cast<double>(mib);
  Row("host: tar -c | tar -x of the same tree", host_tar, total);
  std::printf("    (median of 3 runs: %.2f, %.2f, %.2f s)\n", tar_runs[0], tar_runs[1],
              tar_runs[2]);
  Row("host: plan (ls-files, sha256, git blobs)", Sec(t1, t2), total);
  Row("inject: workspace_in (plan + tar + guest)", Sec(t3, t4), total);
  Row("collect: guest tar + safe extract + diff", Sec(t5, t6), total);
  Row("collect + commit of one changed file", Sec(t6, t7), total);
  Row("trybox cp DIR ID:/srv/copy (put, tar)", Sec(t8, t9), total);
  Row("trybox cp ID:/srv/copy DIR (get, tar)", Sec(t9, t10), total);
  std::printf("  changes seen by the daemon: %zu; commit %s\n", (*col)["collect"]["changes"].size(),
              (*col)["collect"]["commit"].get<std::string>().c_str());
  const double in_out = Sec(t3, t4) + Sec(t5, t6);
  std::printf("  workspace in + out: %.2f s, %.1fx host tar | tar; load %s\n", in_out,
              in_out / host_tar, trybox::bench::LoadAverage().c_str());
  figures.Lower("workspace.in_out_vs_tar", in_out / host_tar, "x",
                "workspace in + out / host tar | tar");
  figures.Higher("workspace.in_mb_s", total * 1.048576 / Sec(t3, t4), "MB/s", "workspace in");
  figures.Higher("workspace.out_mb_s", total * 1.048576 / Sec(t5, t6), "MB/s",
                 "workspace out (collect)");
  figures.Higher("files.cp_tree_in_mb_s", total * 1.048576 / Sec(t8, t9), "MB/s",
                 "trybox cp of a tree, in");
  figures.Higher("files.cp_tree_out_mb_s", total * 1.048576 / Sec(t9, t10), "MB/s",
                 "trybox cp of a tree, out");
  Status st = figures.Write();
  if (!st.ok()) Die("write figures", st);
  return 0;
}

int main(int argc, char** argv) {
  return trybox::bench::Guarded([&] { return Run(argc, argv); });
}
