// fake_model_server: the scripted fake model API (fake_model.h) as a process, for
// benchmarks and manual runs. Prints "listening PORT" (and "ca_file PATH" with --tls) on
// stdout once it accepts connections; serves until SIGINT or SIGTERM.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>

#include "tests/fake_model/fake_model.h"

int main(int argc, char** argv) {
  CLI::App app{"Scripted fake model server (Anthropic Messages and OpenAI chat completions)"};
  uint16_t port = 0;
  std::string script;
  bool tls = false;
  app.add_option("--port", port, "TCP port on 127.0.0.1 (0: any free port)");
  app.add_option("--script", script, "JSON file: an array of steps (see fake_model.h)");
  app.add_flag("--tls", tls, "serve HTTPS with a fresh self-signed certificate");
  CLI11_PARSE(app, argc, argv);

  // Blocked before any thread starts, so that only sigwait below receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  trybox::testing::Json steps = trybox::testing::Json::array();
  if (!script.empty()) {
    auto text = trybox::ReadFileToString(script);
    if (!text.ok()) {
      std::fprintf(stderr, "fake_model_server: %s\n", text.status().ToString().c_str());
      return 1;
    }
    steps = trybox::testing::Json::parse(*text, nullptr, false);
    if (!steps.is_array()) {
      std::fprintf(stderr, "fake_model_server: %s is not a JSON array of steps\n", script.c_str());
      return 1;
    }
  }
  auto server = trybox::testing::FakeModelServer::Start({.tls = tls, .port = port});
  if (!server.ok()) {
    std::fprintf(stderr, "fake_model_server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  for (auto& step : steps) (*server)->Push(std::move(step));
  std::printf("listening %u\n", (*server)->port());
  if (tls) std::printf("ca_file %s\n", (*server)->ca_file().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  return 0;
}
