// End to end: what a listing is worth (issue 41). A VM created --privileged says so
// wherever VMs and exec results are shown, and in the store.
#include <sqlite3.h>

#include <regex>

#include "tests/e2e/agent_fixture.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

class VerdictE2E : public AgentFixture {};

// Issue 41.5: a VM created --privileged (its commands could reach the channel, so what it
// reports is the guest's word) says so in `ls`, `ps`, their --json, the store, the exec
// verb's reply and the REST listing; an ordinary VM says the opposite.
TEST_F(VerdictE2E, APrivilegedVmSaysSoWhereverItIsListed) {
  CliResult made = h_->Cli({"create", "--privileged"});
  ASSERT_EQ(made.code, 0) << made.err;
  const std::string priv = made.out.substr(0, made.out.find('\n'));
  made = h_->Cli({"create"});
  ASSERT_EQ(made.code, 0) << made.err;
  const std::string plain = made.out.substr(0, made.out.find('\n'));
  auto exec = h_->Call({{"verb", "exec"}, {"vm", priv}, {"argv", Json::array({"true"})}});
  ASSERT_TRUE(exec.ok()) << exec.status().ToString();
  EXPECT_EQ((*exec)["privileged"], true);
  EXPECT_EQ((*exec)["trust"], "guest_word");
  ASSERT_EQ(h_->Cli({"exec", plain, "--", "true"}).code, 0);

  // ls and ls --json.
  Json vms = Json::parse(h_->Cli({"ls", "--json"}).out, nullptr, false);
  ASSERT_TRUE(vms.is_array());
  std::map<std::string, Json> by_id;
  for (const auto& v : vms) by_id[v.value("id", "")] = v;
  EXPECT_EQ(by_id[priv]["privileged"], true);
  EXPECT_EQ(by_id[priv]["trust"], "guest_word");
  EXPECT_EQ(by_id[plain]["privileged"], false);
  EXPECT_EQ(by_id[plain]["trust"], "init");
  const std::string ls = h_->Cli({"ls"}).out;
  EXPECT_NE(ls.find("PRIVILEGED"), std::string::npos) << ls;
  EXPECT_TRUE(std::regex_search(ls, std::regex(priv + " +[^ ]+ +running +yes ")));
  EXPECT_TRUE(std::regex_search(ls, std::regex(plain + " +[^ ]+ +running +no ")));

  // ps and ps --json: each exec result of the privileged VM is labelled the guest's word.
  Json ps = Json::parse(h_->Cli({"ps", priv, "--json"}).out, nullptr, false);
  ASSERT_TRUE(ps.is_array() && !ps.empty()) << ps.dump();
  for (const auto& e : ps) {
    EXPECT_EQ(e.value("privileged", Json()), true) << e.dump();
    EXPECT_EQ(e.value("trust", ""), "guest_word") << e.dump();
  }
  Json plain_ps = Json::parse(h_->Cli({"ps", plain, "--json"}).out, nullptr, false);
  ASSERT_TRUE(plain_ps.is_array() && !plain_ps.empty());
  EXPECT_EQ(plain_ps[0]["trust"], "init");
  const std::string ps_text = h_->Cli({"ps", priv}).out;
  EXPECT_NE(ps_text.find("VM " + priv +
                         " was created --privileged: every result below is the guest's word"),
            std::string::npos)
      << ps_text;
  EXPECT_EQ(h_->Cli({"ps", plain}).out.find("guest's word"), std::string::npos);

  // The store's column, read with SQLite itself.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2((h_->home() + "/state/trybox.db").c_str(), &db, SQLITE_OPEN_READONLY,
                            nullptr),
            SQLITE_OK);
  std::map<std::string, int> stored;
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT id, privileged FROM vms", -1, &st, nullptr), SQLITE_OK);
  while (sqlite3_step(st) == SQLITE_ROW) {
    stored[reinterpret_cast<const char*>(sqlite3_column_text(st, 0))] = sqlite3_column_int(st, 1);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  EXPECT_EQ(stored[priv], 1);
  EXPECT_EQ(stored[plain], 0);

  // The REST API's listing (the dashboard's source), with an operator key.
  CliResult serve = h_->Cli({"serve", "--listen", "127.0.0.1:0"});
  ASSERT_EQ(serve.code, 0) << serve.err;
  std::smatch url;
  ASSERT_TRUE(std::regex_search(serve.out, url, std::regex("http://127\\.0\\.0\\.1:[0-9]+")));
  CliResult key = h_->Cli({"api-key", "create", "verdict-operator", "--operator"});
  ASSERT_EQ(key.code, 0) << key.err;
  CliResult rest = RunProgram({"/usr/bin/curl", "-sf", "-H",
                               "Authorization: Bearer " + key.out.substr(0, key.out.find('\n')),
                               url[0].str() + "/trybox/v1/vms"},
                              h_->Env());
  ASSERT_EQ(rest.code, 0) << rest.err;
  Json listed = Json::parse(rest.out, nullptr, false);
  bool seen = false;
  for (const auto& v : listed.value("vms", Json::array())) {
    if (v.value("id", "") != priv) continue;
    seen = true;
    EXPECT_EQ(v.value("privileged", Json()), true);
    EXPECT_EQ(v.value("trust", ""), "guest_word");
  }
  EXPECT_TRUE(seen) << rest.out;
  EXPECT_EQ(h_->Cli({"serve", "--stop"}).code, 0);
  EXPECT_EQ(h_->Cli({"rm", priv}).code, 0);
  EXPECT_EQ(h_->Cli({"rm", plain}).code, 0);
}

}  // namespace
}  // namespace trybox::e2e
