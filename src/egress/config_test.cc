#include "egress/config.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace trybox::egress
