#include "cli/cli.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(inv->exec.timeout_s, 5);
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
  // An "exited" result without an exit code is not a success.
  EXPECT_EQ(ExitCodeFor({{"outcome", "exited"}}, &msg), 125);
  EXPECT_EQ(ExitCodeFor(nlohmann::json::object(), &msg), 125);
}

}  // namespace
}  // namespace trybox::cli
