// The HTTP API's cost (docs/protocol/e2b.md), against one private tryboxd, in alternated
// rounds: a sandbox create through the E2B SDK against `trybox create` and the same create
// as a raw HTTP request against the socket's verb; `commands.run('true')` through the SDK
// against `trybox exec` and the exec verb on the same VM; a file written and read through
// the SDK's /files against `trybox cp` both ways. Prints figures; asserts nothing.
//
// Usage: e2b_bench [--rounds R] [--per-round K] [--mib M] [--figures FILE]
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "bench/baseline.h"
#include "bench/bench_util.h"
#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/process.h"
#include "util/tcp.h"

using Json = nlohmann::json;
using trybox::bench::Clock;
using trybox::bench::Die;
using trybox::bench::Ms;
using trybox::bench::Pct;

namespace {

// POST or DELETE on its own connection; the status and the body.
std::pair<int, Json> Http(uint16_t port, const std::string& method, const std::string& path,
                          const std::string& key, const std::string& body) {
  auto fd = trybox::ConnectTcpLoopback(port);
  if (!fd.ok()) Die("connect to the HTTP API", fd.status());
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                    "X-API-KEY: " + key + "\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)trybox::WriteFull(fd->get(), req);
  std::string all;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd->get(), buf, sizeof(buf), 0)) > 0;) all.append(buf, n);
  const size_t end = all.find("\r\n\r\n");
  if (all.size() < 12 || end == std::string::npos) return {0, nullptr};
  return {std::atoi(all.c_str() + 9), Json::parse(all.substr(end + 4), nullptr, false)};
}

void Print(const char* what, const std::vector<double>& v) {
  std::printf("  %-34s n=%-3zu p50 %8.1f ms  p99 %8.1f ms\n", what, v.size(), Pct(v, 50),
              Pct(v, 99));
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3, per_round = 5, mib = 8;
  std::string figures_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--per-round" && i + 1 < argc) {
      per_round = std::atoi(argv[++i]);
    } else if (a == "--mib" && i + 1 < argc) {
      mib = std::atoi(argv[++i]);
    } else if (a == "--figures" && i + 1 < argc) {
      figures_path = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: e2b_bench [--rounds R] [--per-round K] [--mib M] [--figures FILE]\n");
      return 2;
    }
  }
  const std::string script = std::string(TRYBOX_SOURCE_DIR) + "/tests/e2b/bench.mjs";
  if (::access((std::string(TRYBOX_SOURCE_DIR) + "/tests/e2b/node_modules/e2b").c_str(), F_OK)) {
    std::fprintf(stderr, "bench: run npm ci --prefix tests/e2b first\n");
    return 1;
  }
  auto h = trybox::e2e::Harness::Start();
  if (!h.ok()) Die("start tryboxd", h.status());
  auto serve = (*h)->Cli({"serve"});
  std::smatch m;
  if (serve.code != 0 ||
      !std::regex_search(serve.out, m, std::regex("http://127\\.0\\.0\\.1:([0-9]+)"))) {
    Die("serve", trybox::Internal(serve.err));
  }
  const std::string url = m[0];
  const uint16_t port = static_cast<uint16_t>(std::stoi(m[1]));
  auto k = (*h)->Cli({"api-key", "create", "bench"});
  if (k.code != 0) Die("api-key create", trybox::Internal(k.err));
  const std::string key = k.out.substr(0, k.out.find('\n'));
  std::vector<std::string> env = (*h)->Env();
  env.push_back("E2B_API_URL=" + url);
  env.push_back("E2B_SANDBOX_URL=" + url);
  env.push_back("E2B_API_KEY=" + key);

  // One create of each kind first: the template is built and the spares are warm.
  (void)(*h)->Cli({"rm", (*h)->Cli({"create", "--quiet"}).out.substr(0, 12)});

  std::vector<double> cli, verb, http, sdk, sdk_kill;
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < per_round; ++i) {
      auto t = Clock::now();
      auto c = (*h)->Cli({"create", "--quiet"});
      cli.push_back(Ms(t, Clock::now()));
      if (c.code != 0) Die("trybox create", trybox::Internal(c.err));
      std::string id = c.out.substr(0, c.out.find('\n'));
      (void)(*h)->Cli({"rm", id});
      (void)(*h)->WaitForSparePoolIdle();

      t = Clock::now();
      auto v = (*h)->Call({{"verb", "create"}, {"image", "debian-12"}});
      verb.push_back(Ms(t, Clock::now()));
      if (!v.ok()) Die("create verb", v.status());
      (void)(*h)->Call({{"verb", "destroy"}, {"vm", (*v)["vm"]["id"]}});
      (void)(*h)->WaitForSparePoolIdle();

      t = Clock::now();
      auto [status, body] =
          Http(port, "POST", "/sandboxes", key, R"({"templateID":"debian-12","timeout":300})");
      http.push_back(Ms(t, Clock::now()));
      if (status != 201) Die("POST /sandboxes", trybox::Internal(body.dump()));
      (void)Http(port, "DELETE", "/sandboxes/" + body["sandboxID"].get<std::string>(), key, "");
      (void)(*h)->WaitForSparePoolIdle();
    }
    // The SDK's creates, timed inside node (its start-up is not a create's).
    auto s = trybox::e2e::RunProgram(
        {trybox::FindInPath("node").value_or("node"), script, "create", std::to_string(per_round)},
        env);
    Json j = Json::parse(s.out, nullptr, false);
    if (s.code != 0 || !j.is_object()) Die("bench.mjs", trybox::Internal(s.err));
    for (double ms : j["create_ms"]) sdk.push_back(ms);
    for (double ms : j["kill_ms"]) sdk_kill.push_back(ms);
    (void)(*h)->WaitForSparePoolIdle();
  }

  // Commands and files, all in one sandbox made through the API.
  auto [cs, made] =
      Http(port, "POST", "/sandboxes", key, R"({"templateID":"debian-12","timeout":3600})");
  if (cs != 201) Die("POST /sandboxes", trybox::Internal(made.dump()));
  const std::string id = made["sandboxID"];
  const std::string local = (*h)->home() + "/bench.bin";
  {
    std::string data(static_cast<size_t>(mib) << 20, '\0');
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 7919) & 255);
    if (auto st = trybox::WriteFileAtomic(local, data, 0600); !st.ok()) Die("write", st);
  }
  std::vector<double> run_cli, run_verb, run_sdk, put_mbs, get_mbs, write_mbs, read_mbs;
  const double mb = static_cast<double>(static_cast<size_t>(mib) << 20) / 1e6;
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < per_round; ++i) {
      auto t = Clock::now();
      auto c = (*h)->Cli({"exec", id, "--", "true"});
      run_cli.push_back(Ms(t, Clock::now()));
      if (c.code != 0) Die("trybox exec", trybox::Internal(c.err));
      t = Clock::now();
      auto v = (*h)->Call({{"verb", "exec"}, {"vm", id}, {"argv", {"true"}}});
      run_verb.push_back(Ms(t, Clock::now()));
      if (!v.ok()) Die("exec verb", v.status());
    }
    auto t = Clock::now();
    auto put = (*h)->Cli({"cp", local, id + ":/tmp/cp.bin"});
    put_mbs.push_back(mb / (Ms(t, Clock::now()) / 1000));
    if (put.code != 0) Die("trybox cp in", trybox::Internal(put.err));
    t = Clock::now();
    auto get = (*h)->Cli({"cp", id + ":/tmp/cp.bin", local + ".back"});
    get_mbs.push_back(mb / (Ms(t, Clock::now()) / 1000));
    if (get.code != 0) Die("trybox cp out", trybox::Internal(get.err));
    ::unlink((local + ".back").c_str());

    auto s = trybox::e2e::RunProgram({trybox::FindInPath("node").value_or("node"), script, "exec",
                                      id, std::to_string(per_round), std::to_string(mib)},
                                     env);
    Json j = Json::parse(s.out, nullptr, false);
    if (s.code != 0 || !j.is_object()) Die("bench.mjs exec", trybox::Internal(s.err));
    for (double ms : j["run_ms"]) run_sdk.push_back(ms);
    write_mbs.push_back(mb / (j["write_ms"].get<double>() / 1000));
    read_mbs.push_back(mb / (j["read_ms"].get<double>() / 1000));
  }
  (void)Http(port, "DELETE", "/sandboxes/" + id, key, "");

  std::printf("sandbox create, %d rounds of %d, TCG, spares on (each create takes a spare)\n",
              rounds, per_round);
  Print("`trybox create` (CLI process)", cli);
  Print("create verb (socket, in process)", verb);
  Print("POST /sandboxes (raw HTTP)", http);
  Print("E2B SDK Sandbox.create", sdk);
  Print("E2B SDK Sandbox.kill", sdk_kill);
  std::printf("ratios (p50): SDK/CLI %.2fx, raw HTTP/socket verb %.2fx\n",
              Pct(sdk, 50) / Pct(cli, 50), Pct(http, 50) / Pct(verb, 50));
  std::printf("`true` in one VM, %d rounds of %d\n", rounds, per_round);
  Print("`trybox exec` (CLI process)", run_cli);
  Print("exec verb (socket, in process)", run_verb);
  Print("E2B SDK commands.run('true')", run_sdk);
  std::printf("ratios (p50): SDK/exec verb %.2fx, SDK/CLI %.2fx\n",
              Pct(run_sdk, 50) / Pct(run_verb, 50), Pct(run_sdk, 50) / Pct(run_cli, 50));
  std::printf("a %d MiB file, %d rounds (MB/s, median)\n", mib, rounds);
  std::printf("  `trybox cp` in %.1f, out %.1f; SDK files.write %.1f, files.read %.1f\n",
              Pct(put_mbs, 50), Pct(get_mbs, 50), Pct(write_mbs, 50), Pct(read_mbs, 50));
  trybox::bench::FiguresFile figures(figures_path);
  figures.Lower("e2b.sdk_create_p50_ms", Pct(sdk, 50), "ms", "E2B SDK Sandbox.create p50");
  figures.Lower("e2b.sdk_create_p99_ms", Pct(sdk, 99), "ms", "E2B SDK Sandbox.create p99");
  figures.Lower("e2b.http_over_verb_create_ratio", Pct(http, 50) / Pct(verb, 50), "x",
                "POST /sandboxes p50 over the create verb's");
  figures.Lower("e2b.sdk_run_true_p50_ms", Pct(run_sdk, 50), "ms",
                "E2B SDK commands.run('true') p50");
  figures.Lower("e2b.sdk_over_verb_exec_ratio", Pct(run_sdk, 50) / Pct(run_verb, 50), "x",
                "commands.run('true') p50 over the exec verb's");
  figures.Higher("e2b.files_write_mbs", Pct(write_mbs, 50), "MB/s", "SDK files.write");
  figures.Higher("e2b.files_read_mbs", Pct(read_mbs, 50), "MB/s", "SDK files.read");
  (void)figures.Write();
  return 0;
}
