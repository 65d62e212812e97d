#include "cli/secret_flags.h"

#include <gtest/gtest.h>

#include "util/fd.h"

namespace trybox::cli {
namespace {

using Json = nlohmann::json;

TEST(SecretFlagsTest, AFlagNamesTheVariableTheSourceAndTheHosts) {
  auto f = ParseSecretFlag("GH_TOKEN=env:MY_GH@api.github.com,*.github.test");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->name, "GH_TOKEN");
  EXPECT_EQ(f->source, "env:MY_GH");
  EXPECT_EQ(f->hosts, (std::vector<std::string>{"api.github.com", "*.github.test"}));
  // A file path may hold '@': the hosts follow the last one.
  auto at = ParseSecretFlag("K=file:/tmp/a@b/token@x.test");
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(at->source, "file:/tmp/a@b/token");
  EXPECT_FALSE(at->target);
  // +target: the value goes into request targets too.
  auto target = ParseSecretFlag("K=env:V@a.test,b.test+target");
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  EXPECT_TRUE(target->target);
  EXPECT_EQ(target->hosts, (std::vector<std::string>{"a.test", "b.test"}));
  auto named = ParseSecretFlag("NAMED_ONE");
  ASSERT_TRUE(named.ok());
  EXPECT_TRUE(named->source.empty());
  for (const char* bad :
       {"GH_TOKEN=env:X", "=env:X@a.test", "1X=env:X@a.test", "X=plain@a.test", "X=env:@a.test",
        "X=file:@a.test", "X=env:V@", "X=env:V@a.test:443", "X=env:V@127.0.0.1", "X=env:V@a.test,",
        "A-B", "X=env:V@+target", "X=env:V@a.test+body", "X=env:V@a.test+target+target"}) {
    EXPECT_FALSE(ParseSecretFlag(bad).ok()) << bad;
  }
}

class ResolveSecretsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    paths_.config = tmp_.path();
    ::setenv("TRYBOX_TEST_SECRET_VALUE", "value-from-env-123", 1);
    ASSERT_TRUE(WriteFileAtomic(tmp_.path() + "/token", "value-from-file-456\n").ok());
  }
  void TearDown() override { ::unsetenv("TRYBOX_TEST_SECRET_VALUE"); }
  TempDir tmp_ = TempDir::Make("/tmp", "tbx-secret-").value();
  Paths paths_;
};

TEST_F(ResolveSecretsTest, ValuesComeFromTheEnvironmentOrAFile) {
  auto j = ResolveSecrets(paths_, {"A=env:TRYBOX_TEST_SECRET_VALUE@a.test",
                                   "B=file:" + tmp_.path() + "/token@b.test,*.c.test"});
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  ASSERT_EQ(j->size(), 2u);
  EXPECT_EQ((*j)[0]["name"], "A");
  EXPECT_EQ((*j)[0]["value"], "value-from-env-123");
  EXPECT_EQ((*j)[1]["value"], "value-from-file-456");  // the trailing newline dropped
  EXPECT_EQ((*j)[1]["hosts"], (Json{"b.test", "*.c.test"}));
  EXPECT_EQ((*j)[0]["target"], false);
  auto t = ResolveSecrets(paths_, {"A=env:TRYBOX_TEST_SECRET_VALUE@a.test+target"});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)[0]["target"], true);
  EXPECT_EQ((*t)[0]["hosts"], (Json{"a.test"}));
}

TEST_F(ResolveSecretsTest, AMissingSourceIsNamedAndNoValueIsQuoted) {
  auto unset = ResolveSecrets(paths_, {"A=env:TRYBOX_TEST_SECRET_UNSET@a.test"});
  ASSERT_FALSE(unset.ok());
  EXPECT_EQ(unset.status().code(), Code::kNotFound);
  EXPECT_NE(unset.status().message().find("TRYBOX_TEST_SECRET_UNSET is not set"),
            std::string::npos);
  auto missing = ResolveSecrets(paths_, {"A=file:" + tmp_.path() + "/none@a.test"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("secret A"), std::string::npos);
}

TEST_F(ResolveSecretsTest, ANamedSecretComesFromSecretsJsonWithItsHostsAndOptions) {
  Json config = {{"GH",
                  {{"source", "env:TRYBOX_TEST_SECRET_VALUE"},
                   {"hosts", {"api.github.test"}},
                   {"body", true},
                   {"target", true}}},
                 {"NPM",
                  {{"source", "file:" + tmp_.path() + "/token"},
                   {"hosts", {"*.npm.test"}},
                   {"keep_cookies", true}}}};
  ASSERT_TRUE(WriteFileAtomic(tmp_.path() + "/secrets.json", config.dump()).ok());
  auto j = ResolveSecrets(paths_, {"GH", "NPM"});
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)[0]["value"], "value-from-env-123");
  EXPECT_EQ((*j)[0]["hosts"], (Json{"api.github.test"}));
  EXPECT_EQ((*j)[0]["body"], true);
  EXPECT_EQ((*j)[1]["value"], "value-from-file-456");
  EXPECT_EQ((*j)[1]["keep_cookies"], true);
  EXPECT_EQ((*j)[0]["target"], true);
  EXPECT_EQ((*j)[1]["target"], false);
  auto unknown = ResolveSecrets(paths_, {"NOPE"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), Code::kNotFound);
  EXPECT_NE(unknown.status().message().find("no secret named NOPE"), std::string::npos);
}

TEST_F(ResolveSecretsTest, AMistakeInSecretsJsonIsRefusedNamingTheEntry) {
  auto refused = [&](const Json& config, const std::string& words) {
    ASSERT_TRUE(WriteFileAtomic(tmp_.path() + "/secrets.json", config.dump()).ok());
    auto j = ResolveSecrets(paths_, {"GH"});
    ASSERT_FALSE(j.ok()) << words;
    EXPECT_NE(j.status().message().find(words), std::string::npos) << j.status().message();
  };
  refused({{"GH", {{"source", "plain"}, {"hosts", {"a.test"}}}}}, "env:VAR or file:PATH");
  refused({{"GH", {{"source", "env:X"}, {"hosts", Json::array()}}}}, "GH.hosts");
  refused({{"GH", {{"source", "env:X"}, {"hosts", {"a.test:443"}}}}}, "has a port");
  refused({{"GH", {{"source", "env:X"}, {"hosts", {"a.test"}}, {"value", "v"}}}},
          "unknown key 'value'");
  refused({{"GH", {{"source", "env:X"}, {"hosts", {"a.test"}}, {"body", "yes"}}}},
          "GH.body must be true or false");
  refused({{"GH", {{"source", "env:X"}, {"hosts", {"a.test"}}, {"target", 1}}}},
          "GH.target must be true or false");
  refused({{"1GH", {{"source", "env:X"}, {"hosts", {"a.test"}}}}}, "not a valid");
}

}  // namespace
}  // namespace trybox::cli
