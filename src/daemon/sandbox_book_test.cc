#include "daemon/sandbox_book.h"

#include <gtest/gtest.h>

namespace trybox::daemon {
namespace {

SandboxInfo Make(const std::string& id, const std::string& owner, int age_s,
                 std::map<std::string, std::string> metadata = {}) {
  SandboxInfo s;
  s.id = id;
  s.owner = owner;
  s.metadata = std::move(metadata);
  s.started = WallClock::now() - std::chrono::seconds(age_s);
  s.deadline = SteadyClock::now() + std::chrono::hours(1);
  return s;
}

TEST(SandboxBookTest, OnlyTheOwnerSeesASandbox) {
  SandboxBook book;
  book.Add(Make("a1", "key-a", 0));
  EXPECT_TRUE(book.Get("key-a", "a1").has_value());
  EXPECT_FALSE(book.Get("key-b", "a1").has_value());
  EXPECT_FALSE(book.SetEnd("key-b", "a1", SteadyClock::now(), false));
  EXPECT_TRUE(book.List("key-b", {}, "", 100).items.empty());
  EXPECT_TRUE(book.Find("a1").has_value());
}

TEST(SandboxBookTest, ListFiltersByMetadataAndPagesNewestFirst) {
  SandboxBook book;
  for (int i = 0; i < 5; ++i) {
    book.Add(Make("s" + std::to_string(i), "k", 10 - i, {{"app", i % 2 ? "odd" : "even"}}));
  }
  book.Add(Make("other", "k2", 0, {{"app", "even"}}));
  SandboxPage even = book.List("k", {{"app", "even"}}, "", 100);
  ASSERT_EQ(even.items.size(), 3u);
  EXPECT_EQ(even.items[0].id, "s4");
  EXPECT_EQ(even.items[2].id, "s0");
  EXPECT_EQ(even.total, 3);
  EXPECT_TRUE(even.next_token.empty());
  EXPECT_TRUE(book.List("k", {{"app", "even"}, {"x", "y"}}, "", 100).items.empty());

  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    SandboxPage p = book.List("k", {}, token, 2);
    for (const auto& s : p.items) seen.push_back(s.id);
    token = p.next_token;
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, (std::vector<std::string>{"s4", "s3", "s2", "s1", "s0"}));
}

TEST(SandboxBookTest, EndsAreSetExtendedAndTaken) {
  SandboxBook book;
  book.Add(Make("a", "k", 0));
  const auto soon = SteadyClock::now() + std::chrono::seconds(5);
  ASSERT_TRUE(book.SetEnd("k", "a", soon, /*extend_only=*/false));
  // Connect's rule: only ever later.
  ASSERT_TRUE(book.SetEnd("k", "a", SteadyClock::now(), /*extend_only=*/true));
  EXPECT_EQ(book.Get("k", "a")->deadline, soon);
  EXPECT_EQ(*book.NextEnd(), soon);
  EXPECT_TRUE(book.TakeExpired(soon - std::chrono::seconds(1)).empty());
  EXPECT_EQ(book.TakeExpired(soon), std::vector<std::string>{"a"});
  EXPECT_EQ(book.size(), 0u);
  EXPECT_FALSE(book.NextEnd().has_value());
}

// E2B's endAt is the deadline as a time of day by the wall clock as it reads when shown:
// after a step of the wall clock, the time left is unchanged (issue 51.7).
TEST(SandboxBookTest, EndAtFollowsTheWallClockButKeepsTheTimeLeft) {
  const auto steady = SteadyClock::now();
  const auto deadline = steady + std::chrono::seconds(600);
  const WallClock::time_point wall(std::chrono::seconds(1764660000));
  EXPECT_EQ(EndAt(deadline, wall, steady), wall + std::chrono::seconds(600));
  // Two hours later by a stepped wall clock, one minute later by the monotonic one.
  EXPECT_EQ(EndAt(deadline, wall + std::chrono::hours(2), steady + std::chrono::seconds(60)),
            wall + std::chrono::hours(2) + std::chrono::seconds(540));
}

TEST(SandboxBookTest, MetadataQueryAndTimes) {
  auto m = ParseMetadataQuery("user=abc&app=my%20app&plus=a+b");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->at("user"), "abc");
  EXPECT_EQ(m->at("app"), "my app");
  EXPECT_EQ(m->at("plus"), "a b");
  // As E2B's JavaScript SDK sends {"app": "my app", "pct": "100%"} once the server has
  // decoded the query string: encodeURIComponent, then URLSearchParams.
  auto twice = ParseMetadataQuery("app=my%2520app&pct=100%2525");
  ASSERT_TRUE(twice.has_value());
  EXPECT_EQ(twice->at("app"), "my app");
  EXPECT_EQ(twice->at("pct"), "100%");
  EXPECT_EQ(ParseMetadataQuery("pct=100%25")->at("pct"), "100%");
  EXPECT_TRUE(ParseMetadataQuery("")->empty());
  EXPECT_FALSE(ParseMetadataQuery("novalue").has_value());
  EXPECT_FALSE(ParseMetadataQuery("=x").has_value());
  EXPECT_FALSE(ParseMetadataQuery("a=%zz").has_value());
  EXPECT_FALSE(ParseMetadataQuery("a=%2").has_value());
  EXPECT_EQ(Rfc3339(WallClock::time_point(std::chrono::milliseconds(1764660665123))),
            "2025-12-02T07:31:05.123Z");
}

}  // namespace
}  // namespace trybox::daemon
