// The HTTP API's cost (docs/protocol/e2b.md): a sandbox create through the E2B SDK against
// `trybox create`, and the same create as a raw HTTP request against the socket's verb, all
// against one private tryboxd, in alternated rounds. Prints figures; asserts nothing.
//
// Usage: e2b_bench [--rounds R] [--per-round K] [--figures FILE]
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
  int rounds = 3, per_round = 5;
  std::string figures_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--per-round" && i + 1 < argc) {
      per_round = std::atoi(argv[++i]);
    } else if (a == "--figures" && i + 1 < argc) {
      figures_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: e2b_bench [--rounds R] [--per-round K] [--figures FILE]\n");
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
        {trybox::FindInPath("node").value_or("node"), script, std::to_string(per_round)}, env);
    Json j = Json::parse(s.out, nullptr, false);
    if (s.code != 0 || !j.is_object()) Die("bench.mjs", trybox::Internal(s.err));
    for (double ms : j["create_ms"]) sdk.push_back(ms);
    for (double ms : j["kill_ms"]) sdk_kill.push_back(ms);
    (void)(*h)->WaitForSparePoolIdle();
  }

  std::printf("sandbox create, %d rounds of %d, TCG, spares on (each create takes a spare)\n",
              rounds, per_round);
  Print("`trybox create` (CLI process)", cli);
  Print("create verb (socket, in process)", verb);
  Print("POST /sandboxes (raw HTTP)", http);
  Print("E2B SDK Sandbox.create", sdk);
  Print("E2B SDK Sandbox.kill", sdk_kill);
  std::printf("ratios (p50): SDK/CLI %.2fx, raw HTTP/socket verb %.2fx\n",
              Pct(sdk, 50) / Pct(cli, 50), Pct(http, 50) / Pct(verb, 50));
  trybox::bench::FiguresFile figures(figures_path);
  figures.Lower("e2b.sdk_create_p50_ms", Pct(sdk, 50), "ms", "E2B SDK Sandbox.create p50");
  figures.Lower("e2b.sdk_create_p99_ms", Pct(sdk, 99), "ms", "E2B SDK Sandbox.create p99");
  figures.Lower("e2b.http_over_verb_create_ratio", Pct(http, 50) / Pct(verb, 50), "x",
                "POST /sandboxes p50 over the create verb's");
  (void)figures.Write();
  return 0;
}
