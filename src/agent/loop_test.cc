// The sub-agent's loop against the scripted fake model server (the real wire format over
// loopback) and an in-memory VM: turn limits, questions, finishing, malformed calls, model
// failures, a stopped caller, a dead VM. No VM boots: these run in well under a second.
#include "agent/loop.h"

#include <gtest/gtest.h>

#include "tests/fake_model/fake_model.h"

namespace trybox::agent {
namespace {

using testing::FakeModelServer;
using Json = nlohmann::json;

class FakeVm : public RunVm {
 public:
  Status Check() override { return alive ? Status::Ok() : Unavailable("the VM died: test"); }
  Result<Json> Exec(const std::vector<std::string>& argv, int64_t timeout_ms,
                    const std::string& tool, std::string* output) override {
    execs.push_back({argv, timeout_ms, tool});
    if (output) *output = "output of " + argv.back();
    return next_result;
  }
  Status WriteFile(const std::string& path, const std::string& content, int) override {
    files[path] = content;
    return Status::Ok();
  }
  Result<FileContent> ReadFile(const std::string& path, int64_t max_bytes) override {
    auto it = files.find(path);
    if (it == files.end()) return NotFound(path + ": no such file");
    FileContent c;
    c.data = it->second.substr(0, static_cast<size_t>(max_bytes));
    c.truncated = static_cast<int64_t>(it->second.size()) > max_bytes;
    c.size = static_cast<int64_t>(it->second.size());
    return c;
  }

  Result<NetworkDecision> RequestNetwork(const std::string& host, int port,
                                         const std::string& reason) override {
    network_requests.push_back(host + ":" + std::to_string(port) + " " + reason);
    return network_decision;
  }

  struct ExecCall {
    std::vector<std::string> argv;
    int64_t timeout_ms;
    std::string tool;
  };
  bool alive = true;
  Json next_result = {{"outcome", "exited"}, {"exit_code", 0}, {"duration_ms", 4}};
  std::vector<ExecCall> execs;
  std::map<std::string, std::string> files;
  NetworkDecision network_decision{"ask", "May the VM reach x.test:443?"};
  std::vector<std::string> network_requests;
};

class Events : public RunEvents {
 public:
  void Progress(int, int, const std::string& m) override { progress.push_back(m); }
  void Save(const LoopState&) override { ++saves; }
  bool Stopped() override { return stopped; }
  std::vector<std::string> progress;
  int saves = 0;
  bool stopped = false;
};

class LoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = FakeModelServer::Start();
    ASSERT_TRUE(s.ok());
    server_ = std::move(*s);
    ModelSettings m;
    m.provider = "openai";
    m.base_url = server_->openai_base_url();
    m.model = "fake";
    m.request_timeout = std::chrono::seconds(20);
    m.max_attempts = 1;
    auto c = ModelClient::Make(m);
    ASSERT_TRUE(c.ok());
    model_ = std::move(*c);
    state_.transcript.push_back({Entry::Kind::kUser, "Task:\ndo it", {}, {}});
  }
  LoopResult Run(LoopLimits limits = {}) {
    return RunLoop(*model_, vm_, events_, state_, limits, "system");
  }
  static Json Call(const std::string& name, Json input) {
    return {{"tool_calls", Json::array({{{"name", name}, {"input", input}}})}};
  }

  std::unique_ptr<FakeModelServer> server_;
  std::unique_ptr<ModelClient> model_;
  FakeVm vm_;
  Events events_;
  LoopState state_;
};

TEST_F(LoopTest, ToolsRunInTheVmUntilFinish) {
  server_->Push(Call("write_file", {{"path", "a.txt"}, {"content", "hi"}}));
  server_->Push(Call("run", {{"command", "cat a.txt"}}));
  server_->Push(Call("read_file", {{"path", "/workspace/a.txt"}}));
  server_->Push(Call("finish", {{"summary", "done"}, {"verify_command", "test -f a.txt"}}));
  LoopResult r = Run();
  EXPECT_EQ(r.end, LoopResult::End::kFinished);
  EXPECT_EQ(r.summary, "done");
  EXPECT_EQ(r.verify_command, "test -f a.txt");
  EXPECT_EQ(vm_.files["/workspace/a.txt"], "hi");
  ASSERT_EQ(vm_.execs.size(), 1u);
  EXPECT_EQ(vm_.execs[0].argv, (std::vector<std::string>{"/bin/sh", "-c", "cat a.txt"}));
  EXPECT_EQ(vm_.execs[0].tool, "run");
  EXPECT_EQ(state_.usage.turns, 4);
  EXPECT_EQ(state_.turn_times.size(), 4u);
  // The read's result went back to the model as the tool result.
  auto reqs = server_->requests();
  EXPECT_NE(reqs.back().body.dump().find("\"hi\""), std::string::npos);
}

TEST_F(LoopTest, AskStopsWithTheQuestionAndThatTurnsResultsPending) {
  server_->Push(
      {{"tool_calls", Json::array({{{"name", "run"}, {"input", {{"command", "true"}}}},
                                   {{"name", "ask"}, {"input", {{"question", "which db?"}}}},
                                   {{"name", "run"}, {"input", {{"command", "never"}}}}})}});
  LoopResult r = Run();
  EXPECT_EQ(r.end, LoopResult::End::kNeedsInput);
  EXPECT_EQ(r.question, "which db?");
  ASSERT_EQ(r.pending.results.size(), 3u);
  EXPECT_EQ(r.pending.results[1].call_id, r.ask_call_id);
  EXPECT_TRUE(r.pending.results[2].is_error);  // not run after the ask
  EXPECT_EQ(vm_.execs.size(), 1u);
}

TEST_F(LoopTest, RequestNetworkGrantedOrRefusedAtOnceGoesOnAndAskPauses) {
  vm_.network_decision = {"granted", "pypi.org:443 may now be reached"};
  server_->Push(Call("request_network", {{"host", "pypi.org"}, {"reason", "pip"}}));
  server_->Push(Call("request_network", {{"host", "x.test"}, {"port", 0}, {"reason", "r"}}));
  server_->Push(Call("finish", {{"summary", "done"}}));
  LoopResult r = Run();
  EXPECT_EQ(r.end, LoopResult::End::kFinished);
  EXPECT_EQ(vm_.network_requests, std::vector<std::string>{"pypi.org:443 pip"});
  auto reqs = server_->requests();
  EXPECT_NE(reqs[1].body.dump().find("pypi.org:443 may now be reached"), std::string::npos);
  EXPECT_NE(reqs[2].body.dump().find("'port' must be between 1 and 65535"), std::string::npos);

  vm_.network_decision = {"ask", "May the VM reach x.test:8080? (a person decides)"};
  state_.transcript.push_back({Entry::Kind::kUser, "again", {}, {}});
  server_->Push(
      {{"tool_calls",
        Json::array({{{"name", "request_network"},
                      {"input", {{"host", "x.test"}, {"port", 8080}, {"reason", "its API"}}}},
                     {{"name", "run"}, {"input", {{"command", "never"}}}}})}});
  r = Run();
  EXPECT_EQ(r.end, LoopResult::End::kNeedsInput);
  EXPECT_EQ(r.question, "May the VM reach x.test:8080? (a person decides)");
  ASSERT_TRUE(r.approval.has_value());
  EXPECT_EQ(r.approval->host, "x.test");
  EXPECT_EQ(r.approval->port, 8080);
  EXPECT_EQ(r.approval->reason, "its API");
  EXPECT_EQ(r.pending.results[0].call_id, r.ask_call_id);
  EXPECT_TRUE(r.pending.results[1].is_error);  // not run after the pause
  EXPECT_EQ(vm_.execs.size(), 0u);
}

TEST_F(LoopTest, TurnLimitIsInProgressNotAnError) {
  for (int i = 0; i < 3; ++i) server_->Push(Call("run", {{"command", "true"}}));
  LoopResult r = Run({.max_turns = 2});
  EXPECT_EQ(r.end, LoopResult::End::kInProgress);
  EXPECT_NE(r.reason.find("2 model turns"), std::string::npos) << r.reason;
  EXPECT_EQ(server_->steps_left(), 1u);
}

TEST_F(LoopTest, MalformedCallsRunNothingAndTheModelIsTold) {
  server_->Push(Call("run", {{"command", 5}}));
  server_->Push(Call("format_disk", Json::object()));
  server_->Push(Call("finish", {{"summary", "s"}}));
  LoopResult r = Run();
  EXPECT_EQ(r.end, LoopResult::End::kFinished);
  EXPECT_TRUE(vm_.execs.empty());
  ASSERT_GE(state_.transcript.size(), 5u);
  EXPECT_TRUE(state_.transcript[2].results[0].is_error);
}

TEST_F(LoopTest, ModelFailureIsAnErrorWithItsName) {
  server_->Push({{"status", 401}});
  LoopResult r = Run();
  EXPECT_EQ(r.end, LoopResult::End::kError);
  EXPECT_EQ(r.error_kind, "auth");
  EXPECT_EQ(r.http_status, 401);
}

TEST_F(LoopTest, AStoppedCallerEndsTheCallBeforeTheNextTurn) {
  events_.stopped = true;
  LoopResult r = Run();
  EXPECT_EQ(r.end, LoopResult::End::kInProgress);
  EXPECT_TRUE(server_->requests().empty());
}

TEST_F(LoopTest, ADeadVmIsAnErrorNamedVmLost) {
  vm_.alive = false;
  LoopResult r = Run();
  EXPECT_EQ(r.end, LoopResult::End::kError);
  EXPECT_EQ(r.error_kind, "vm_lost");
}

TEST_F(LoopTest, ACommandCutAtTheWallClockEndsTheCall) {
  server_->Push(Call("run", {{"command", "sleep 100"}, {"timeout_s", 600}}));
  vm_.next_result = {{"outcome", "timed_out"}, {"timeout_ms", 1000}};
  LoopResult r = Run({.wall_clock_s = 1});
  EXPECT_EQ(r.end, LoopResult::End::kInProgress);
  ASSERT_EQ(vm_.execs.size(), 1u);
  EXPECT_LE(vm_.execs[0].timeout_ms, 1000);  // capped at what was left of the call
  EXPECT_NE(r.reason.find("wall clock"), std::string::npos);
}

TEST(DescribeExecTest, EveryOutcomeReadsDifferently) {
  EXPECT_EQ(DescribeExec({{"outcome", "exited"}, {"exit_code", 2}}, "x").substr(0, 11),
            "exit code 2");
  EXPECT_NE(DescribeExec({{"outcome", "channel_lost"}, {"message", "qemu died"}}, "")
                .find("channel_lost: qemu died"),
            std::string::npos);
  // A malformed result never throws.
  EXPECT_NO_THROW(DescribeExec({{"outcome", 1}, {"exit_code", "x"}}, ""));
  EXPECT_NO_THROW(DescribeExec(Json::array(), ""));
}

}  // namespace
}  // namespace trybox::agent
