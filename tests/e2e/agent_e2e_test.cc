// End to end: vm_agent runs against real guests, driven through the real CLI and a private
// tryboxd, with a scripted model server speaking the providers' real HTTP wire formats on
// loopback. The model is the only fake; the VMs, the store, git and the re-run are real.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "tests/e2e/agent_fixture.h"
#include "tests/e2e/upstream.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

class AgentE2E : public AgentFixture {};

TEST_F(AgentE2E, TaskThatSucceedsIsVerifiedByTheSupervisorAndCommittedOnTheRunBranch) {
  std::string repo = tmp_->path() + "/repo";
  Sh("git init -q -b main '" + repo + "' && cd '" + repo +
     "' && echo base > README && git add -A && git -c user.name=t -c user.email=t@t commit -qm "
     "init");
  std::string head_before = Sh("git -C '" + repo + "' rev-parse HEAD");
  PushProbeReply();
  model_->Push(Turn({Call("write_file", {{"path", "hello.sh"},
                                         {"content", "#!/bin/sh\necho hello from the vm\n"},
                                         {"mode", 0755}})}));
  model_->Push(Turn({Call("run", {{"command", "./hello.sh"}})}));
  model_->Push(Turn({Call("finish", {{"summary", "hello.sh prints a greeting"},
                                     {"verify_command", "./hello.sh | grep -q 'hello from'"}})}));
  int code = -1;
  std::string err;
  Json r = Agent({"--model", ModelName(), "--workspace", repo, "write hello.sh"}, &code, &err);
  ASSERT_EQ(code, 0) << err << r.dump(2);
  EXPECT_EQ(r["outcome"], "DONE");
  EXPECT_EQ(r["verdict"], "VERIFIED");
  EXPECT_EQ(r["image"]["name"], "debian-12");
  EXPECT_EQ(r["image"]["sha256"].get<std::string>().size(), 64u);
  // The facts are the daemon's: the command the agent ran, with its real exit code.
  const Json* ran = FindCommand(r, "./hello.sh");
  ASSERT_NE(ran, nullptr) << r["commands"].dump(2);
  EXPECT_EQ((*ran)["outcome"], "exited");
  EXPECT_EQ((*ran)["exit_code"], 0);
  EXPECT_EQ((*ran)["stdout_bytes"], 18);
  ASSERT_EQ(r["files"]["changes"].size(), 1u) << r["files"].dump(2);
  EXPECT_EQ(r["files"]["changes"][0]["change"], "added");
  EXPECT_EQ(r["files"]["changes"][0]["path"], "hello.sh");
  // The supervisor's own re-run, in another VM.
  EXPECT_EQ(r["verification"]["exit_code"], 0);
  EXPECT_EQ(r["verification"]["source"], "agent");
  EXPECT_NE(r["verification"]["vm"], r["vm"]["id"]);
  EXPECT_EQ(r["claim"]["status"], "unverified");
  EXPECT_EQ(r["claim"]["summary"], "hello.sh prints a greeting");
  // The commit is on trybox/<run-id>; the user's HEAD is untouched.
  std::string branch = "trybox/" + r["run"].get<std::string>();
  EXPECT_EQ(r["commit"]["branch"], branch);
  EXPECT_EQ(Sh("git -C '" + repo + "' rev-parse '" + branch + "'"),
            r["commit"]["sha"].get<std::string>() + "\n");
  EXPECT_EQ(Sh("git -C '" + repo + "' show '" + branch + ":hello.sh'"),
            "#!/bin/sh\necho hello from the vm\n");
  EXPECT_EQ(Sh("git -C '" + repo + "' rev-parse HEAD"), head_before);
  // Both VMs are gone.
  EXPECT_EQ(r["vm"]["state"], "destroyed");
  // Only spare clones may remain: the pool's target follows the run's two creates.
  EXPECT_TRUE(h_->QemuPids().size() <= 2u) << "only spares may remain";
  // The model saw the real results of its calls.
  auto reqs = MyRequests();
  ASSERT_EQ(reqs.size(), 4u);
  auto third = ToolMessages(reqs[3].body);
  ASSERT_EQ(third.size(), 2u);
  EXPECT_NE(third[0].find("wrote 33 bytes to /workspace/hello.sh"), std::string::npos);
  EXPECT_NE(third[1].find("exit code 0"), std::string::npos);
  EXPECT_NE(third[1].find("hello from the vm"), std::string::npos);
  EXPECT_EQ(reqs[1].headers["authorization"], std::string("Bearer ") + kKey);
  // agent show gives the same report again, from the store.
  CliResult show = h_->Cli({"agent", "show", r["run"], "--json"});
  ASSERT_EQ(show.code, 0) << show.err;
  Json again = Json::parse(show.out);
  EXPECT_EQ(again["verdict"], "VERIFIED");
  EXPECT_EQ(again["commands"], r["commands"]);
  CliResult text = h_->Cli({"agent", "show", r["run"]});
  EXPECT_NE(text.out.find("Verdict: VERIFIED\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("an unverified claim"), std::string::npos) << text.out;
}

// A secret given to a run (`agent --secret`): the run's VM and its verification VM each see a
// placeholder of the value's length, never the value; neither the model, the report, the
// daemon's log nor its store ever holds the value.
TEST_F(AgentE2E, ASecretReachesTheRunAndItsVerificationOnlyAsPlaceholders) {
  const std::string value = "tbx-agent-secret-5d2e81";  // 23 characters
  const std::string file = tmp_->path() + "/token";
  ASSERT_TRUE(WriteFileAtomic(file, value + "\n", 0600).ok());
  PushProbeReply();
  model_->Push(Turn({Call(
      "run", {{"command", "printf %s \"$API_TOKEN\" > token.txt; echo \"len=${#API_TOKEN}\""}})}));
  model_->Push(Turn({Call("finish", {{"summary", "token.txt holds the token"},
                                     {"verify_command",
                                      "test \"${#API_TOKEN}\" -eq 23 && test -s token.txt && "
                                      "! grep -q tbx-agent-secret token.txt"}})}));
  int code = -1;
  std::string err;
  Json r =
      Agent({"--model", ModelName(), "--secret", "API_TOKEN=file:" + file + "@api.test", "use it"},
            &code, &err);
  ASSERT_EQ(code, 0) << err << r.dump(2);
  EXPECT_EQ(r["outcome"], "DONE");
  // The verification VM had a placeholder of 23 characters, and the file the run wrote
  // holds its own VM's placeholder, not the value.
  EXPECT_EQ(r["verdict"], "VERIFIED") << r["verification"].dump(2);
  EXPECT_EQ(r.dump().find(value), std::string::npos) << "the value is in the report";
  bool told_length = false;
  for (const auto& req : MyRequests()) {
    EXPECT_EQ(req.body.dump().find(value), std::string::npos) << "the model was sent the value";
    for (const auto& m : ToolMessages(req.body))
      told_length |= m.find("len=23") != std::string::npos;
  }
  EXPECT_TRUE(told_length) << "the run's VM did not see a 23-character placeholder";
  for (const std::string& path : {h_->home() + "/tryboxd.log", h_->home() + "/state/trybox.db",
                                  h_->home() + "/state/trybox.db-wal"}) {
    EXPECT_EQ(ReadFileToString(path).value_or("").find(value), std::string::npos) << path;
  }
  // A source that cannot be read is refused before anything boots, naming the secret.
  CliResult bad = h_->Cli({"agent", "--image", "debian-12", "--model", ModelName(), "--secret",
                           "API_TOKEN=file:/nonexistent@api.test", "use it"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("API_TOKEN"), std::string::npos) << bad.err;
}

// The report's network section comes from the daemon's audit of the run's VM: the policy,
// each host reached with its bytes, each refusal with its reason. Internet mode reaches a
// name on no list (here a loopback upstream, let in by the operator's override); --deny
// still refuses its host.
TEST_F(AgentE2E, TheReportSaysWhereTheNetworkWent) {
  HttpUpstream up;
  const std::string port = std::to_string(up.port());
  ASSERT_TRUE(
      WriteFileAtomic(h_->home() + "/config/egress.json",
                      Json{{"resolve", {{"up.test", {"127.0.0.1"}}, {"evil.test", {"127.0.0.1"}}}},
                           {"internal_allow", {"127.0.0.1:" + port}}}
                          .dump())
          .ok());
  CliResult reload = h_->Cli({"daemon", "reload"});
  ASSERT_EQ(reload.code, 0) << reload.err;
  const int before = up.accepts();
  PushProbeReply();
  model_->Push(Turn({Call("run", {{"command", "curl -sS http://up.test:" + port +
                                                  "/bytes/5000 | wc -c; curl -s http://evil.test:" +
                                                  port + "/; true"}})}));
  model_->Push(Turn({Call("finish", {{"summary", "fetched it"}})}));
  int code = -1;
  std::string err;
  Json r =
      Agent({"--model", ModelName(), "--internet", "--deny", "evil.test", "fetch"}, &code, &err);
  ASSERT_EQ(code, 2) << err << r.dump(2);  // DONE, UNVERIFIED: no check was given
  const Json& net = r["network"];
  EXPECT_EQ(net["policy"]["mode"], "internet") << net.dump(2);
  EXPECT_EQ(net["policy"]["deny"], Json({"evil.test"})) << net.dump(2);
  ASSERT_EQ(net["reached"].size(), 1u) << net.dump(2);
  EXPECT_EQ(net["reached"][0]["host"], "up.test");
  EXPECT_EQ(net["reached"][0]["port"], up.port());
  EXPECT_EQ(net["reached"][0]["connections"], 1);
  EXPECT_GE(net["reached"][0]["bytes_down"].get<int64_t>(), 5000);
  ASSERT_EQ(net["refused"].size(), 1u) << net.dump(2);
  EXPECT_EQ(net["refused"][0]["host"], "evil.test");
  EXPECT_EQ(net["refused"][0]["status"], 403);
  EXPECT_EQ(net["refused"][0]["reason"],
            "evil.test:" + port + " is denied for this VM (deny evil.test)");
  EXPECT_EQ(up.accepts(), before + 1);  // evil.test was never dialled
  // The text report says the same.
  CliResult text = h_->Cli({"agent", "show", r["run"]});
  ASSERT_EQ(text.code, 2) << text.err;  // show exits as the run did
  EXPECT_NE(text.out.find("Network (tryboxd's audit of every connection the VM asked for): "
                          "internet mode (any public host), denied \"evil.test\"; 2 connections"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("reached \"up.test\":" + port + " (1 connections"), std::string::npos)
      << text.out;
}

// request_network: the operator's policy answers at once where a rule matches (allow adds
// the host, deny refuses it, neither stops the run); otherwise the run waits for a person,
// listed by `trybox approvals`, and `approve` or `deny` continues it with the host granted
// or refused. A request whose VM is gone fails at once, naming why.
TEST_F(AgentE2E, NetworkRequestsWaitForAPersonOrThePolicyAndNeverHang) {
  HttpUpstream up;
  const std::string port = std::to_string(up.port());
  ASSERT_TRUE(WriteFileAtomic(h_->home() + "/config/egress.json",
                              Json{{"resolve",
                                    {{"up.test", {"127.0.0.1"}},
                                     {"auto.test", {"127.0.0.1"}},
                                     {"evil.test", {"127.0.0.1"}}}},
                                   {"internal_allow", {"127.0.0.1:" + port}},
                                   {"network_requests", {"deny evil.test", "allow auto.test"}}}
                                  .dump())
                  .ok());
  ASSERT_EQ(h_->Cli({"daemon", "reload"}).code, 0);
  const std::string fetch = "curl -s http://up.test:" + port + "/ ; echo \" rc=$?\"";
  auto request = [&](const std::string& host) {
    return Call("request_network", {{"host", host}, {"port", up.port()}, {"reason", "the data"}});
  };

  // 1. The policy answers without stopping; then a host no rule names waits for a person.
  PushProbeReply();
  model_->Push(Turn({request("auto.test"), request("evil.test")}));
  model_->Push(Turn({request("up.test")}));
  int code = -1;
  std::string err;
  Json r = Agent({"--model", ModelName(), "fetch the data"}, &code, &err);
  ASSERT_EQ(code, 3) << err << r.dump(2);
  EXPECT_EQ(r["outcome"], "NEEDS_INPUT");
  EXPECT_EQ(r["approval"]["host"], "up.test") << r.dump(2);
  EXPECT_EQ(r["approval"]["port"], up.port());
  EXPECT_EQ(r["question"]["text"], "the data");  // the agent's reason, its words
  const std::string run = r["run"];
  const std::string vm = r["vm"]["id"];
  auto tools = ToolMessages(MyRequests()[2].body);
  ASSERT_EQ(tools.size(), 2u);
  EXPECT_NE(tools[0].find("granted by the operator's policy (network_requests[1]: allow "
                          "auto.test): auto.test:" +
                          port + " may now be reached"),
            std::string::npos)
      << tools[0];
  EXPECT_NE(tools[1].find("refused by the operator's policy (network_requests[0]: deny "
                          "evil.test)"),
            std::string::npos)
      << tools[1];
  CliResult list = h_->Cli({"approvals", "--json"});
  ASSERT_EQ(list.code, 0) << list.err;
  Json pending = Json::parse(list.out);
  ASSERT_EQ(pending.size(), 1u) << list.out;
  EXPECT_EQ(pending[0]["kind"], "network");
  EXPECT_EQ(pending[0]["run"], run);
  EXPECT_EQ(pending[0]["vm"], vm);
  EXPECT_EQ(pending[0]["state"], "pending");
  EXPECT_EQ(pending[0]["host"], "up.test");
  CliResult words = h_->Cli({"approvals"});
  EXPECT_NE(words.out.find("network up.test:" + port + ", because \"the data\""), std::string::npos)
      << words.out;
  // Approved: the next command reaches the host.
  model_->Push(Turn({Call("run", {{"command", fetch}})}));
  model_->Push(Turn({Call("finish", {{"summary", "fetched"}})}));
  CliResult a = h_->Cli({"approve", run, "--model", ModelName(), "--json"});
  ASSERT_EQ(a.code, 2) << a.err << a.out;  // DONE, UNVERIFIED
  auto reqs = MyRequests();
  EXPECT_NE(ToolMessages(reqs[3].body).back().find("A person approved: up.test:" + port),
            std::string::npos);
  EXPECT_NE(ToolMessages(reqs[4].body).back().find("hello rc=0"), std::string::npos)
      << ToolMessages(reqs[4].body).back();
  EXPECT_EQ(Json::parse(h_->Cli({"approvals", "--json"}).out), Json::array());
  CliResult audit = h_->Cli({"audit", "--vm", vm, "--json"});
  std::vector<std::string> policy;
  for (const auto& e : Json::parse(audit.out)) {
    if (e["verdict"] == "policy") policy.push_back(e["reason"]);
    if (e["method"] == "REQUEST") policy.push_back(e["reason"]);
  }
  ASSERT_EQ(policy.size(), 3u) << audit.out;
  EXPECT_NE(policy[0].find("allowed auto.test:" + port +
                           " on the running VM, asked by the "
                           "operator's policy"),
            std::string::npos)
      << policy[0];
  EXPECT_NE(policy[1].find("request_network refused by the operator's policy"), std::string::npos);
  EXPECT_NE(
      policy[2].find("asked by uid " + std::to_string(::geteuid()) + ", approving run " + run),
      std::string::npos)
      << policy[2];

  // 2. Refused by a person: the host stays out of reach, and the run goes on.
  model_->Push(Turn({request("up.test")}));
  r = Agent({"--model", ModelName(), "fetch it again"}, &code, &err);
  ASSERT_EQ(code, 3) << err << r.dump(2);
  const std::string run2 = r["run"];
  model_->Push(Turn({Call("run", {{"command", fetch}})}));
  model_->Push(Turn({Call("finish", {{"summary", "could not"}})}));
  CliResult d = h_->Cli({"deny", run2, "--model", ModelName(), "--json"});
  ASSERT_EQ(d.code, 2) << d.err << d.out;
  reqs = MyRequests();
  EXPECT_NE(ToolMessages(reqs[reqs.size() - 2].body)
                .back()
                .find("A person refused network "
                      "access to up.test:" +
                      port),
            std::string::npos);
  EXPECT_NE(ToolMessages(reqs.back().body).back().find("up.test is not on the VM's allow-list"),
            std::string::npos)
      << ToolMessages(reqs.back().body).back();

  // 3. Its VM destroyed while it waits: listed as failed, and approving fails at once.
  model_->Push(Turn({request("up.test")}));
  r = Agent({"--model", ModelName(), "once more"}, &code, &err);
  ASSERT_EQ(code, 3) << err << r.dump(2);
  const std::string run3 = r["run"];
  ASSERT_EQ(h_->Cli({"rm", r["vm"]["id"]}).code, 0);
  pending = Json::parse(h_->Cli({"approvals", "--json"}).out);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0]["state"], "failed");
  EXPECT_NE(pending[0]["why"].get<std::string>().find("can no longer be carried out"),
            std::string::npos)
      << pending;
  CliResult late = h_->Cli({"approve", run3, "--model", ModelName()});
  EXPECT_NE(late.code, 0);
  EXPECT_NE(late.err.find("can no longer be carried out"), std::string::npos) << late.err;
  Json shown = Json::parse(h_->Cli({"agent", "show", run3, "--json"}).out);
  EXPECT_EQ(shown["outcome"], "ERROR") << shown.dump(2);
  EXPECT_EQ(up.accepts(), 1);  // only the approved fetch ever reached it
}

TEST_F(AgentE2E, ClaimContradictedByTheReRunIsSaidSo) {
  PushProbeReply();
  // The agent makes its file outside /workspace, so it is not there for the re-run.
  model_->Push(Turn({Call("run", {{"command", "echo built > /tmp/artifact"}})}));
  model_->Push(Turn({Call("run", {{"command", "test -f /tmp/artifact"}})}));
  model_->Push(Turn({Call("finish", {{"summary", "The artifact is built and checked."},
                                     {"verify_command", "test -f /tmp/artifact"}})}));
  int code = -1;
  std::string err;
  Json r = Agent({"--model", ModelName(), "build the artifact"}, &code, &err);
  EXPECT_EQ(code, 1) << err;
  EXPECT_EQ(r["outcome"], "DONE");
  EXPECT_EQ(r["verdict"], "FAILED_VERIFICATION");
  EXPECT_EQ(r["verification"]["exit_code"], 1);
  EXPECT_EQ(r["claim"]["status"], "contradicted");
  // Inside the agent's VM the same check passed: the report keeps both facts.
  const Json* inside = FindCommand(r, "test -f /tmp/artifact");
  ASSERT_NE(inside, nullptr);
  EXPECT_EQ((*inside)["exit_code"], 0);
  // No workspace given: the run's own repository, no files changed, no commit.
  EXPECT_TRUE(r["files"]["changes"].empty());
  EXPECT_TRUE(r["commit"].is_null());
  CliResult text = h_->Cli({"agent", "show", r["run"]});
  EXPECT_NE(text.out.find("CONTRADICTED"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("Verdict: FAILED_VERIFICATION\n"), std::string::npos);
}

TEST_F(AgentE2E, QuestionReturnsNeedsInputAndTheAnswerContinuesInTheSameVm) {
  PushProbeReply();
  model_->Push(Turn({Call("run", {{"command", "echo draft > draft.txt"}}),
                     Call("ask", {{"question", "Which greeting should I use?"}})}));
  int code = -1;
  std::string err;
  Json r = Agent({"--model", ModelName(), "write a greeting"}, &code, &err);
  ASSERT_EQ(code, 3) << err << r.dump(2);
  EXPECT_EQ(r["outcome"], "NEEDS_INPUT");
  EXPECT_EQ(r["question"]["text"], "Which greeting should I use?");
  EXPECT_EQ(r["vm"]["state"], "running");
  std::string run = r["run"];
  std::string vm = r["vm"]["id"];

  model_->Push(
      Turn({Call("run", {{"command", "test -f draft.txt && echo bonjour > greeting.txt"}})}));
  model_->Push(Turn({Call("finish", {{"summary", "greeting.txt says bonjour"},
                                     {"verify_command", "grep -qx bonjour greeting.txt"}})}));
  CliResult a = h_->Cli({"agent", "answer", run, "Use bonjour", "--model", ModelName(), "--json"});
  ASSERT_EQ(a.code, 0) << a.err << a.out;
  Json done = Json::parse(a.out);
  EXPECT_EQ(done["run"], run);
  EXPECT_EQ(done["vm"]["id"], vm);  // the same VM: draft.txt was still there
  EXPECT_EQ(done["verdict"], "VERIFIED");
  const Json* second = FindCommand(done, "test -f draft.txt && echo bonjour > greeting.txt");
  ASSERT_NE(second, nullptr);
  EXPECT_EQ((*second)["exit_code"], 0);
  // The answer reached the model as the result of its ask call, after the run's result.
  auto reqs = MyRequests();
  ASSERT_EQ(reqs.size(), 4u);
  auto tools = ToolMessages(reqs[2].body);
  ASSERT_EQ(tools.size(), 2u);
  EXPECT_NE(tools[0].find("exit code 0"), std::string::npos);
  EXPECT_NE(tools[1].find("Use bonjour"), std::string::npos);
  // A finished run takes no more answers.
  CliResult again = h_->Cli({"agent", "answer", run, "more", "--model", ModelName()});
  EXPECT_EQ(again.code, 125);
  EXPECT_NE(again.err.find("is DONE, not NEEDS_INPUT"), std::string::npos) << again.err;
}

TEST_F(AgentE2E, WallClockAndTurnLimitsReturnInProgressAndResumeContinues) {
  PushProbeReply();
  model_->Push(
      Turn({Call("run", {{"command", "echo one > one.txt; sleep 20"}, {"timeout_s", 60}})}));
  int code = -1;
  std::string err;
  Json r = Agent({"--model", ModelName(), "--timeout", "3", "slow task"}, &code, &err);
  ASSERT_EQ(code, 4) << err << r.dump(2);
  EXPECT_EQ(r["outcome"], "IN_PROGRESS");
  EXPECT_NE(r["reason"].get<std::string>().find("wall clock of 3 s"), std::string::npos);
  // The command was cut at the wall clock, and says so.
  const Json* slow = FindCommand(r, "echo one > one.txt; sleep 20");
  ASSERT_NE(slow, nullptr);
  EXPECT_EQ((*slow)["outcome"], "timed_out");
  std::string run = r["run"];

  model_->Push(Turn({Call("run", {{"command", "echo two > two.txt"}})}));
  CliResult a =
      h_->Cli({"agent", "resume", run, "--model", ModelName(), "--max-turns", "1", "--json"});
  ASSERT_EQ(a.code, 4) << a.err;
  Json mid = Json::parse(a.out);
  EXPECT_NE(mid["reason"].get<std::string>().find("limit of 1 model turns"), std::string::npos);

  model_->Push(Turn({Call("finish", {{"summary", "both files"},
                                     {"verify_command", "test -f one.txt && test -f two.txt"}})}));
  CliResult b = h_->Cli({"agent", "resume", run, "--model", ModelName(), "--json"});
  ASSERT_EQ(b.code, 0) << b.err << b.out;
  Json done = Json::parse(b.out);
  EXPECT_EQ(done["verdict"], "VERIFIED");
  EXPECT_EQ(done["usage"]["turns"], 3);
}

TEST_F(AgentE2E, MalformedToolCallsGetAnErrorBackAndTheRunGoesOn) {
  PushProbeReply();
  model_->Push({{"tool_calls", {{{"name", "run"}, {"raw_arguments", "{\"command\": \"echo hi"}}}}});
  model_->Push(Turn({Call("format_disk", {{"device", "/dev/vda"}})}));
  model_->Push(Turn({Call("run", {{"command", 42}})}));
  model_->Push(Turn({Call("read_file", {{"path", "/etc/hostname"}, {"max_bytes", 4}})}));
  model_->Push(Turn({Call("finish", {{"summary", "nothing to verify"}})}));
  int code = -1;
  std::string err;
  Json r = Agent({"--model", ModelName(), "be difficult"}, &code, &err);
  EXPECT_EQ(code, 2) << err << r.dump(2);
  EXPECT_EQ(r["outcome"], "DONE");
  EXPECT_EQ(r["verdict"], "UNVERIFIED");
  EXPECT_TRUE(r["commands"].empty()) << "no malformed call may run anything";
  auto reqs = MyRequests();
  ASSERT_EQ(reqs.size(), 6u);
  auto t1 = ToolMessages(reqs[2].body);
  ASSERT_FALSE(t1.empty());
  EXPECT_NE(t1.back().find("not a JSON object"), std::string::npos) << t1.back();
  auto t2 = ToolMessages(reqs[3].body);
  EXPECT_NE(t2.back().find("no tool named \"format_disk\""), std::string::npos) << t2.back();
  auto t3 = ToolMessages(reqs[4].body);
  EXPECT_NE(t3.back().find("'command' must be a string"), std::string::npos) << t3.back();
  auto t4 = ToolMessages(reqs[5].body);
  EXPECT_NE(t4.back().find("cut at 4 bytes"), std::string::npos) << t4.back();
}

TEST_F(AgentE2E, TruncatedContextStopsTheRunWithAnError) {
  PushProbeReply();
  model_->Push(Turn({Call("run", {{"command", "seq 1 20000"}})}));
  // The provider counts a fraction of what it was sent: its window cut the prompt.
  model_->Push({{"text", "all good"}, {"input_tokens", 300}});
  int code = -1;
  std::string err;
  Json r = Agent({"--model", ModelName(), "count"}, &code, &err);
  EXPECT_EQ(code, 5) << err << r.dump(2);
  EXPECT_EQ(r["outcome"], "ERROR");
  EXPECT_EQ(r["error"]["kind"], "context_truncated");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("300"), std::string::npos);
}

TEST_F(AgentE2E, ModelThatFailsTheStartUpProbeStartsNoVm) {
  size_t vms_before = Json::parse(h_->Cli({"ls", "--json"}).out).size();
  model_->Push({{"text", "ok"}, {"input_tokens", 2050}});
  CliResult r = h_->Cli({"agent", "--image", "debian-12", "--model", ModelName(), "anything"});
  EXPECT_EQ(r.code, 125);
  EXPECT_NE(r.err.find("start-up probe"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("2050"), std::string::npos) << r.err;
  CliResult ls = h_->Cli({"ls", "--json"});
  EXPECT_EQ(Json::parse(ls.out).size(), vms_before) << ls.out;
}

TEST_F(AgentE2E, AnthropicProviderWorksOverItsOwnWireFormat) {
  PushProbeReply();
  model_->Push(Turn({Call("run", {{"command", "uname -s"}})}));
  model_->Push(Turn({Call(
      "finish", {{"summary", "it is Linux"}, {"verify_command", "uname -s | grep -qx Linux"}})}));
  int code = -1;
  std::string err;
  Json r = Agent({"--provider", "anthropic", "--model", ModelName(), "which kernel?"}, &code, &err);
  ASSERT_EQ(code, 0) << err << r.dump(2);
  EXPECT_EQ(r["model"]["provider"], "anthropic");
  auto reqs = MyRequests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[1].path, "/v1/messages");
  EXPECT_EQ(reqs[1].headers["x-api-key"], kKey);
  // The run's result went back as a tool_result block.
  const Json& last = reqs[2].body["messages"].back();
  EXPECT_EQ(last["role"], "user");
  EXPECT_EQ(last["content"][0]["type"], "tool_result");
}

TEST_F(AgentE2E, FailingSetupHookStopsTheRunBeforeTheModelIsAsked) {
  std::string repo = tmp_->path() + "/repo";
  Sh("git init -q -b main '" + repo + "' && cd '" + repo +
     "' && mkdir .trybox && printf 'echo setting up; exit 7\\n' > .trybox/setup.sh");
  PushProbeReply();
  int code = -1;
  std::string err;
  Json r = Agent({"--model", ModelName(), "--workspace", repo, "anything"}, &code, &err);
  EXPECT_EQ(code, 5) << err << r.dump(2);
  EXPECT_EQ(r["outcome"], "ERROR");
  EXPECT_EQ(r["error"]["kind"], "setup_failed");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("exit code 7"), std::string::npos);
  ASSERT_EQ(r["commands"].size(), 1u);
  EXPECT_EQ(r["commands"][0]["tool"], "setup");
  EXPECT_EQ(r["commands"][0]["exit_code"], 7);
  EXPECT_EQ(r["vm"]["state"], "destroyed");
  EXPECT_EQ(MyRequests().size(), 1u) << "only the probe: the model was never asked";
}

TEST_F(AgentE2E, TheKeyIsNeverWrittenAnywhereNorSeenByTheGuest) {
  PushProbeReply();
  model_->Push(Turn({Call("run", {{"command",
                                   "env; cat /proc/cmdline; grep -r sk-test / --exclude-dir=proc "
                                   "--exclude-dir=sys 2>/dev/null | head -c 300; true"}})}));
  model_->Push(Turn({Call("finish", {{"summary", "looked"}})}));
  int code = -1;
  std::string err;
  Json r = Agent({"--model", ModelName(), "look for secrets"}, &code, &err);
  ASSERT_EQ(code, 2) << err;
  auto reqs = MyRequests();
  ASSERT_EQ(reqs.size(), 3u);
  auto tools = ToolMessages(reqs[2].body);
  ASSERT_EQ(tools.size(), 1u);
  EXPECT_EQ(tools[0].find(kKey), std::string::npos) << "the guest saw the key";
  EXPECT_EQ(r.dump().find(kKey), std::string::npos);
  EXPECT_EQ(err.find(kKey), std::string::npos);
  // Nothing under the daemon's home (store, WAL, log, run directories) holds it.
  auto grep = RunCommand({"grep", "-rlF", "--", kKey, h_->home()});
  ASSERT_TRUE(grep.ok());
  EXPECT_EQ(grep->output, "") << "files holding the key: " << grep->output;
}

}  // namespace
}  // namespace trybox::e2e

namespace trybox::e2e {
namespace {

// A run left waiting gives its VM back after TRYBOX_AGENT_IDLE_S; it cannot continue then,
// and says why.
TEST(AgentIdleE2E, WaitingRunsVmIsDestroyedAfterTheIdleTimeAndItSaysSo) {
  auto m = FakeModelServer::Start();
  ASSERT_TRUE(m.ok());
  auto h = Harness::Start(
      {"OPENAI_BASE_URL=" + (*m)->openai_base_url(), "OPENAI_MODEL=idle", "TRYBOX_AGENT_IDLE_S=2"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  (*m)->Push({{"text", "ok"}});
  (*m)->Push(Turn({Call("ask", {{"question", "Shall I?"}})}));
  CliResult r = (*h)->Cli({"agent", "--image", "debian-12", "--json", "wait for me"});
  ASSERT_EQ(r.code, 3) << r.err;
  Json report = Json::parse(r.out);
  std::string run = report["run"], vm = report["vm"]["id"];
  // Poll the daemon's own view until the VM is gone (the reaper wakes every 2 s here).
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string state;
  while (std::chrono::steady_clock::now() < until) {
    Json shown = Json::parse((*h)->Cli({"agent", "show", run, "--json"}).out);
    state = shown["vm"]["state"];
    if (state == "destroyed" && shown.contains("expired")) {
      EXPECT_NE(shown["expired"].get<std::string>().find("no call for 2 s"), std::string::npos);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_EQ(state, "destroyed");
  CliResult a = (*h)->Cli({"agent", "answer", run, "yes"});
  EXPECT_EQ(a.code, 125);
  EXPECT_NE(a.err.find("expired"), std::string::npos) << a.err;
  EXPECT_EQ((*m)->steps_left(), 0u);
}

}  // namespace
}  // namespace trybox::e2e
