// End to end: `trybox mcp` driven by the official MCP TypeScript SDK client
// (tests/mcp/client.mjs, installed by `npm ci --prefix tests/mcp`), against a private tryboxd.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "tests/e2e/harness.h"
#include "tests/fake_model/fake_model.h"
#include "util/fd.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

class McpE2E : public SharedHarness<McpE2E> {
 protected:
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
    std::vector<std::string> argv = {FindInPath("node").value_or("node"),
                                     std::string(TRYBOX_SOURCE_DIR) + "/tests/mcp/client.mjs",
                                     BinDir() + "/trybox"};
    if (!args_json.empty()) argv.push_back(args_json);
    std::vector<std::string> child_env;
    for (auto& [k, kv] : chosen) child_env.push_back(kv);
    CliResult r = RunProgram(argv, child_env);
    if (r.code != 0) {
      ADD_FAILURE() << "client.mjs failed (exit " << r.code << "); stderr:\n" << r.err;
      return nullptr;
    }
    const std::string& stdout_text = r.out;
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
};

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

// Through the real daemon: a model it cannot reach fails the start-up probe; the SDK sees a
// well-formed tool error that says so, and no key.
TEST_F(McpE2E, CallTheDaemonRefusesIsAToolErrorWithoutTheKey) {
  const std::string key = "sk-e2e-must-not-appear-0042";
  Json r = RunSdkClient(R"({"task": "print the kernel version", "image": "debian-12"})",
                        {"ANTHROPIC_API_KEY=" + key, "ANTHROPIC_MODEL=test-model",
                         "ANTHROPIC_BASE_URL=http://127.0.0.1:9"});
  ASSERT_TRUE(r.is_object());
  ASSERT_TRUE(r["result"].is_object()) << r.dump();
  EXPECT_EQ(r["result"]["isError"], true) << r.dump();
  EXPECT_NE(Text(r["result"]).find("start-up probe"), std::string::npos) << r.dump();
  EXPECT_EQ(r.dump().find(key), std::string::npos);
}

TEST_F(McpE2E, ArgumentMistakeIsAToolErrorTheSdkAccepts) {
  Json r = RunSdkClient(R"({"run_id": "r1", "verify": "true"})");
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["result"]["isError"], true) << r.dump();
  EXPECT_NE(Text(r["result"]).find("verify goes with task"), std::string::npos) << r.dump();
}

// The whole path: the SDK calls vm_agent, a scripted model works in a real VM, the daemon's
// report comes back as text and structured content, with progress on the way.
TEST_F(McpE2E, VmAgentRunsInAVmAndTheReportComesBackWithProgress) {
  auto model = trybox::testing::FakeModelServer::Start();
  ASSERT_TRUE(model.ok());
  auto& m = **model;
  std::vector<std::string> env = {"OPENAI_BASE_URL=" + m.openai_base_url(),
                                  "OPENAI_MODEL=mcp-happy"};
  m.Push({{"text", "ok"}});  // the start-up probe
  m.Push({{"tool_calls", {{{"name", "run"}, {"input", {{"command", "echo 42 > answer.txt"}}}}}}});
  m.Push(
      {{"tool_calls", {{{"name", "ask"}, {"input", {{"question", "Is 42 the right answer?"}}}}}}});
  Json r = RunSdkClient(R"({"task": "write the answer to answer.txt", "image": "debian-12"})", env);
  ASSERT_TRUE(r.is_object());
  const Json& res = r["result"];
  EXPECT_EQ(res["isError"], false) << r.dump();
  EXPECT_EQ(res["structuredContent"]["outcome"], "NEEDS_INPUT");
  EXPECT_EQ(res["structuredContent"]["question"]["text"], "Is 42 the right answer?");
  EXPECT_NE(Text(res).find("Outcome: NEEDS_INPUT"), std::string::npos) << Text(res);
  EXPECT_FALSE(r["progress"].empty());
  double last = -1;
  for (const auto& p : r["progress"]) {
    EXPECT_GT(p["progress"].get<double>(), last);
    last = p["progress"].get<double>();
  }

  // The answer continues the same run in the same VM.
  std::string run = res["structuredContent"]["run"];
  m.Push(
      {{"tool_calls",
        {{{"name", "finish"},
          {"input",
           {{"summary", "answer.txt holds 42"}, {"verify_command", "grep -qx 42 answer.txt"}}}}}}});
  Json args = {{"run_id", run}, {"answer", "yes"}};
  Json done = RunSdkClient(args.dump(), env);
  ASSERT_TRUE(done.is_object());
  const Json& report = done["result"]["structuredContent"];
  EXPECT_EQ(done["result"]["isError"], false) << done.dump();
  EXPECT_EQ(report["run"], run);
  EXPECT_EQ(report["outcome"], "DONE");
  EXPECT_EQ(report["verdict"], "VERIFIED");
  EXPECT_EQ(report["claim"]["summary"], "answer.txt holds 42");
  EXPECT_NE(Text(done["result"]).find("Verdict: VERIFIED\n"), std::string::npos);
  EXPECT_EQ(m.steps_left(), 0u);
}

// The VM tools through the official SDK (which checks each structuredContent against the
// tool's outputSchema): an assistant works in a real VM by itself, call by call.
TEST_F(McpE2E, SdkClientWorksInAVmCallByCallWithTheVmTools) {
  Json script = Json::array({
      {{"name", "vm_create"}, {"arguments", Json::object()}},
      {{"name", "vm_write_file"},
       {"arguments", {{"vm", "$VM"}, {"path", "/root/w/hello.txt"}, {"content", "hi there\n"}}}},
      {{"name", "vm_exec"},
       {"arguments", {{"vm", "$VM"}, {"command", "cat /root/w/hello.txt; echo oops >&2; exit 3"}}}},
      {{"name", "vm_exec"},
       {"arguments", {{"vm", "$VM"}, {"argv", {"id", "-un"}}, {"user", "user"}}}},
      {{"name", "vm_list_dir"}, {"arguments", {{"vm", "$VM"}, {"path", "/root/w"}}}},
      {{"name", "vm_read_file"}, {"arguments", {{"vm", "$VM"}, {"path", "/root/w/hello.txt"}}}},
      {{"name", "vm_read_file"}, {"arguments", {{"vm", "$VM"}, {"path", "/root/w"}}}},
      {{"name", "vm_exec"},
       {"arguments", {{"vm", "$VM"}, {"command", "sleep 30"}, {"timeout_s", 1}}}},
      {{"name", "vm_destroy"}, {"arguments", {{"vm", "$VM"}}}},
  });
  Json r = RunSdkClient("", {"MCP_SCRIPT=" + script.dump()});
  ASSERT_TRUE(r.is_object());
  const Json& res = r["results"];
  ASSERT_EQ(res.size(), script.size()) << r.dump();
  std::string vm = res[0]["structuredContent"]["vm"];
  EXPECT_EQ(res[0]["structuredContent"]["kept"], false);
  EXPECT_EQ(res[1]["structuredContent"]["bytes"], 9) << res[1].dump();

  const Json& exec = res[2]["structuredContent"];
  EXPECT_EQ(res[2]["isError"], false) << res[2].dump();
  EXPECT_EQ(exec["outcome"], "exited");
  EXPECT_EQ(exec["exit_code"], 3);
  EXPECT_EQ(exec["stdout"], "hi there\n");
  EXPECT_EQ(exec["stderr"], "oops\n");
  ASSERT_TRUE(exec["exec_id"].is_number_integer());
  // The exec is the daemon's record, as `trybox logs` shows it.
  CliResult logs = h_->Cli({"logs", std::to_string(exec["exec_id"].get<int64_t>())});
  EXPECT_EQ(logs.out, "hi there\n") << logs.err;

  EXPECT_EQ(res[3]["structuredContent"]["stdout"], "user\n") << res[3].dump();

  const Json& entries = res[4]["structuredContent"]["entries"];
  ASSERT_EQ(entries.size(), 1u) << res[4].dump();
  EXPECT_EQ(entries[0]["path"], "hello.txt");
  EXPECT_EQ(entries[0]["type"], "file");
  EXPECT_EQ(entries[0]["size"], 9);
  EXPECT_EQ(entries[0]["mode"], "644");

  EXPECT_EQ(res[5]["structuredContent"]["content"], "hi there\n") << res[5].dump();
  EXPECT_EQ(res[6]["isError"], true) << res[6].dump();
  EXPECT_EQ(res[7]["structuredContent"]["outcome"], "timed_out") << res[7].dump();
  EXPECT_TRUE(res[7]["structuredContent"]["exit_code"].is_null());
  EXPECT_EQ(res[8]["structuredContent"]["destroyed"], true) << res[8].dump();

  auto list = h_->Call({{"verb", "list"}});
  ASSERT_TRUE(list.ok());
  for (const auto& v : (*list)["vms"]) EXPECT_NE(v["id"], vm);
}

// VMs the session made go with the session (tryboxd destroys them when its connection
// closes), unless they were made with keep.
TEST_F(McpE2E, SessionEndTakesItsVmsAlongButNotKeptOnes) {
  Json script = Json::array({
      {{"name", "vm_create"}, {"arguments", Json::object()}},
      {{"name", "vm_create"}, {"arguments", {{"keep", true}}}},
  });
  Json r = RunSdkClient("", {"MCP_SCRIPT=" + script.dump()});
  ASSERT_TRUE(r.is_object());
  ASSERT_EQ(r["results"].size(), 2u) << r.dump();
  std::string gone = r["results"][0]["structuredContent"]["vm"];
  std::string kept = r["results"][1]["structuredContent"]["vm"];
  std::set<std::string> ids;
  for (int i = 0; i < 600; ++i) {  // the daemon destroys it when it sees the connection close
    auto list = h_->Call({{"verb", "list"}});
    ASSERT_TRUE(list.ok());
    ids.clear();
    for (const auto& v : (*list)["vms"]) ids.insert(v["id"].get<std::string>());
    if (!ids.count(gone)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_FALSE(ids.count(gone));
  EXPECT_TRUE(ids.count(kept));
  EXPECT_EQ(h_->Cli({"rm", kept}).code, 0);
}

TEST_F(McpE2E, ToolsFlagOffersOnlyTheChosenTools) {
  Json r = RunSdkClient("", {R"(MCP_SERVER_ARGS=["--tools", "vm_exec,vm_destroy"])"});
  ASSERT_TRUE(r.is_object());
  ASSERT_EQ(r["tools"].size(), 2u) << r.dump();
  EXPECT_EQ(r["tools"][0]["name"], "vm_exec");
  EXPECT_EQ(r["tools"][1]["name"], "vm_destroy");
}

}  // namespace
}  // namespace trybox::e2e
