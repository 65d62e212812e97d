// End to end: `trybox mcp` driven by the official MCP TypeScript SDK client
// (tests/mcp/client.mjs, installed by `npm ci --prefix tests/mcp`), against a private tryboxd.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

class McpE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto h = Harness::Start();
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    h_ = std::move(*h).release();
  }
  static void TearDownTestSuite() {
    delete h_;
    h_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(h_, nullptr);
    std::string sdk =
        std::string(TRYBOX_SOURCE_DIR) + "/tests/mcp/node_modules/@modelcontextprotocol";
    ASSERT_EQ(::access(sdk.c_str(), F_OK), 0)
        << "the MCP SDK is not installed: run npm ci --prefix tests/mcp (scripts/test.sh does)";
  }

  // Runs tests/mcp/client.mjs against build/bin/trybox mcp in the harness's environment.
  // Model settings come only from `env` (KEY=VALUE): ANTHROPIC_* and OPENAI_* from the
  // environment running the tests are dropped, so no test reaches a real model by accident.
  // `args_json` empty: list the tools only. Returns the client's JSON line, or null (and a
  // test failure) if it exited non-zero, which it does on any protocol failure.
  static Json RunSdkClient(const std::string& args_json, const std::vector<std::string>& env = {}) {
    std::map<std::string, std::string> chosen;
    for (const auto& kv : h_->Env()) {
      std::string key = kv.substr(0, kv.find('='));
      if (key.starts_with("ANTHROPIC_") || key.starts_with("OPENAI_")) continue;
      chosen[key] = kv;
    }
    for (const auto& kv : env) chosen[kv.substr(0, kv.find('='))] = kv;
    SpawnOptions o;
    o.argv = {FindInPath("node").value_or("node"),
              std::string(TRYBOX_SOURCE_DIR) + "/tests/mcp/client.mjs", BinDir() + "/trybox"};
    if (!args_json.empty()) o.argv.push_back(args_json);
    o.env.emplace();
    for (auto& [k, kv] : chosen) o.env->push_back(kv);
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC)) {
      ADD_FAILURE() << "pipe2 failed";
      return nullptr;
    }
    UniqueFd out_r(out[0]), out_w(out[1]), err_r(err[0]), err_w(err[1]);
    o.stdout_fd = out_w.get();
    o.stderr_fd = err_w.get();
    auto child = ChildProcess::Spawn(o);
    if (!child.ok()) {
      ADD_FAILURE() << child.status().ToString();
      return nullptr;
    }
    out_w.Reset();
    err_w.Reset();
    std::string stdout_text, stderr_text;
    auto drain = [](int fd, std::string* s) {
      char buf[65536];
      for (;;) {
        auto n = ReadSome(fd, buf, sizeof buf);
        if (!n.ok() || *n == 0) return;
        s->append(buf, *n);
      }
    };
    std::thread e([&] { drain(err_r.get(), &stderr_text); });
    drain(out_r.get(), &stdout_text);
    e.join();
    auto info = child->Wait();
    if (!info.ok() || !info->exited || info->code != 0) {
      ADD_FAILURE() << "client.mjs failed (" << (info.ok() ? info->Describe() : "?")
                    << "); stderr:\n"
                    << stderr_text;
      return nullptr;
    }
    Json j = Json::parse(stdout_text, nullptr, false);
    if (j.is_discarded()) ADD_FAILURE() << "client.mjs printed no JSON: " << stdout_text;
    return j;
  }

  static Json VmAgent(const Json& listing) {
    for (const auto& t : listing["tools"]) {
      if (t["name"] == "vm_agent") return t;
    }
    return nullptr;
  }

  static std::string Text(const Json& result) {
    const Json& c = result["content"];
    return c.is_array() && !c.empty() ? c[0].value("text", "") : "";
  }

  static Harness* h_;
};

Harness* McpE2E::h_ = nullptr;

TEST_F(McpE2E, SdkClientNegotiatesAndListsVmAgentWithItsSchemas) {
  Json r = RunSdkClient("");
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["server"]["name"], "trybox");
  EXPECT_FALSE(r["server"]["version"].get<std::string>().empty());
  EXPECT_EQ(r["protocolVersion"], "2025-11-25");  // the SDK's latest, which we serve
  Json tool = VmAgent(r);
  ASSERT_TRUE(tool.is_object()) << r.dump();
  const Json& props = tool["inputSchema"]["properties"];
  for (const char* p : {"task", "image", "workspace", "verify", "allow", "run_id", "answer"}) {
    EXPECT_TRUE(props.contains(p)) << p;
  }
  EXPECT_EQ(tool["outputSchema"]["properties"]["outcome"]["enum"].size(), 4u);
}

TEST_F(McpE2E, CallWithNoModelConfiguredIsAToolErrorNamingTheVariables) {
  Json r = RunSdkClient(R"({"task": "print the kernel version"})");
  ASSERT_TRUE(r.is_object());
  ASSERT_TRUE(r["result"].is_object()) << r.dump();
  EXPECT_EQ(r["result"]["isError"], true);
  std::string text = Text(r["result"]);
  EXPECT_NE(text.find("ANTHROPIC_API_KEY"), std::string::npos) << text;
  EXPECT_NE(text.find("OPENAI_BASE_URL"), std::string::npos) << text;
  EXPECT_TRUE(r["progress"].empty());
}

// Through the real daemon: whatever it answers for a model it cannot reach (today: no agent
// verb; later: an ERROR report), the SDK sees a well-formed tool error and no key.
TEST_F(McpE2E, CallTheDaemonRefusesIsAToolErrorWithoutTheKey) {
  const std::string key = "sk-e2e-must-not-appear-0042";
  Json r = RunSdkClient(R"({"task": "print the kernel version"})",
                        {"ANTHROPIC_API_KEY=" + key, "ANTHROPIC_MODEL=test-model",
                         "ANTHROPIC_BASE_URL=http://127.0.0.1:9"});
  ASSERT_TRUE(r.is_object());
  ASSERT_TRUE(r["result"].is_object()) << r.dump();
  EXPECT_EQ(r["result"]["isError"], true) << r.dump();
  EXPECT_FALSE(Text(r["result"]).empty());
  EXPECT_EQ(r.dump().find(key), std::string::npos);
}

TEST_F(McpE2E, ArgumentMistakeIsAToolErrorTheSdkAccepts) {
  Json r = RunSdkClient(R"({"run_id": "r1", "verify": "true"})");
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["result"]["isError"], true) << r.dump();
  EXPECT_NE(Text(r["result"]).find("verify goes with task"), std::string::npos) << r.dump();
}

}  // namespace
}  // namespace trybox::e2e
