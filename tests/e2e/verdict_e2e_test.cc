// End to end: what a verdict and a listing are worth (issue 41). The verification VM runs
// nothing the agent wrote with more privilege than the check itself: every way the attack
// campaign tried to forge a VERIFIED from inside the agent's tree is planted by a scripted
// model in a real run, and the supervisor's re-run still fails. And a VM created
// --privileged says so wherever VMs and exec results are shown, and in the store.
#include <sqlite3.h>

#include <regex>

#include "tests/e2e/agent_fixture.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

class VerdictE2E : public AgentFixture {
 protected:
  // A repository `name` whose answer.txt holds 41, committed; `hook` (if not empty)
  // committed as its .trybox/setup.sh. Its path.
  std::string Repo(const std::string& name, const std::string& hook = "") {
    std::string repo = tmp_->path() + "/" + name;
    Sh("git init -q -b main '" + repo + "' && echo 41 > '" + repo + "/answer.txt'");
    if (!hook.empty()) {
      EXPECT_TRUE(MakeDirs(repo + "/.trybox").ok());
      EXPECT_TRUE(WriteFileAtomic(repo + "/.trybox/setup.sh", hook).ok());
    }
    Sh("cd '" + repo + "' && git add -A && git -c user.name=t -c user.email=t@t commit -qm base");
    return repo;
  }
  // A run whose agent runs `plant` in its VM and finishes; the caller checks that answer.txt
  // says 42. The report, and the CLI's exit code in *code.
  Json RunPlanting(const std::string& repo, const std::string& plant, const std::string& check,
                   int* code) {
    if (!probed_) PushProbeReply();  // once per model, and each test names its own
    probed_ = true;
    model_->Push(Turn({Call("run", {{"command", plant}})}));
    model_->Push(Turn({Call("finish", {{"summary", "answer.txt says 42"}})}));
    return Agent({"--model", ModelName(), "--workspace", repo, "--verify", check, "fix it"}, code);
  }
  // The steps that ran in the verification VM before the check, by name.
  static std::map<std::string, Json> Steps(const Json& report) {
    std::map<std::string, Json> out;
    const Json v = report.value("verification", Json::object());
    for (const auto& s : v.value("before", Json::array())) {
      out[s.value("step", "")] = s;
    }
    return out;
  }

  bool probed_ = false;
};

constexpr const char* kCheck = "grep -qx 42 answer.txt";

// The campaign's forge: the agent's own .trybox/setup.sh, a root hook before the check, made
// /bin/sh into /bin/true and the check "passed" while the commit's answer.txt held 41; a
// hook that edits the file checked did the same. Neither runs now, as root or at all.
TEST_F(VerdictE2E, AnAgentsOwnSetupHookNeverRunsBeforeTheCheck) {
  struct Attack {
    const char* name;
    const char* hook;
  } attacks[] = {
      {"replaces /bin/sh", "ln -sf /bin/true /bin/sh"},
      {"edits the file checked", "echo 42 > answer.txt"},
  };
  int n = 0;
  for (const auto& a : attacks) {
    SCOPED_TRACE(a.name);
    const std::string repo = Repo("repo" + std::to_string(++n));
    int code = -1;
    Json r = RunPlanting(repo,
                         std::string("mkdir -p .trybox && printf '%s\\n' '") + a.hook +
                             "' > .trybox/setup.sh && cat answer.txt",
                         kCheck, &code);
    EXPECT_EQ(code, 1) << r.dump(2);
    EXPECT_EQ(r["verdict"], "FAILED_VERIFICATION");
    EXPECT_EQ(r["verification"]["outcome"], "exited");
    EXPECT_EQ(r["verification"]["exit_code"], 1);
    EXPECT_EQ(r["claim"]["status"], "contradicted");
    // The commit holds the agent's hook and an answer of 41: what the check ran on.
    const std::string branch = "trybox/" + r["run"].get<std::string>();
    EXPECT_EQ(Sh("git -C '" + repo + "' show '" + branch + ":answer.txt'"), "41\n");
    EXPECT_EQ(Sh("git -C '" + repo + "' show '" + branch + ":.trybox/setup.sh'"),
              std::string(a.hook) + "\n");
    // The report says what ran before the check: the copy, tryboxd's chown, and no hook
    // (the caller had none); the tree's own hook, changed by the run, did not run.
    auto steps = Steps(r);
    EXPECT_EQ(r["verification"]["before"].size(), 3u) << r["verification"].dump(2);
    EXPECT_EQ(r["verification"]["before"][0]["step"], "copy");
    EXPECT_EQ(steps["chown"]["user"], "root");
    EXPECT_EQ(steps["chown"]["exit_code"], 0);
    EXPECT_EQ(steps["setup"]["outcome"], "none");
    EXPECT_EQ(steps["setup"]["tree_hook"], "changed");
    CliResult text = h_->Cli({"agent", "show", r["run"]});
    EXPECT_NE(text.out.find("no setup hook (the caller's workspace had none)"), std::string::npos)
        << text.out;
    EXPECT_NE(text.out.find("(changed by the run) was not run"), std::string::npos) << text.out;
  }
}

// Files in the agent's tree that a root step would follow or execute, if one did: a .trybox
// that is a symbolic link to a directory holding a setup.sh that writes 42; a set-uid copy
// of a shell (which the check, running the agent's code as checks do, tries to become root
// with); a .git with a hook and an fsmonitor command that write 42 (git never runs in the
// verification VM, and .git never leaves the agent's VM). The check passes if any of them
// took effect; none does.
TEST_F(VerdictE2E, FilesARootStepWouldFollowOrExecuteChangeNothing) {
  const std::string repo = Repo("repo");
  const std::string plant =
      "mkdir -p evil .git/hooks && printf 'echo 42 > answer.txt\\n' > evil/setup.sh && "
      "ln -s evil .trybox && cp /bin/dash suid-sh && chmod 4755 suid-sh && "
      "printf '#!/bin/sh\\necho 42 > /workspace/answer.txt\\n' > .git/hooks/post-checkout && "
      "chmod 755 .git/hooks/post-checkout && "
      "printf '[core]\\n\\tfsmonitor = echo 42 > /workspace/answer.txt\\n' > .git/config && "
      "ls -l suid-sh";
  const std::string check =
      "grep -qx 42 answer.txt || { test -u suid-sh && ./suid-sh -p -c 'id -u' | grep -qx 0; }";
  int code = -1;
  Json r = RunPlanting(repo, plant, check, &code);
  EXPECT_EQ(code, 1) << r.dump(2);
  EXPECT_EQ(r["verdict"], "FAILED_VERIFICATION");
  EXPECT_EQ(r["verification"]["exit_code"], 1) << r["verification"].dump(2);
  auto steps = Steps(r);
  EXPECT_EQ(steps["setup"]["outcome"], "none");
  // .trybox is a link in the tree, so the tree has no .trybox/setup.sh of its own.
  EXPECT_EQ(steps["setup"]["tree_hook"], "none");
  // What came back: the link as a link, the shell without its set-uid bit, no .git.
  const std::string branch = "trybox/" + r["run"].get<std::string>();
  EXPECT_EQ(Sh("git -C '" + repo + "' ls-tree '" + branch + "' .trybox suid-sh | cut -c1-6"),
            "120000\n100755\n");
  for (const auto& c : r["files"]["changes"]) {
    EXPECT_EQ(c.value("path", "").rfind(".git/", 0), std::string::npos) << c.dump();
  }
}

// The caller's own hook, committed in the base, runs in the verification VM as `user` (the
// check's account), from the host's record of what went into the run, while the agent's
// rewrite of it (which would write 42) never runs. The report names each step and the hook's
// blob, which is the base commit's.
TEST_F(VerdictE2E, TheCallersHookRunsAsUserFromTheBaseCommitAndEachStepIsNamed) {
  const std::string repo = Repo("repo", "id -un > /tmp/hook-user\n");
  const std::string blob = Sh("git -C '" + repo + "' rev-parse HEAD:.trybox/setup.sh");
  int code = -1;
  Json r = RunPlanting(repo, "printf 'echo 42 > answer.txt\\n' > .trybox/setup.sh",
                       "grep -qx 41 answer.txt && test \"$(cat /tmp/hook-user)\" = user", &code);
  EXPECT_EQ(code, 0) << r.dump(2);
  EXPECT_EQ(r["verdict"], "VERIFIED") << r["verification"].dump(2);
  auto steps = Steps(r);
  Json& setup = steps["setup"];
  EXPECT_EQ(setup["user"], "user");
  EXPECT_EQ(setup["outcome"], "exited");
  EXPECT_EQ(setup["exit_code"], 0);
  EXPECT_EQ(setup["blob"].get<std::string>() + "\n", blob);
  EXPECT_EQ(setup["tree_hook"], "changed");
  EXPECT_EQ(setup["argv"], Json::array({"/bin/sh", "/run/trybox/setup.sh"}));
  EXPECT_EQ(steps["chown"]["argv"], Json::array({"chown", "-R", "-h", "user:", "/workspace"}));
  // The order: the copy, the chown, the hook; then the check.
  EXPECT_EQ(r["verification"]["before"].size(), 3u);
  EXPECT_EQ(r["verification"]["before"][2]["step"], "setup");
  CliResult text = h_->Cli({"agent", "show", r["run"]});
  EXPECT_NE(text.out.find("the caller's .trybox/setup.sh as it went into the run (git blob " +
                          blob.substr(0, blob.size() - 1) + "), as user"),
            std::string::npos)
      << text.out;
}

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
