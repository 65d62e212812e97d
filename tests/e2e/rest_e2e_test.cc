// End to end: trybox's own REST routes (docs/protocol/rest.md), driven by a Python
// `requests` program (tests/rest/agent_run.py) against a private tryboxd booting real guests
// and a scripted fake model on loopback: an agent run started and followed as server-sent
// events, a run that asks waiting as an approval and then answered, the audit, the VMs, and
// what must be refused. Also: a key's scope is kept by the store and shown by `api-key ls`.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "tests/e2e/agent_fixture.h"
#include "tests/e2e/harness.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

class RestE2E : public AgentFixture {
 protected:
  // `trybox serve` once for the suite; a key of the scope asked for.
  static std::string Serve() {
    CliResult s = h_->Cli({"serve", "--listen", "127.0.0.1:0"});
    EXPECT_EQ(s.code, 0) << s.err;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(s.out, m, std::regex("http://127\\.0\\.0\\.1:[0-9]+"))) << s.out;
    return m.empty() ? "" : m[0].str();
  }
  static std::string NewKey(const std::string& name, bool operator_scope) {
    std::vector<std::string> args = {"api-key", "create", name};
    if (operator_scope) args.push_back("--operator");
    CliResult k = h_->Cli(args);
    EXPECT_EQ(k.code, 0) << k.err;
    return k.out.substr(0, k.out.find('\n'));
  }
};

TEST_F(RestE2E, PythonRunsAnAgentFollowsItsEventsAnswersItsQuestionAndIsRefusedClearly) {
  const std::string url = Serve();
  ASSERT_FALSE(url.empty());
  const std::string key = NewKey("rest-operator", true);
  const std::string sandbox_key = NewKey("rest-sandboxes", false);

  // The first run: a command and a claim that the daemon's own re-run checks.
  PushProbeReply();
  model_->Push(Turn({Call("run", {{"command", "echo hello > greeting.txt"}})}));
  model_->Push(Turn({Call("finish", {{"summary", "greeting.txt says hello"},
                                     {"verify_command", "grep -qx hello greeting.txt"}})}));
  // The second: a question first, the rest after the answer.
  model_->Push(Turn({Call("ask", {{"question", "Which greeting should I use?"}})}));
  model_->Push(Turn({Call("run", {{"command", "echo bonjour > greeting.txt"}})}));
  model_->Push(Turn({Call("finish", {{"summary", "greeting.txt says bonjour"},
                                     {"verify_command", "grep -qx bonjour greeting.txt"}})}));

  // A VM whose list the script changes over HTTP.
  CliResult vm = h_->Cli({"create", "--allow", "a.test"});
  ASSERT_EQ(vm.code, 0) << vm.err;
  const std::string vm_id = vm.out.substr(0, vm.out.find('\n'));

  std::vector<std::string> env = h_->Env();
  env.push_back("TRYBOX_VM=" + vm_id);
  env.push_back("TRYBOX_URL=" + url);
  env.push_back("TRYBOX_KEY=" + key);
  env.push_back("TRYBOX_SANDBOX_KEY=" + sandbox_key);
  env.push_back("MODEL_BASE_URL=" + model_->openai_base_url());
  env.push_back("MODEL_NAME=" + ModelName());
  CliResult r = RunProgram({FindInPath("python3").value_or("python3"),
                            std::string(TRYBOX_SOURCE_DIR) + "/tests/rest/agent_run.py"},
                           env);
  ASSERT_EQ(r.code, 0) << "agent_run.py failed; stderr:\n" << r.err << "\nstdout:\n" << r.out;
  Json out = Json::parse(r.out, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.out;

  // The run, as it went: progress while its VM starts (naming the run), the run once it is
  // registered, progress on the way, its report at the end.
  const Json& names = out["run_events"];
  ASSERT_TRUE(names.is_array()) << out.dump(2);
  ASSERT_GE(names.size(), 3u) << names.dump();
  EXPECT_EQ(names[0], "progress") << names.dump();
  EXPECT_NE(std::find(names.begin(), names.end(), "run"), names.end()) << names.dump();
  EXPECT_EQ(names.back(), "end");
  EXPECT_EQ(out["run"]["outcome"], "DONE") << out.dump(2);
  EXPECT_EQ(out["run"]["verdict"], "VERIFIED") << out.dump(2);
  EXPECT_EQ(out["run"]["first_event"][1]["progress"]["run"], out["run"]["id"]);
  EXPECT_EQ(out["run"]["text_has_verdict"], true);
  EXPECT_EQ(out["show"]["status"], 200);
  EXPECT_EQ(out["show"]["outcome"], "DONE");
  const Json& listed = out["listed"];
  EXPECT_NE(std::find(listed.begin(), listed.end(), out["run"]["id"]), listed.end())
      << listed.dump();
  EXPECT_EQ(out["follow_ended"], Json::array({"end"})) << out["follow_ended"].dump();

  // The run that asked waited as an approval, and went on once answered.
  EXPECT_EQ(out["asked"]["outcome"], "NEEDS_INPUT") << out.dump(2);
  ASSERT_EQ(out["approvals"].size(), 1u) << out.dump(2);
  EXPECT_EQ(out["approvals"][0]["question"], "Which greeting should I use?");
  EXPECT_EQ(out["approvals"][0]["kind"], "agent_question");
  EXPECT_EQ(out["answered"]["outcome"], "DONE") << out.dump(2);
  EXPECT_EQ(out["answered"]["verdict"], "VERIFIED") << out.dump(2);
  EXPECT_EQ(out["approvals_after"], Json::array());

  // The VM's list, changed over HTTP, then in force and audited.
  EXPECT_EQ(out["egress"]["status"], 200) << out.dump(2);
  EXPECT_EQ(out["egress"]["body"]["egress"]["allow"], Json({"a.test:443", "b.test:8080"}));
  EXPECT_EQ(out["egress"]["body"]["egress"]["deny"], Json({"c.test"}));
  CliResult audit = h_->Cli({"audit", "--vm", vm_id, "--json"});
  EXPECT_NE(audit.out.find("allowed b.test:8080 on the running VM, asked by uid"),
            std::string::npos)
      << audit.out;
  EXPECT_EQ(out["audit"]["status"], 200);
  EXPECT_EQ(out["audit"]["has_rows"], true);
  EXPECT_EQ(out["vms"]["status"], 200);
  EXPECT_EQ(out["vms"]["is_list"], true);

  // Each refusal with its own status and words.
  const Json& no = out["refused"];
  auto expect = [&](const char* what, int status, const std::string& says) {
    EXPECT_EQ(no[what]["status"], status) << what << ": " << no[what].dump();
    EXPECT_NE(no[what]["message"].get<std::string>().find(says), std::string::npos)
        << what << ": " << no[what].dump();
  };
  expect("unknown_run", 404, "r0000000000");
  expect("bad_run_id", 400, "run id");
  expect("bad_json", 400, "not valid JSON");
  expect("no_task", 400, "task");
  expect("collect_into", 400, "into is not taken");
  expect("egress_field", 400, "mode is not a field of an egress change");
  expect("egress_entry", 400, "IP literal");
  expect("egress_no_vm", 404, "no VM with id");
  expect("bad_limit", 400, "limit");
  expect("sandbox_key", 403, "--operator");
  expect("sandbox_key_slashes", 403, "--operator");
  EXPECT_EQ(no["no_key"]["status"], 401);
  expect("cancel_done", 409, "nothing to cancel");
  EXPECT_EQ(no["cancel_done"]["code"], "FAILED_PRECONDITION");
  EXPECT_EQ(model_->steps_left(), 0u);

  // Neither the model's key nor an API key is in the daemon's log.
  const std::string log = ReadFileToString(h_->home() + "/tryboxd.log").value_or("");
  EXPECT_EQ(log.find("sk-rest-test-not-a-real-key"), std::string::npos);
  EXPECT_EQ(log.find(key), std::string::npos);
  EXPECT_NE(log.find("POST /trybox/v1/agent-runs 200"), std::string::npos);

  // The scope is kept, and shown.
  CliResult ls = h_->Cli({"api-key", "ls"});
  EXPECT_NE(ls.out.find("rest-operator"), std::string::npos) << ls.out;
  EXPECT_TRUE(std::regex_search(ls.out, std::regex("rest-operator +key-[0-9a-f]+ +operator")))
      << ls.out;
  EXPECT_TRUE(std::regex_search(ls.out, std::regex("rest-sandboxes +key-[0-9a-f]+ +sandboxes")))
      << ls.out;
}

}  // namespace
}  // namespace trybox::e2e
