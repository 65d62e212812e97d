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

}  // namespace
}  // namespace trybox::egress
