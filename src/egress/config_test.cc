#include "egress/config.h"

#include <gtest/gtest.h>

#include "util/fd.h"

namespace trybox::egress {
namespace {

using Json = nlohmann::json;

TEST(EgressConfigChangesTest, NamesEachChangedKeyAndProfile) {
  Json before = {{"profiles", {{"a", {"a.example"}}, {"b", {"b.example"}}}},
                 {"max_tunnels_per_vm", 8}};
  Json after = {{"profiles", {{"a", {"a.example", "c.example"}}, {"d", {"d.example"}}}},
                {"max_tunnels_per_vm", 8},
                {"qemu_netns", false}};
  EXPECT_EQ(ConfigChanges(before, after),
            (std::vector<std::string>{"profiles.a", "profiles.b", "profiles.d", "qemu_netns"}));
}

TEST(EgressConfigChangesTest, TheSameObjectOrAMissingFileChangesNothing) {
  Json j = {{"profiles", {{"a", {"a.example"}}}}};
  EXPECT_TRUE(ConfigChanges(j, j).empty());
  EXPECT_TRUE(ConfigChanges(Json::object(), Json::object()).empty());
  EXPECT_EQ(ConfigChanges(Json::object(), j), (std::vector<std::string>{"profiles.a"}));
}

TEST(EgressConfigChangesTest, OnlyQemuIsolationNeedsARestart) {
  EXPECT_TRUE(NeedsRestart("qemu_netns"));
  EXPECT_TRUE(NeedsRestart("qemu_drop_uid"));
  EXPECT_TRUE(NeedsRestart("qemu_uid_base"));
  EXPECT_FALSE(NeedsRestart("profiles.a"));
  EXPECT_FALSE(NeedsRestart("resolve"));
}

TEST(EgressRequestRulesTest, TheFirstMatchingRuleDecidesAndNoneMeansAsk) {
  auto c = ParseConfig(
      {{"network_requests",
        {"deny *.evil.test", "allow *.pythonhosted.org", "allow pypi.org:443", "ask *"}}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->network_requests.size(), 4u);
  size_t i = 99;
  const RequestRule* r = MatchRequest(c->network_requests, "files.pythonhosted.org", 8443, &i);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->action, RequestRule::Action::kAllow);  // no port in the rule: every port
  EXPECT_EQ(i, 1u);
  EXPECT_EQ(MatchRequest(c->network_requests, "a.evil.test", 443, &i)->action,
            RequestRule::Action::kDeny);
  EXPECT_EQ(MatchRequest(c->network_requests, "pypi.org", 80, &i)->text, "ask *");
  EXPECT_EQ(MatchRequest({}, "pypi.org", 443, &i), nullptr);
  for (const char* bad : {"permit x.test", "allow", "allow 10.0.0.1", "deny *.com"}) {
    auto b = ParseConfig({{"network_requests", {bad}}});
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message().find("network_requests[0]"), std::string::npos)
        << b.status().message();
  }
  EXPECT_FALSE(ParseConfig({{"network_requests", "allow *"}}).ok());
  EXPECT_FALSE(ParseConfig({{"network_requests", {{{"allow", "x.test"}}}}}).ok());
}

// Reload errors a person can act on (issue 51.17): where truncated JSON broke, and which key
// has the wrong type and what it must be, never a JSON library's exception text.
TEST(EgressConfigErrorsTest, TruncatedJsonGivesItsLineAndColumn) {
  auto dir = TempDir::Make("/tmp", "egress-config-");
  ASSERT_TRUE(dir.ok());
  const std::string path = dir->path() + "/egress.json";
  ASSERT_TRUE(WriteFileAtomic(path, "{\n  \"profiles\": {\n    \"p\": [\"a.test\"").ok());
  auto j = LoadConfigJson(path);
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find(path + ": not valid JSON at line 3, column"),
            std::string::npos)
      << j.status().message();
  EXPECT_EQ(j.status().message().find("json.exception"), std::string::npos) << j.status().message();
}

TEST(EgressConfigErrorsTest, AWrongTypeNamesTheKeyAndTheTypeItMustBe) {
  struct Case {
    Json config;
    std::string want;
  };
  for (const auto& c : std::vector<Case>{
           {{{"max_tunnels_per_vm", "8"}}, "'max_tunnels_per_vm' must be an integer, not a string"},
           {{{"profiles", 3}}, "'profiles' must be an object, not an integer"},
           {{{"profiles", {{"p", "a.test"}}}},
            "'profiles.p' must be an array of strings (allow entries), not a string"},
           {{{"qemu_netns", 1}}, "'qemu_netns' must be true or false, not an integer"},
           {{{"internal_allow", {1, 2}}}, "'internal_allow' must be an array of strings"},
           {{{"upstream_ca_file", Json::array()}}, "'upstream_ca_file' must be a string"}}) {
    auto r = ParseConfig(c.config);
    ASSERT_FALSE(r.ok()) << c.config.dump();
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find("json.exception"), std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace trybox::egress
