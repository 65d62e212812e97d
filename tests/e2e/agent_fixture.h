// The vm_agent e2e suites' fixture: a private tryboxd configured for both providers of a
// scripted fake model server on loopback, driven through the real CLI.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/e2e/harness.h"
#include "tests/fake_model/fake_model.h"
#include "util/fd.h"
#include "workspace/testing.h"

namespace trybox::e2e {

using Json = nlohmann::json;
using trybox::testing::FakeModelServer;
namespace wt = trybox::workspace::testing;

inline constexpr const char* kKey = "sk-test-7f3a9c-NEVER-WRITTEN";

inline Json Call(const std::string& name, Json input) {
  return {{"name", name}, {"input", std::move(input)}};
}
inline Json Turn(std::vector<Json> calls) { return {{"tool_calls", calls}}; }

class AgentFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = FakeModelServer::Start();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m).release();
    auto h = Harness::Start({"OPENAI_BASE_URL=" + model_->openai_base_url(),
                             std::string("OPENAI_API_KEY=") + kKey,
                             "ANTHROPIC_BASE_URL=" + model_->anthropic_base_url(),
                             std::string("ANTHROPIC_API_KEY=") + kKey, "OPENAI_MODEL=unused",
                             "ANTHROPIC_MODEL=unused"});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    h_ = std::move(*h).release();
    // Both providers are configured; the config file picks the default, flags the rest.
    ASSERT_TRUE(MakeDirs(h_->home() + "/config").ok());
    ASSERT_TRUE(WriteFileAtomic(h_->home() + "/config/agent.json",
                                R"({"provider": "openai", "image": "debian-12"})", 0600)
                    .ok());
  }
  static void TearDownTestSuite() {
    delete h_;
    h_ = nullptr;
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(h_, nullptr);
    ASSERT_EQ(model_->steps_left(), 0u) << "an earlier test left script steps unplayed";
    first_request_ = model_->requests().size();
    auto t = TempDir::Make("/tmp", "tbx-agent-e2e-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
  }
  void TearDown() override {
    // Whatever a test left, the next starts with an empty script.
    while (model_->steps_left() > 0) {
      ADD_FAILURE() << "script steps left unplayed";
      break;
    }
  }

  // Each test names its own model, so the daemon's once-per-model probe is its first
  // request whatever order the tests run in.
  static std::string ModelName() {
    return std::string("fake-") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  static void PushProbeReply() { model_->Push({{"text", "ok"}}); }

  // trybox agent ... --json; returns the report and the exit code.
  Json Agent(std::vector<std::string> args, int* code, std::string* err = nullptr) {
    args.insert(args.begin(), "agent");
    args.push_back("--json");
    // The bare image boots fastest; these tests need no toolchain.
    args.insert(args.begin() + 1, {"--image", "debian-12"});
    CliResult r = h_->Cli(args);
    *code = r.code;
    if (err) *err = r.err;
    Json j = Json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "stdout: " << r.out << "\nstderr: " << r.err;
    return j;
  }
  std::vector<FakeModelServer::Recorded> MyRequests() const {
    auto all = model_->requests();
    return {all.begin() + static_cast<long>(first_request_), all.end()};
  }
  // The tool results the model was sent in an OpenAI request, by tool call id order.
  static std::vector<std::string> ToolMessages(const Json& body) {
    std::vector<std::string> out;
    for (const auto& m : body["messages"]) {
      if (m.value("role", "") == "tool") out.push_back(m.value("content", ""));
    }
    return out;
  }
  std::string Sh(const std::string& script) {
    auto r = wt::Sh(tmp_->path(), script);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : "";
  }
  static const Json* FindCommand(const Json& report, const std::string& shell) {
    for (const auto& c : report["commands"]) {
      if (c["argv"] == Json::array({"/bin/sh", "-c", shell})) return &c;
    }
    return nullptr;
  }

  static inline Harness* h_ = nullptr;
  static inline FakeModelServer* model_ = nullptr;
  size_t first_request_ = 0;
  std::optional<TempDir> tmp_;
};

}  // namespace trybox::e2e
