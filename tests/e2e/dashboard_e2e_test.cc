// End to end: the web dashboard (docs/dashboard.md) in headless Chromium, driven by
// puppeteer-core (tests/ui/dashboard.mjs, installed by `npm ci --prefix tests/ui`) against a
// private tryboxd serving on loopback, real guests, and the scripted fake model. Each test
// scripts the model for one step of the script, runs it, and asserts on its PASS/FAIL lines
// and on what the daemon and the model saw.
#include <unistd.h>

#include <cstdlib>
#include <regex>
#include <sstream>

#include "tests/e2e/agent_fixture.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

class DashboardE2E : public AgentFixture {
 protected:
  static void SetUpTestSuite() {
    AgentFixture::SetUpTestSuite();
    ASSERT_NE(h_, nullptr);
    CliResult s = h_->Cli({"serve", "--listen", "127.0.0.1:0"});
    ASSERT_EQ(s.code, 0) << s.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(s.out, m, std::regex("http://127\\.0\\.0\\.1:[0-9]+"))) << s.out;
    url_ = m[0];
    operator_key_ = NewKey("dash", true);
    sandbox_key_ = NewKey("dash-sandboxes", false);
  }

  void SetUp() override {
    AgentFixture::SetUp();
    if (HasFatalFailure()) return;
    const std::string lib =
        std::string(TRYBOX_SOURCE_DIR) + "/tests/ui/node_modules/puppeteer-core";
    ASSERT_EQ(::access(lib.c_str(), F_OK), 0)
        << "puppeteer-core is not installed: run npm ci --prefix tests/ui (scripts/test.sh does)";
    const char* chromium = std::getenv("CHROMIUM");
    ASSERT_TRUE((chromium && *chromium) || FindInPath("chromium").has_value())
        << "no chromium on the PATH: run scripts/install-deps.sh";
    ASSERT_FALSE(url_.empty());
  }

  void TearDown() override {
    AgentFixture::TearDown();
    // A step that failed before its agent run leaves the model's script unplayed; the next
    // test must not get those replies.
    for (size_t left = model_->steps_left(); left > 0; --left) {
      RunProgram({FindInPath("curl").value_or("curl"), "-s", "-o", "/dev/null", "-H",
                  "Content-Type: application/json", "-d", R"({"model":"drain","messages":[]})",
                  model_->openai_base_url() + "/chat/completions"},
                 h_->Env());
    }
  }

  static std::string NewKey(const std::string& name, bool operator_scope) {
    std::vector<std::string> args = {"api-key", "create", name};
    if (operator_scope) args.push_back("--operator");
    CliResult k = h_->Cli(args);
    EXPECT_EQ(k.code, 0) << k.err;
    return k.out.substr(0, k.out.find('\n'));
  }

  // The screenshots' directory: $TRYBOX_UI_SHOTS (kept, for a person to look at), else
  // the test's own temporary directory.
  std::string ShotsDir() const {
    const char* keep = std::getenv("TRYBOX_UI_SHOTS");
    return keep && *keep ? keep : tmp_->path() + "/shots";
  }

  // Runs dashboard.mjs STEP; its lines go to the test's log. Expects exit 0, no FAIL line
  // and at least one PASS line.
  CliResult Step(const std::string& step) {
    std::vector<std::string> env = h_->Env();
    env.push_back("TRYBOX_URL=" + url_);
    env.push_back("TRYBOX_OPERATOR_KEY=" + operator_key_);
    env.push_back("TRYBOX_SANDBOX_KEY=" + sandbox_key_);
    env.push_back("TRYBOX_CLI=" + BinDir() + "/trybox");
    env.push_back("TRYBOX_UI_SHOTS=" + ShotsDir());
    env.push_back("MODEL_NAME=" + ModelName());
    CliResult r = RunProgram({FindInPath("node").value_or("node"),
                              std::string(TRYBOX_SOURCE_DIR) + "/tests/ui/dashboard.mjs", step},
                             env);
    std::cerr << r.out;
    if (!r.err.empty()) std::cerr << "dashboard.mjs stderr:\n" << r.err;
    EXPECT_EQ(r.code, 0) << "dashboard.mjs " << step << " failed (its FAIL lines are above)";
    std::istringstream lines(r.out);
    int passed = 0;
    for (std::string line; std::getline(lines, line);) {
      EXPECT_NE(line.rfind("FAIL ", 0), 0u) << line;
      passed += line.rfind("PASS ", 0) == 0;
    }
    EXPECT_GT(passed, 0) << r.out;
    return r;
  }

  // The value of "RESULT NAME=VALUE" in dashboard.mjs's output.
  static std::string ResultOf(const CliResult& r, const std::string& name) {
    std::smatch m;
    if (!std::regex_search(r.out, m, std::regex("RESULT " + name + "=(\\S+)"))) return "";
    return m[1];
  }

  Json Show(const std::string& run) {
    CliResult s = h_->Cli({"agent", "show", run, "--json"});
    return Json::parse(s.out, nullptr, false);
  }

  static inline std::string url_;
  static inline std::string operator_key_;
  static inline std::string sandbox_key_;
};

TEST_F(DashboardE2E, SignInTakesAnOperatorKeyAndCrossSiteRequestsAreRefused) {
  Step("auth");
  // The key is never in the daemon's log, nor a session's cookie.
  const std::string log = ReadFileToString(h_->home() + "/tryboxd.log").value_or("");
  EXPECT_EQ(log.find(operator_key_), std::string::npos) << "the operator key is in the log";
  EXPECT_EQ(log.find("trybox_session="), std::string::npos) << "a session cookie is in the log";
}

TEST_F(DashboardE2E, ExecOutputReachesTheVmPageWhileTheCommandRuns) { Step("live"); }

TEST_F(DashboardE2E, ApprovingANetworkRequestInTheOverviewContinuesTheRun) {
  PushProbeReply();
  model_->Push(Turn(
      {Call("request_network", {{"host", "dash.test"}, {"port", 443}, {"reason", "the data"}})}));
  model_->Push(Turn({Call("finish", {{"summary", "fetched"}})}));
  CliResult r = Step("approval");
  const std::string run = ResultOf(r, "approval.run");
  ASSERT_FALSE(run.empty()) << r.out;
  // The model was told, in the request after the click, that a person approved.
  bool told = false;
  for (const auto& req : MyRequests()) {
    for (const auto& m : ToolMessages(req.body)) {
      told |= m.find("A person approved: dash.test:443") != std::string::npos;
    }
  }
  EXPECT_TRUE(told) << "no request to the model carried the approval";
  EXPECT_EQ(model_->steps_left(), 0u) << "the run did not go on to its finish";
  EXPECT_EQ(Show(run).value("outcome", ""), "DONE");
  // The approval is the page's: audited as the daemon's own, approving this run.
  Json audit = Json::parse(h_->Cli({"audit", "--json"}).out, nullptr, false);
  bool granted = false;
  for (const auto& e : audit) {
    granted |= e.value("reason", "").find("approving run " + run) != std::string::npos;
  }
  EXPECT_TRUE(granted) << audit.dump(2);
}

TEST_F(DashboardE2E, CancelOnTheRunPageCancelsTheRun) {
  PushProbeReply();
  model_->Push(Turn({Call("run", {{"command", "sleep 60"}, {"timeout_s", 300}})}));
  CliResult r = Step("cancel");
  const std::string run = ResultOf(r, "cancel.run");
  ASSERT_FALSE(run.empty()) << r.out;
  Json report = Show(run);
  EXPECT_EQ(report.value("outcome", ""), "CANCELLED") << report.dump(2);
  const Json* sleep = FindCommand(report, "sleep 60");
  ASSERT_NE(sleep, nullptr) << report.dump(2);
  EXPECT_EQ((*sleep)["outcome"], "cancelled");
}

TEST_F(DashboardE2E, MarkupFromGuestsAndModelsIsShownAsText) {
  PushProbeReply();
  model_->Push(Turn({Call(
      "run",
      {{"command", "printf '%s\\n' '<img src=x onerror=window.__pwned=7>' | tee planted.html"}})}));
  model_->Push(Turn({Call(
      "finish",
      {{"summary",
        R"js(<img src=x onerror="window.__pwned=5;alert(5)"><script>window.__pwned=6</script> done)js"}})}));
  Step("markup");
}

TEST_F(DashboardE2E, EveryPageRendersAtDesktopAndPhoneWidths) {
  PushProbeReply();
  model_->Push(Turn({Call("run", {{"command", "echo preparing"}}),
                     Call("ask", {{"question", "Which greeting should I use?"}})}));
  Step("screens");
  for (const char* page : {"login", "overview", "vm", "run", "network", "images"}) {
    for (const char* size : {"desktop", "phone"}) {
      const std::string path = ShotsDir() + "/" + page + "-" + size + ".png";
      auto png = ReadFileToString(path);
      ASSERT_TRUE(png.ok()) << path;
      EXPECT_EQ(png->substr(0, 8), "\x89PNG\r\n\x1a\n") << path;
    }
  }
}

}  // namespace
}  // namespace trybox::e2e
