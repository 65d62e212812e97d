#include "cli/cli.h"

#include <gtest/gtest.h>

#include "cli/testing.h"

namespace trybox::cli {
namespace {

Result<Invocation> P(std::vector<std::string> a) {
  a.insert(a.begin(), "trybox");
  return Parse(a);
}

TEST(CliParseTest, RunTakesOptionsThenCommandAfterDashes) {
  auto inv = P({"run", "--memory", "256", "--cpus", "2", "--env", "A=1", "-e", "B=x=y", "--workdir",
                "/tmp", "--timeout", "5", "--", "sh", "-c", "echo hi"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->command, "run");
  EXPECT_EQ(inv->vm.memory_mib, 256);
  EXPECT_EQ(inv->vm.cpus, 2);
  EXPECT_EQ(inv->exec.env, (std::vector<std::string>{"A=1", "B=x=y"}));
  EXPECT_EQ(inv->exec.workdir, "/tmp");
  EXPECT_EQ(inv->exec.timeout_ms, 5000);
  EXPECT_EQ(inv->argv, (std::vector<std::string>{"sh", "-c", "echo hi"}));
}

TEST(CliParseTest, RunAndCreateTakeAllowEntriesAndProfiles) {
  auto inv = P({"run", "--allow", "api.github.com", "--allow", "*.example.com:8443", "--profile",
                "models", "--", "curl", "https://api.github.com/"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->vm.allow, (std::vector<std::string>{"api.github.com", "*.example.com:8443"}));
  EXPECT_EQ(inv->vm.profiles, (std::vector<std::string>{"models"}));
  EXPECT_TRUE(P({"create", "--allow", "x.test:80"}).ok());
  auto bad = P({"run", "--allow", "127.0.0.1", "--", "true"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("IP literal"), std::string::npos);
  EXPECT_FALSE(P({"run", "--allow", "a.test@b.test", "--", "true"}).ok());
  EXPECT_FALSE(P({"run", "--profile", "../x", "--", "true"}).ok());
}

TEST(CliParseTest, InternetAndDenyOnRunCreateAndAgent) {
  auto inv =
      P({"run", "--internet", "--deny", "*.tracker.test", "--deny", "x.test:22", "--", "true"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_TRUE(inv->vm.internet);
  EXPECT_EQ(inv->vm.deny, (std::vector<std::string>{"*.tracker.test", "x.test:22"}));
  EXPECT_FALSE(P({"create"})->vm.internet);
  auto bad = P({"create", "--deny", "10.0.0.1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--deny"), std::string::npos);
  EXPECT_EQ(P({"agent", "--internet", "t"})->vm.agent_internet, std::optional<bool>(true));
  EXPECT_EQ(P({"agent", "--no-internet", "t"})->vm.agent_internet, std::optional<bool>(false));
  EXPECT_EQ(P({"agent", "t"})->vm.agent_internet, std::nullopt);  // agent.json decides
  EXPECT_FALSE(P({"agent", "--internet", "--no-internet", "t"}).ok());
}

TEST(CliParseTest, AllowAndDenyChangeARunningVm) {
  auto inv = P({"allow", "vm1", "a.test", "*.b.test:8080"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->command, "allow");
  EXPECT_EQ(inv->id, "vm1");
  EXPECT_EQ(inv->vm.allow, (std::vector<std::string>{"a.test", "*.b.test:8080"}));
  inv = P({"deny", "vm1", "a.test"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->command, "deny");
  EXPECT_EQ(inv->vm.deny, (std::vector<std::string>{"a.test"}));
  EXPECT_FALSE(P({"allow", "vm1"}).ok());               // a host is required
  EXPECT_FALSE(P({"allow", "vm1", "127.0.0.1"}).ok());  // checked as --allow is
  EXPECT_FALSE(P({"deny", "../x", "a.test"}).ok());     // and the id as an id
}

TEST(CliParseTest, RunAndCreateTakeSecretsAndCheckTheirSyntaxOnly) {
  auto inv = P({"run", "--secret", "GH_TOKEN=env:MY_GH@api.github.com,*.github.test", "--secret",
                "NPM=file:/nonexistent/yet@registry.npmjs.org", "--secret", "NAMED", "--", "true"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->vm.secrets.size(), 3u);
  EXPECT_FALSE(P({"create", "--secret", "X=plain@a.test"}).ok());
}

// A repeatable option right before "--" once swallowed the command's own "-c".
TEST(CliParseTest, RepeatableOptionBeforeDashesLeavesTheCommandAlone) {
  auto inv = P({"run", "-e", "A=1", "--allow", "x.test", "--", "sh", "-c", "echo $A"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->exec.env, (std::vector<std::string>{"A=1"}));
  EXPECT_EQ(inv->vm.allow, (std::vector<std::string>{"x.test"}));
  EXPECT_EQ(inv->argv, (std::vector<std::string>{"sh", "-c", "echo $A"}));
}

TEST(CliParseTest, AuditTakesVmJsonAndLimit) {
  auto inv = P({"audit", "--vm", "abc123", "--json", "--limit", "5"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->command, "audit");
  EXPECT_EQ(inv->id, "abc123");
  EXPECT_TRUE(inv->json);
  EXPECT_EQ(inv->limit, 5);
  EXPECT_FALSE(P({"audit", "--vm", "a/b"}).ok());
  EXPECT_FALSE(P({"audit", "--limit", "0"}).ok());
}

TEST(CliParseTest, ExecTakesIdAndCommand) {
  auto inv = P({"exec", "abc123", "--", "ls", "-la"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->id, "abc123");
  EXPECT_EQ(inv->argv, (std::vector<std::string>{"ls", "-la"}));
}

TEST(CliParseTest, InvalidNamesAreRejectedNotSanitised) {
  EXPECT_EQ(P({"run", "--image", "../etc", "--", "true"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(P({"exec", "a/b", "--", "true"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(P({"rm", "ok1", "bad id"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(P({"image", "build", "deb ian"}).status().code(), Code::kInvalidArgument);
}

TEST(CliParseTest, BadEnvIsRejected) {
  EXPECT_FALSE(P({"run", "--env", "NOVALUE", "--", "true"}).ok());
  EXPECT_FALSE(P({"run", "--env", "=x", "--", "true"}).ok());
  EXPECT_FALSE(P({"run", "--env", "1A=x", "--", "true"}).ok());
  EXPECT_TRUE(P({"run", "--env", "A_1=", "--", "true"}).ok());
}

TEST(CliParseTest, MissingCommandIsAnError) {
  EXPECT_FALSE(P({"run"}).ok());
  EXPECT_FALSE(P({}).ok());
  EXPECT_FALSE(P({"bogus"}).ok());
  EXPECT_FALSE(P({"run", "--memory", "lots", "--", "true"}).ok());
}

TEST(CliParseTest, LsAndImageCommands) {
  auto ls = P({"ls", "--json"});
  ASSERT_TRUE(ls.ok());
  EXPECT_EQ(ls->command, "ls");
  EXPECT_TRUE(ls->json);
  auto b = P({"image", "build"});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->command, "image-build");
  EXPECT_EQ(b->image_name, "debian-12");
  auto h = P({"run", "--help"});
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->command, "help");
  EXPECT_NE(h->help.find("--memory"), std::string::npos);
}

TEST(CliParseTest, NumericFlagsAreRangeCheckedSixtyFourBitValues) {
  auto run = P({"run", "--memory", "65536", "--cpus", "64", "--timeout", "2.5", "--", "true"});
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->vm.memory_mib, 65536);
  EXPECT_EQ(run->vm.cpus, 64);
  EXPECT_EQ(run->exec.timeout_ms, 2500);
  auto tiny = P({"exec", "vm1", "--timeout", "0.0001", "--", "true"});
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->exec.timeout_ms, 1);  // never 0, which means no timeout
  auto agent = P({"agent", "--timeout", "1.5", "--max-turns", "1000", "--max-tokens",
                  "1099511627776", "do it"});
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  EXPECT_EQ(agent->agent.wall_clock_s, 2);
  EXPECT_EQ(agent->agent.max_turns, 1000);
  EXPECT_EQ(agent->agent.max_tokens, int64_t{1} << 40);
  auto quota = P({"create", "--workspace-quota", "1T"});
  ASSERT_TRUE(quota.ok());
  EXPECT_EQ(quota->vm.quota_bytes, 1ull << 40);
  EXPECT_EQ(P({"audit", "--limit", "1000000"})->limit, 1000000);

  struct Bad {
    std::vector<std::string> args;
    std::string says;
  };
  std::vector<Bad> bad = {
      {{"create", "--memory", "4294967808"}, "--memory must be a whole number from 128 to 65536"},
      {{"create", "--memory", "512.5"}, "--memory"},
      {{"create", "--cpus", "4294967297"}, "--cpus must be a whole number from 1 to 64"},
      {{"create", "--cpus", "0"}, "--cpus"},
      {{"run", "--timeout", "4294967.297", "--", "true"}, "--timeout must be a number of seconds"},
      {{"run", "--timeout", "1e20", "--", "true"}, "at most 604800"},
      {{"exec", "vm1", "--timeout", "-1", "--", "true"}, "--timeout"},
      {{"exec", "vm1", "--timeout", "nan", "--", "true"}, "--timeout"},
      {{"exec", "vm1", "--timeout", "0", "--", "true"}, "greater than 0"},
      {{"agent", "--timeout", "86400.5", "x"}, "at most 86400"},
      {{"agent", "--max-turns", "4294967297", "x"},
       "--max-turns must be a whole number from 1 "
       "to 1000"},
      {{"agent", "resume", "r1", "--max-tokens", "999"},
       "--max-tokens must be a whole number "
       "from 1000 to 1099511627776"},
      {{"audit", "--limit", "1e3"}, "--limit must be a whole number from 1 to 1000000"},
      {{"audit", "--limit", "0"}, "--limit"},
      {{"create", "--workspace-quota", "-1"}, "--workspace-quota must be a size from 1 to"},
      {{"create", "--workspace-quota", "18014398509481984G"}, "--workspace-quota"},
  };
  for (const auto& b : bad) {
    auto r = P(b.args);
    ASSERT_FALSE(r.ok()) << ::testing::PrintToString(b.args);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << r.status().message();
  }
}

// Through the real binary, against a scripted daemon: a number out of range is refused
// before anything is sent. Before, the first two were sent as 512 MiB and 1 ms.
TEST(CliNumbersTest, OutOfRangeNumbersNeverReachTheDaemon) {
  testing::Home home;
  auto daemon = testing::ScriptedDaemon::Start(
      home.paths, [](std::shared_ptr<channel::Stream> s, const nlohmann::json&) {
        (void)s->End({{"ok", false}, {"error", {{"code", "INTERNAL"}, {"message", "sent"}}}});
      });
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
           {"create", "--memory", "4294967808"},
           {"exec", "vm1", "--timeout", "4294967.297", "--", "true"},
           {"run", "--timeout", "1e20", "--", "true"},
           {"audit", "--limit", "4294967297"}}) {
    auto r = testing::RunTryboxBinary(home, args);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->exit.code, 125) << ::testing::PrintToString(args) << r->err;
    EXPECT_NE(r->err.find(args[args[0] == "exec" ? 2 : 1]), std::string::npos) << r->err;
  }
  EXPECT_EQ((*daemon)->requests().size(), 0u) << (*daemon)->requests()[0].dump();
}

TEST(CliParseTest, VersionPrintsTheProjectVersion) {
  auto v = P({"--version"});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->command, "version");
  EXPECT_EQ(v->help.rfind("trybox ", 0), 0u) << v->help;
  EXPECT_EQ(v->help.back(), '\n');
}

TEST(CliParseTest, QuietAndDoctorProbe) {
  auto r = Parse({"trybox", "run", "--quiet", "--", "true"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->quiet);
  EXPECT_EQ(r->argv, std::vector<std::string>{"true"});
  r = Parse({"trybox", "create", "-q"});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->quiet);
  r = Parse({"trybox", "doctor", "--probe"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->command, "doctor");
  EXPECT_TRUE(r->probe);
  EXPECT_FALSE(Parse({"trybox", "doctor"})->probe);
}

TEST(ShowProgressTest, QuietWinsAndTheEnvironmentCanForceIt) {
  ::setenv("TRYBOX_PROGRESS", "always", 1);
  EXPECT_TRUE(ShowProgress(false));
  EXPECT_FALSE(ShowProgress(true));
  ::setenv("TRYBOX_PROGRESS", "never", 1);
  EXPECT_FALSE(ShowProgress(false));
  ::unsetenv("TRYBOX_PROGRESS");
}

TEST(ExitCodeTest, EveryOutcomeHasItsOwnCode) {
  std::string msg;
  EXPECT_EQ(ExitCodeFor({{"outcome", "exited"}, {"exit_code", 0}}, &msg), 0);
  EXPECT_EQ(ExitCodeFor({{"outcome", "exited"}, {"exit_code", 3}}, &msg), 3);
  EXPECT_EQ(ExitCodeFor({{"outcome", "signaled"}, {"signal", 9}}, &msg), 137);
  EXPECT_EQ(ExitCodeFor({{"outcome", "timed_out"}, {"timeout_ms", 1000}}, &msg), 124);
  EXPECT_EQ(ExitCodeFor({{"outcome", "error"}, {"error", "not_found"}}, &msg), 127);
  EXPECT_EQ(ExitCodeFor({{"outcome", "error"}, {"error", "not_executable"}}, &msg), 126);
  EXPECT_EQ(ExitCodeFor({{"outcome", "error"}, {"error", "spawn_failed"}}, &msg), 125);
  EXPECT_EQ(ExitCodeFor({{"outcome", "channel_lost"}, {"message", "x"}}, &msg), 125);
  EXPECT_NE(msg.find("lost the guest"), std::string::npos);
  EXPECT_EQ(ExitCodeFor({{"outcome", "guest_unresponsive"}, {"message", "x"}}, &msg), 125);
  EXPECT_NE(msg.find("the guest stopped answering"), std::string::npos) << msg;
  EXPECT_EQ(ExitCodeFor({{"outcome", "not_started"}, {"message", "x"}}, &msg), 125);
  EXPECT_NE(msg.find("never started"), std::string::npos) << msg;
  // An "exited" result without an exit code is not a success.
  EXPECT_EQ(ExitCodeFor({{"outcome", "exited"}}, &msg), 125);
  EXPECT_EQ(ExitCodeFor(nlohmann::json::object(), &msg), 125);
}

}  // namespace
}  // namespace trybox::cli
