// vm_agent benchmark (issue 6). Prints figures; asserts nothing.
//
//   per turn   the daemon's overhead in one agent turn: the turn's wall time minus the
//              model request and minus the commands' own run time as the guest measured
//              it (the report's turn_times). Beside it, the same command through a plain
//              `exec` verb in the same process, as the baseline.
//   end to end `trybox agent` for a 5-turn scripted task (write, run, read, list, finish
//              with a verification): VM start, workspace in, 5 model turns, collect and
//              commit, the supervisor's re-run in a fresh VM.
//
// The model is tests/fake_model's scripted server on loopback, answering at once, so
// model time is the HTTP round trip only.
//
// Usage: agent_bench [--runs N] [--turns N]
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "cli/client.h"
#include "tests/e2e/harness.h"
#include "tests/fake_model/fake_model.h"
#include "util/fd.h"
#include "util/paths.h"

using Json = nlohmann::json;
using trybox::bench::Clock;
using trybox::bench::Die;
using trybox::bench::Ms;
using trybox::bench::Pct;
using trybox::testing::FakeModelServer;

namespace {

Json Turn(const std::string& tool, Json input) {
  return {{"tool_calls", {{{"name", tool}, {"input", std::move(input)}}}}};
}

void Row(const char* what, const std::vector<double>& v, const char* unit = "ms") {
  std::printf("  %-52s p50 %8.2f %s  p99 %8.2f %s  (n=%zu)\n", what, Pct(v, 50), unit, Pct(v, 99),
              unit, v.size());
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 10, turns = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--runs")) runs = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--turns")) turns = std::atoi(argv[i + 1]);
  }
  auto model = FakeModelServer::Start();
  if (!model.ok()) Die("fake model", model.status());
  FakeModelServer& m = **model;
  auto h = trybox::e2e::Harness::Start(
      {"OPENAI_BASE_URL=" + m.openai_base_url(), "OPENAI_MODEL=bench", "OPENAI_API_KEY=bench"});
  if (!h.ok()) Die("harness", h.status());
  auto& harness = **h;
  auto agent = [&](const std::vector<std::string>& extra, Json* report) {
    std::vector<std::string> args = {"agent", "--image", "debian-12", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto t0 = Clock::now();
    trybox::e2e::CliResult r = harness.Cli(args);
    double ms = Ms(t0, Clock::now());
    *report = Json::parse(r.out, nullptr, false);
    if (report->is_discarded() || !report->contains("outcome")) {
      Die("agent", trybox::Internal("no report: " + r.err));
    }
    return ms;
  };

  // The probe, once, and a warm-up run so templates and spares exist.
  m.Push({{"text", "ok"}});
  m.Push(Turn("finish", {{"summary", "warm"}, {"verify_command", "true"}}));
  Json report;
  agent({"warm up"}, &report);

  // Per turn: one run with `turns` cheap commands.
  for (int i = 0; i < turns; ++i) m.Push(Turn("run", {{"command", "true"}}));
  m.Push(Turn("finish", {{"summary", "done"}}));
  agent({"--max-turns", std::to_string(turns + 1), "many turns"}, &report);
  std::vector<double> overhead, model_ms, command_ms, turn_ms;
  for (const auto& t : report["turn_times"]) {
    if (t["command_ms"].get<double>() == 0) continue;  // the finish turn runs no command
    overhead.push_back(t["overhead_ms"].get<double>());
    model_ms.push_back(t["model_ms"].get<double>());
    command_ms.push_back(t["command_ms"].get<double>());
    turn_ms.push_back(t["ms"].get<double>());
  }

  // Baseline: the same command through the exec verb, from this process.
  std::vector<double> exec_ms;
  {
    // The harness's daemon: Paths from its environment.
    for (const auto& kv : harness.Env()) ::putenv(strdup(kv.c_str()));
    auto client = trybox::cli::Client::Connect(trybox::Paths::FromEnvironment(), false);
    if (!client.ok()) Die("connect", client.status());
    auto created =
        (*client)->Call({{"verb", "create"}, {"image", "debian-12"}, {"memory_mib", 1024}});
    if (!created.ok()) Die("create", created.status());
    std::string vm = (*created)["vm"]["id"];
    for (int i = 0; i < turns; ++i) {
      auto t0 = Clock::now();
      auto r = (*client)->Call(
          {{"verb", "exec"}, {"vm", vm}, {"argv", {"/bin/sh", "-c", "true"}}, {"cwd", "/root"}});
      if (!r.ok()) Die("exec", r.status());
      exec_ms.push_back(Ms(t0, Clock::now()) - (*r)["result"].value("duration_ms", 0.0));
    }
    (void)(*client)->Call({{"verb", "destroy"}, {"vm", vm}});
  }

  // End to end: a 5-turn task.
  std::vector<double> e2e;
  for (int i = 0; i < runs; ++i) {
    m.Push(Turn("write_file",
                {{"path", "count.sh"}, {"content", "#!/bin/sh\nseq 1 3\n"}, {"mode", 0755}}));
    m.Push(Turn("run", {{"command", "./count.sh"}}));
    m.Push(Turn("read_file", {{"path", "count.sh"}}));
    m.Push(Turn("list_dir", {{"path", "."}}));
    m.Push(Turn("finish",
                {{"summary", "count.sh counts"}, {"verify_command", "./count.sh | grep -qx 3"}}));
    double ms = agent({"count to three"}, &report);
    if (report["verdict"] != "VERIFIED") Die("5-turn task", trybox::Internal(report.dump()));
    e2e.push_back(ms);
  }

  std::printf("vm_agent (%s, %d-turn run for the per-turn figures, %d end-to-end runs)\n",
              report["model"]["provider"].get<std::string>().c_str(), turns, runs);
  Row("turn, wall time", turn_ms);
  Row("  of which the model request (loopback fake)", model_ms);
  Row("  of which the command's own run time (guest)", command_ms);
  Row("  daemon overhead per turn (the rest)", overhead);
  Row("baseline: exec verb round trip minus run time", exec_ms);
  std::printf("  %-52s %8.2f\n", "overhead / exec baseline (p50)",
              Pct(overhead, 50) / Pct(exec_ms, 50));
  Row("5-turn scripted task, trybox agent end to end", e2e);
  return 0;
}
