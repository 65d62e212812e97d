// The daemon's request parsers: every field type- and range-checked, errors naming it,
// nothing thrown on any input (the attack campaign's cases among them).
#include "daemon/requests.h"

#include <gtest/gtest.h>

namespace trybox::daemon {
namespace {

Json J(const std::string& text) { return Json::parse(text); }

void ExpectInvalid(const Status& st, const std::string& names) {
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find(names), std::string::npos) << st.message();
}

TEST(DaemonRequestsTest, CreateDefaultsAndRanges) {
  auto r = ParseCreate(J("{}"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->image, "debian-12");
  EXPECT_EQ(r->memory_mib, 512);
  EXPECT_EQ(r->cpus, 1);
  EXPECT_FALSE(r->ephemeral);
  r = ParseCreate(J(R"({"image":"x_1","memory_mib":1024,"cpus":2,"allow":["a.com"],
                        "profiles":["p"],"ephemeral":true,"cold":true,"privileged":true})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->memory_mib, 1024);
  EXPECT_TRUE(r->privileged);
  EXPECT_EQ(r->allow, std::vector<std::string>{"a.com"});
}

TEST(DaemonRequestsTest, CreateAndAgentTakeHttpRulesAsTheirTexts) {
  auto r = ParseCreate(J(R"({"http_rules":["allow GET a.test/x","deny * a.test"]})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->http_rules, (std::vector<std::string>{"allow GET a.test/x", "deny * a.test"}));
  EXPECT_FALSE(ParseCreate(J(R"({"http_rules":"allow GET a.test"})")).ok());
  EXPECT_FALSE(ParseCreate(J(R"({"http_rules":[1]})")).ok());
}

TEST(DaemonRequestsTest, CreateTakesSecretsAndItsErrorsNeverQuoteAValue) {
  auto r = ParseCreate(J(R"({"secrets":[{"name":"GH","value":"v-123","hosts":["a.test"]},
                         {"name":"B","value":"w","hosts":["*.b.test"],"body":true,
                          "keep_cookies":true,"target":true}]})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_NE(r->secrets, nullptr);
  const auto& held = r->secrets->entries();
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].name, "GH");
  EXPECT_EQ(held[0].value.view(), "v-123");
  EXPECT_EQ(held[0].hosts, std::vector<std::string>{"a.test"});
  EXPECT_FALSE(held[0].body);
  EXPECT_TRUE(held[1].body);
  EXPECT_TRUE(held[1].keep_cookies);
  EXPECT_FALSE(held[0].target);
  EXPECT_TRUE(held[1].target);
  EXPECT_EQ(ParseCreate(J("{}"))->secrets, nullptr);
  ExpectInvalid(ParseCreate(J(R"({"secrets":{}})")).status(), "'secrets' must be an array");
  ExpectInvalid(ParseCreate(J(R"({"secrets":[1]})")).status(), "secrets[0]");
  ExpectInvalid(ParseCreate(J(R"({"secrets":[{"name":"A","hosts":["a.test"]}]})")).status(),
                "'secrets[0].value'");
  auto bad = ParseCreate(J(R"({"secrets":[{"name":"A","value":"sekrit-77","hosts":"a.test"}]})"));
  ExpectInvalid(bad.status(), "'secrets[0].hosts'");
  EXPECT_EQ(bad.status().message().find("sekrit-77"), std::string::npos);
}

TEST(DaemonRequestsTest, MemoryThatWrapsA32BitIntIsRefusedNotTruncated) {
  // 4294967808 boots 512 MiB if read as an int.
  ExpectInvalid(ParseCreate(J(R"({"memory_mib":4294967808})")).status(), "'memory_mib'");
  ExpectInvalid(ParseCreate(J(R"({"memory_mib":64})")).status(), "from 128 to 65536");
  ExpectInvalid(ParseCreate(J(R"({"memory_mib":512.5})")).status(), "'memory_mib'");
  ExpectInvalid(ParseCreate(J(R"({"memory_mib":"512"})")).status(), "'memory_mib'");
  ExpectInvalid(ParseCreate(J(R"({"cpus":0})")).status(), "'cpus'");
  ExpectInvalid(ParseCreate(J(R"({"cpus":-1})")).status(), "'cpus'");
}

TEST(DaemonRequestsTest, CreateRefusesWrongTypesBeforeAnythingBoots) {
  // An "ephemeral":"yes" left a VM running.
  ExpectInvalid(ParseCreate(J(R"({"ephemeral":"yes"})")).status(), "'ephemeral'");
  ExpectInvalid(ParseCreate(J(R"({"cold":1})")).status(), "'cold'");
  ExpectInvalid(ParseCreate(J(R"({"allow":"a.com"})")).status(), "'allow'");
  ExpectInvalid(ParseCreate(J(R"({"allow":[1]})")).status(), "'allow'");
  ExpectInvalid(ParseCreate(J(R"({"image":"../x"})")).status(), "image name");
  ExpectInvalid(ParseCreate(J(R"({"image":7})")).status(), "'image'");
  ExpectInvalid(ParseCreate(J("[1,2]")).status(), "JSON object");
}

TEST(DaemonRequestsTest, TimeoutsAreIntegersInRange) {
  // --timeout 4294967.297 killed after 1 ms; 1e20 meant no timeout.
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"timeout_ms":4294967297.5})")).status(),
                "'timeout_ms'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"timeout_ms":1e20})")).status(),
                "'timeout_ms'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"timeout_ms":-1})")).status(),
                "'timeout_ms'");
  ExpectInvalid(
      ParseExec(J(R"({"vm":"a","argv":["x"],"timeout_ms":18446744073709551615})")).status(),
      "'timeout_ms'");
  auto r = ParseExec(J(R"({"vm":"a","argv":["x"],"timeout_ms":4294967297})"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->timeout_ms, 4294967297);
}

TEST(DaemonRequestsTest, ExecFields) {
  auto r = ParseExec(J(R"({"vm":"a","argv":["sh","-c","x"],"env":{"K":"V"},"cwd":"/tmp",
                          "stdin":true,"user":"user"})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->argv.size(), 3u);
  EXPECT_EQ(r->env.at("K"), "V");
  EXPECT_EQ(*r->cwd, "/tmp");
  EXPECT_TRUE(r->stdin);
  EXPECT_EQ(r->user, "user");
  EXPECT_FALSE(ParseExec(J(R"({"vm":"a"})")).ok());
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":[]})")).status(), "'argv'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":[1]})")).status(), "'argv'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"env":{"K":1}})")).status(), "'env'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"env":{"A=B":"1"}})")).status(), "'env'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"cwd":"rel"})")).status(), "'cwd'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"stdin":"no"})")).status(), "'stdin'");
  ExpectInvalid(ParseExec(J(R"({"vm":1,"argv":["x"]})")).status(), "'vm'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a/b","argv":["x"]})")).status(), "VM id");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"user":"../root"})")).status(), "user name");
}

TEST(DaemonRequestsTest, PutModesAndTimes) {
  auto r = ParsePut(J(R"({"vm":"a","path":"/x","kind":"file","mode":493,"mtime_ns":-5})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->mode, 493);
  EXPECT_EQ(*r->mtime_ns, -5);
  EXPECT_FALSE(ParsePut(J(R"({"vm":"a","path":"/x","kind":"file"})"))->mtime_ns.has_value());
  ExpectInvalid(ParsePut(J(R"({"vm":"a","path":"/x","kind":"dir"})")).status(), "'kind'");
  ExpectInvalid(ParsePut(J(R"({"vm":"a","path":"/x","kind":"file","mode":65536})")).status(),
                "'mode'");
  ExpectInvalid(ParsePut(J(R"({"vm":"a","path":"x","kind":"file"})")).status(), "'path'");
}

TEST(DaemonRequestsTest, CommitFieldsAndTheirChecks) {
  auto r = ParseCommit(J(R"({"vm":"a","name":"dev","env":{"LANG":"C.UTF-8"},
      "recipe":{"from":"debian-12","steps":[]},"recipe_sha256":")" +
                         std::string(64, 'a') + R"(","packages":["jq"],"replace":true})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->vm, "a");
  EXPECT_EQ(r->name, "dev");
  EXPECT_EQ(r->env.at("LANG"), "C.UTF-8");
  EXPECT_EQ(r->recipe["from"], "debian-12");
  EXPECT_EQ(r->packages, std::vector<std::string>{"jq"});
  EXPECT_TRUE(r->replace);
  auto minimal = ParseCommit(J(R"({"vm":"a","name":"dev"})"));
  ASSERT_TRUE(minimal.ok());
  EXPECT_TRUE(minimal->recipe.is_null());
  EXPECT_FALSE(minimal->replace);
  ExpectInvalid(ParseCommit(J(R"({"vm":"a"})")).status(), "'name'");
  ExpectInvalid(ParseCommit(J(R"({"vm":"a","name":"../x"})")).status(), "image name");
  ExpectInvalid(ParseCommit(J(R"({"vm":"a","name":"x","env":{"A":1}})")).status(), "'env'");
  ExpectInvalid(ParseCommit(J(R"({"vm":"a","name":"x","env":{"A=B":"1"}})")).status(), "'env'");
  ExpectInvalid(ParseCommit(J(R"({"vm":"a","name":"x","recipe":[1]})")).status(), "'recipe'");
  ExpectInvalid(ParseCommit(J(R"({"vm":"a","name":"x","recipe_sha256":"AB"})")).status(),
                "'recipe_sha256'");
  ExpectInvalid(ParseCommit(J(R"({"vm":"a","name":"x","packages":"jq"})")).status(), "'packages'");
  ExpectInvalid(ParseImageName(J(R"({"name":""})")).status(), "image name");
}

TEST(DaemonRequestsTest, AuditPagingAndLimits) {
  auto r = ParseAudit(J(R"({"limit":3500,"before_id":10})"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->limit, 3500);
  EXPECT_EQ(*r->before_id, 10);
  ExpectInvalid(ParseAudit(J(R"({"limit":0})")).status(), "'limit'");
  ExpectInvalid(ParseAudit(J(R"({"limit":"all"})")).status(), "'limit'");
  ExpectInvalid(ParseAudit(J(R"({"vm":""})")).status(), "VM id");
}

TEST(DaemonRequestsTest, DoctorProbeIsABoolean) {
  auto r = ParseDoctor(J(R"({"verb":"doctor"})"));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->probe);
  r = ParseDoctor(J(R"({"probe":true})"));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->probe);
  ExpectInvalid(ParseDoctor(J(R"({"probe":1})")).status(), "'probe'");
}

TEST(DaemonRequestsTest, PruneDryRunIsABooleanThatDefaultsToFalse) {
  auto r = ParsePrune(J(R"({"verb":"prune"})"));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->dry_run);
  r = ParsePrune(J(R"({"dry_run":true})"));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->dry_run);
  ExpectInvalid(ParsePrune(J(R"({"dry_run":"yes"})")).status(), "'dry_run'");
  ExpectInvalid(ParsePrune(J(R"([])")).status(), "");
}

TEST(DaemonRequestsTest, DaemonVerbsTakeAnObjectAndStopARestartFlag) {
  EXPECT_TRUE(ParseDaemonStatus(J(R"({"verb":"daemon_status"})")).ok());
  EXPECT_TRUE(ParseDaemonReload(J(R"({"verb":"daemon_reload"})")).ok());
  ExpectInvalid(ParseDaemonStatus(J(R"([1])")).status(), "object");
  ExpectInvalid(ParseDaemonReload(J(R"("reload")")).status(), "object");
  auto stop = ParseDaemonStop(J(R"({"verb":"daemon_stop"})"));
  ASSERT_TRUE(stop.ok());
  EXPECT_FALSE(stop->restart);
  stop = ParseDaemonStop(J(R"({"restart":true})"));
  ASSERT_TRUE(stop.ok());
  EXPECT_TRUE(stop->restart);
  ExpectInvalid(ParseDaemonStop(J(R"({"restart":"yes"})")).status(), "'restart'");
}

TEST(DaemonRequestsTest, CollectHasNoBranchOnTheWire) {
  // branch_id was reachable from the socket: a client could name another run's branch.
  auto r = ParseCollect(J(R"({"vm":"a","branch_id":"other-run","into":"/tmp/x"})"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->into, "/tmp/x");
  ExpectInvalid(ParseCollect(J(R"({"vm":"a","into":"rel"})")).status(), "'into'");
  ExpectInvalid(ParseCollect(J(R"({"vm":"a","commit":"yes"})")).status(), "'commit'");
}

TEST(DaemonRequestsTest, AgentRequestAndLimits) {
  Json model = {{"provider", "openai"}, {"model", "m"}, {"base_url", "http://127.0.0.1:1/v1"}};
  Json req = {{"task", "t"}, {"model", model}, {"limits", {{"max_turns", 3}}}};
  auto r = ParseAgent(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->limits.max_turns, 3);
  EXPECT_EQ(r->memory_mib, 1024);
  req["limits"] = {{"max_turns", 3.5}};
  ExpectInvalid(ParseAgent(req).status(), "'limits.max_turns'");
  req["limits"] = {{"wall_clock_s", 0}};
  ExpectInvalid(ParseAgent(req).status(), "'limits.wall_clock_s'");
  req["limits"] = 5;
  ExpectInvalid(ParseAgent(req).status(), "'limits'");
  req.erase("limits");
  req["task"] = "";
  ExpectInvalid(ParseAgent(req).status(), "'task'");
  req["task"] = "t";
  req["model"] = "x";
  EXPECT_FALSE(ParseAgent(req).ok());
  EXPECT_FALSE(ParseAgentContinue(J(R"({"run":"r1"})"), /*answer=*/true).ok());
  EXPECT_TRUE(ParseAgentContinue(J(R"({"run":"r1"})"), /*answer=*/false).ok());
  ExpectInvalid(ParseRunRequest(J(R"({"run":["r"]})")).status(), "'run'");
}

// Issue 13: the request's copy of the model key does not outlive the parse; the parsed
// request holds it in pages of its own.
TEST(DaemonRequestsTest, AnAgentRequestsModelKeyIsWipedOnceParsed) {
  const std::string key = "sk-request-key-0123456789";
  Json model = {{"provider", "openai"}, {"model", "m"}, {"api_key", key}};
  Json req = {{"task", "t"}, {"model", model}};
  auto r = ParseAgent(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  WipeModelKey(&req);
  EXPECT_EQ(req.dump().find(key), std::string::npos) << req.dump();
  EXPECT_EQ(req["model"]["model"], "m");
  ASSERT_TRUE(r->model.has_key());
  EXPECT_EQ(r->model.api_key->view(), key);

  Json cont = {{"run", "r1"}, {"model", model}};
  auto c = ParseAgentContinue(cont, /*answer=*/false);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  WipeModelKey(&cont);
  EXPECT_EQ(cont.dump().find(key), std::string::npos);
  ASSERT_TRUE(c->model.has_value());
  EXPECT_EQ(c->model->api_key->view(), key);
  Json no_model = {{"run", "r1"}};
  WipeModelKey(&no_model);
  EXPECT_EQ(no_model, Json({{"run", "r1"}}));
  Json not_an_object = 3;
  WipeModelKey(&not_an_object);
  EXPECT_EQ(not_an_object, 3);
}

// Issue 13: the request's JSON kept the secrets' values in ordinary memory after parsing.
TEST(DaemonRequestsTest, CreateAndAgentSecretValuesAreWipedFromTheJsonOnceParsed) {
  const std::string value = "ghp_request-secret-0123456789";
  const std::string shortv = "pw-short";  // within the string's own bytes
  Json secrets = Json::array({{{"name", "GH"}, {"value", value}, {"hosts", {"a.test"}}},
                              {{"name", "PW"}, {"value", shortv}, {"hosts", {"b.test"}}}});
  Json create = {{"secrets", secrets}};
  auto c = ParseCreate(create);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::string& text = create["secrets"][0]["value"].get_ref<const std::string&>();
  const char* bytes = text.data();
  WipeSecretValues(&create);
  // Zeroed where it lay, not only dropped from the document.
  EXPECT_EQ(std::string(bytes, value.size()), std::string(value.size(), '\0'));
  EXPECT_EQ(create.dump().find(value), std::string::npos) << create.dump();
  EXPECT_EQ(create.dump().find(shortv), std::string::npos) << create.dump();
  EXPECT_EQ(create["secrets"][0]["name"], "GH");
  ASSERT_NE(c->secrets, nullptr);
  EXPECT_EQ(c->secrets->entries()[0].value.view(), value);
  EXPECT_EQ(c->secrets->entries()[1].value.view(), shortv);

  Json agent = {
      {"task", "t"}, {"model", {{"provider", "openai"}, {"model", "m"}}}, {"secrets", secrets}};
  auto a = ParseAgent(agent);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  WipeSecretValues(&agent);
  EXPECT_EQ(agent.dump().find(value), std::string::npos) << agent.dump();
  ASSERT_NE(a->secrets, nullptr);
  EXPECT_EQ(a->secrets->entries()[0].value.view(), value);

  // Malformed entries are left as they are, and nothing throws.
  Json odd = {{"secrets", Json::array({1, {{"value", 2}}, {{"name", "X"}}})}};
  Json before = odd;
  WipeSecretValues(&odd);
  EXPECT_EQ(odd, before);
  Json not_an_object = 3;
  WipeSecretValues(&not_an_object);
  EXPECT_EQ(not_an_object, 3);
}

TEST(DaemonRequestsTest, NoInputThrows) {
  // Every JSON type in every field of every parser: an error or a value, never an exception.
  const std::vector<Json> values = {nullptr,
                                    true,
                                    -1,
                                    0,
                                    1.5,
                                    1e300,
                                    18446744073709551615u,
                                    "",
                                    "x",
                                    "/a",
                                    Json::array(),
                                    Json::array({1}),
                                    Json::object(),
                                    Json{{"a", 1}}};
  const std::vector<std::string> keys = {
      "vm",     "argv",        "env",        "cwd",      "timeout_ms", "stdin",
      "user",   "image",       "memory_mib", "cpus",     "allow",      "profiles",
      "path",   "kind",        "mode",       "mtime_ns", "limit",      "before_id",
      "dir",    "quota_bytes", "into",       "commit",   "task",       "model",
      "limits", "run",         "answer",     "offset",   "setup",      "ephemeral"};
  for (const auto& k : keys) {
    for (const auto& v : values) {
      Json req = {{"vm", "a"}, {"argv", {"x"}}, {"path", "/p"}, {"kind", "file"}};
      req[k] = v;
      EXPECT_NO_THROW({
        (void)ParseCreate(req);
        (void)ParseExec(req);
        (void)ParsePut(req);
        (void)ParseGet(req);
        (void)ParseAudit(req);
        (void)ParseWorkspaceIn(req);
        (void)ParseCollect(req);
        (void)ParseDiff(req);
        (void)ParseAgent(req);
        (void)ParseAgentContinue(req, true);
        (void)ParseRunRequest(req);
      }) << k
         << "=" << v.dump();
    }
  }
}

TEST(DaemonRequestsTest, ExecTtyAndDetach) {
  auto r = ParseExec(J(R"({"vm":"a","argv":["bash"],"tty":{"rows":40,"cols":120}})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->tty.has_value());
  EXPECT_EQ(r->tty->rows, 40);
  EXPECT_EQ(r->tty->cols, 120);
  EXPECT_FALSE(r->detach);
  r = ParseExec(J(R"({"vm":"a","argv":["x"],"detach":true})"));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->detach);
  EXPECT_FALSE(r->tty.has_value());
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"tty":{"rows":0,"cols":80}})")).status(),
                "'tty.rows'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"tty":{"rows":24}})")).status(),
                "'tty.cols'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"tty":{"rows":24,"cols":65536}})")).status(),
                "'tty.cols'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"tty":{"rows":24.5,"cols":80}})")).status(),
                "'tty.rows'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"tty":[24,80]})")).status(), "'tty'");
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"detach":"yes"})")).status(), "'detach'");
  // A detached exec has nobody to read input from.
  ExpectInvalid(ParseExec(J(R"({"vm":"a","argv":["x"],"detach":true,"stdin":true})")).status(),
                "'detach'");
  ExpectInvalid(
      ParseExec(J(R"({"vm":"a","argv":["x"],"detach":true,"tty":{"rows":1,"cols":1}})")).status(),
      "'detach'");
}

TEST(DaemonRequestsTest, OnlyAWellFormedResizeEventIsAccepted) {
  auto r = ParseResizeEvent(J(R"({"type":"resize","rows":50,"cols":200})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rows, 50);
  EXPECT_EQ(r->cols, 200);
  ExpectInvalid(ParseResizeEvent(J(R"({"type":"signal","signal":9})")).status(), "resize");
  ExpectInvalid(ParseResizeEvent(J(R"({"rows":50,"cols":200})")).status(), "'event.type'");
  ExpectInvalid(ParseResizeEvent(J(R"({"type":"resize","rows":50})")).status(), "'event.cols'");
  ExpectInvalid(ParseResizeEvent(J(R"({"type":"resize","rows":-3,"cols":2})")).status(),
                "'event.rows'");
  ExpectInvalid(ParseResizeEvent(J(R"({"type":"resize","rows":4294967320,"cols":2})")).status(),
                "'event.rows'");
  ExpectInvalid(ParseResizeEvent(J(R"({"type":"resize","rows":"50","cols":2})")).status(),
                "'event.rows'");
  ExpectInvalid(ParseResizeEvent(J("[1]")).status(), "'event'");
}

TEST(DaemonRequestsTest, LogsKillAndPortFields) {
  auto l = ParseLogs(J(R"({"exec":7})"));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->exec, 7);
  EXPECT_FALSE(l->stderr);
  EXPECT_EQ(l->offset, 0);
  EXPECT_FALSE(l->follow);
  l = ParseLogs(J(R"({"exec":7,"stream":"stderr","offset":4096,"follow":true})"));
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->stderr);
  EXPECT_EQ(l->offset, 4096);
  EXPECT_TRUE(l->follow);
  ExpectInvalid(ParseLogs(J("{}")).status(), "'exec'");
  ExpectInvalid(ParseLogs(J(R"({"exec":0})")).status(), "'exec'");
  ExpectInvalid(ParseLogs(J(R"({"exec":"7"})")).status(), "'exec'");
  ExpectInvalid(ParseLogs(J(R"({"exec":7,"offset":-1})")).status(), "'offset'");
  ExpectInvalid(ParseLogs(J(R"({"exec":7,"offset":1.5})")).status(), "'offset'");
  ExpectInvalid(ParseLogs(J(R"({"exec":7,"stream":"all"})")).status(), "'stream'");
  // Both streams at once: stdout's offset and stderr's; stderr_offset goes with both only.
  l = ParseLogs(J(R"({"exec":7,"stream":"both","offset":5,"stderr_offset":9})"));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_TRUE(l->both);
  EXPECT_FALSE(l->stderr);
  EXPECT_EQ(l->offset, 5);
  EXPECT_EQ(l->stderr_offset, 9);
  ExpectInvalid(ParseLogs(J(R"({"exec":7,"stderr_offset":9})")).status(), "'stderr_offset'");
  ExpectInvalid(ParseLogs(J(R"({"exec":7,"stream":"both","stderr_offset":-1})")).status(),
                "'stderr_offset'");

  auto k = ParseKill(J(R"({"exec":3})"));
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->signal, 9);
  EXPECT_EQ(ParseKill(J(R"({"exec":3,"signal":15})"))->signal, 15);
  ExpectInvalid(ParseKill(J(R"({"exec":3,"signal":0})")).status(), "'signal'");
  ExpectInvalid(ParseKill(J(R"({"exec":3,"signal":65})")).status(), "'signal'");
  ExpectInvalid(ParseKill(J(R"({"exec":3,"signal":"TERM"})")).status(), "'signal'");

  auto p = ParsePort(J(R"({"vm":"abc","port":8000})"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->port, 8000);
  ExpectInvalid(ParsePort(J(R"({"vm":"abc","port":0})")).status(), "'port'");
  ExpectInvalid(ParsePort(J(R"({"vm":"abc","port":65536})")).status(), "'port'");
  ExpectInvalid(ParsePort(J(R"({"vm":"abc"})")).status(), "'port'");
  ExpectInvalid(ParsePort(J(R"({"vm":"../x","port":80})")).status(), "VM id");
}

}  // namespace
}  // namespace trybox::daemon
