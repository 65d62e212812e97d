// The client side of paged replies (docs/protocol/daemon.md): `audit` pages back in time
// with before_id / next_before_id, `diff` pages its changes with offset / limit. The
// scripted daemons here answer as the paging daemon will, and as the old one does.
#include <gtest/gtest.h>

#include <sstream>

#include "cli/cli.h"
#include "cli/client.h"
#include "cli/testing.h"

namespace trybox::cli {
namespace {

using testing::Home;

Json Row(int64_t id) {
  return {{"id", id},
          {"vm", "vm1"},
          {"started_at", 1.7e9},
          {"ended_at", 1.7e9},
          {"method", "CONNECT"},
          {"host", "x.test"},
          {"port", 443},
          {"address", "192.0.2.1"},
          {"verdict", "allow"},
          {"reason", "listed"},
          {"override", false},
          {"status", 200},
          {"bytes_up", 1},
          {"bytes_down", 2},
          {"duration_ms", 3.5}};
}

// The paging daemon's audit: rows 1..n, at most `cap` per reply, newest first across pages.
testing::ScriptedDaemon::Script PagedAudit(int64_t n, int64_t cap) {
  return [n, cap](std::shared_ptr<channel::Stream> s, const Json& req) {
    int64_t limit = req.value("limit", int64_t{1000});
    int64_t before = req.contains("before_id") ? req["before_id"].get<int64_t>() : n + 1;
    int64_t newest = before - 1;
    int64_t count = std::min({limit, cap, newest});
    Json rows = Json::array();
    for (int64_t id = newest - count + 1; id <= newest; ++id) rows.push_back(Row(id));
    int64_t oldest = newest - count + 1;
    Json next = oldest > 1 ? Json(oldest) : Json(nullptr);
    (void)s->End({{"ok", true}, {"egress", rows}, {"next_before_id", next}});
  };
}

std::vector<int64_t> Ids(const Json& rows) {
  std::vector<int64_t> ids;
  for (const auto& r : rows) ids.push_back(r["id"].get<int64_t>());
  return ids;
}

struct Session {
  explicit Session(testing::ScriptedDaemon::Script script) {
    auto d = testing::ScriptedDaemon::Start(home.paths, std::move(script));
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    if (d.ok()) daemon = std::move(*d);
    auto c = Client::Connect(home.paths, false);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (c.ok()) client = std::move(*c);
  }
  int Run(std::vector<std::string> args) {
    args.insert(args.begin(), "trybox");
    auto inv = Parse(args);
    EXPECT_TRUE(inv.ok()) << inv.status().ToString();
    out.str("");
    err.str("");
    return inv.ok() ? RunWithClient(*client, *inv, out, err) : -1;
  }
  Home home;
  std::unique_ptr<testing::ScriptedDaemon> daemon;
  std::unique_ptr<Client> client;
  std::ostringstream out, err;
};

TEST(AuditPagingTest, FetchesEveryPageUpToTheLimitOldestFirst) {
  Session s(PagedAudit(2500, 1000));
  auto rows = FetchAudit(*s.client, "", 2200);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  std::vector<int64_t> want;
  for (int64_t id = 301; id <= 2500; ++id) want.push_back(id);
  EXPECT_EQ(Ids(*rows), want);
  auto reqs = s.daemon->requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0], Json({{"verb", "audit"}, {"limit", 2200}}));
  EXPECT_EQ(reqs[1], Json({{"verb", "audit"}, {"limit", 1200}, {"before_id", 1501}}));
  EXPECT_EQ(reqs[2], Json({{"verb", "audit"}, {"limit", 200}, {"before_id", 501}}));
}

TEST(AuditPagingTest, StopsWhenThereAreNoOlderRows) {
  Session s(PagedAudit(1500, 1000));
  auto rows = FetchAudit(*s.client, "vm1", 5000);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  EXPECT_EQ(rows->size(), 1500u);
  EXPECT_EQ(rows->front()["id"], 1);
  EXPECT_EQ(rows->back()["id"], 1500);
  EXPECT_EQ(s.daemon->requests().size(), 2u);
  EXPECT_EQ(s.daemon->requests()[1]["vm"], "vm1");
}

TEST(AuditPagingTest, CommandPrintsAllPagesAsJsonAndAsATable) {
  Session s(PagedAudit(2500, 1000));
  ASSERT_EQ(s.Run({"audit", "--json", "--limit", "2500"}), 0) << s.err.str();
  Json printed = Json::parse(s.out.str());
  ASSERT_EQ(printed.size(), 2500u);
  EXPECT_EQ(printed[0]["id"], 1);
  ASSERT_EQ(s.Run({"audit", "--limit", "1001"}), 0) << s.err.str();
  std::string table = s.out.str();
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 1002);  // the header and 1001 rows
}

TEST(AuditPagingTest, AnOldDaemonAnswersInOneReply) {
  Session s([](std::shared_ptr<channel::Stream> st, const Json&) {
    (void)st->End({{"ok", true}, {"egress", {Row(7), Row(8)}}});
  });
  auto rows = FetchAudit(*s.client, "", 1000);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  EXPECT_EQ(Ids(*rows), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(s.daemon->requests().size(), 1u);
}

TEST(AuditPagingTest, ACursorThatDoesNotMoveBackIsAnErrorNotALoop) {
  Session s([](std::shared_ptr<channel::Stream> st, const Json&) {
    (void)st->End({{"ok", true}, {"egress", {Row(5)}}, {"next_before_id", 9}});
  });
  auto rows = FetchAudit(*s.client, "", 1000);
  ASSERT_FALSE(rows.ok());
  EXPECT_NE(rows.status().message().find("'next_before_id'"), std::string::npos)
      << rows.status().message();
  EXPECT_EQ(s.daemon->requests().size(), 2u);
}

Json Change(int64_t i) {
  return {{"change", "added"}, {"path", "f" + std::to_string(i)}, {"new_size", i}};
}

// The paging daemon's diff: `n` changes, at most `cap` per reply, from `offset`.
testing::ScriptedDaemon::Script PagedDiff(int64_t n, int64_t cap, int64_t collect_id = 4) {
  return [=](std::shared_ptr<channel::Stream> s, const Json& req) {
    int64_t offset = req.value("offset", int64_t{0});
    int64_t limit = std::min(req.value("limit", cap), cap);
    Json changes = Json::array();
    for (int64_t i = offset; i < std::min(n, offset + limit); ++i) changes.push_back(Change(i));
    Json c = {
        {"id", collect_id == 99 && offset >= 4000 ? 100 : collect_id},
        {"vm", "vm1"},
        {"outcome", "ok"},
        {"error", ""},
        {"commit", "abc"},
        {"branch", "trybox/vm1"},
        {"note", ""},
        {"skipped", Json::array()},
        {"counts",
         {{"added", n}, {"modified", 0}, {"deleted", 0}, {"renamed", 0}, {"mode_changed", 0}}},
        {"changes", changes},
        {"changes_total", n},
        {"changes_truncated", offset + static_cast<int64_t>(changes.size()) < n}};
    (void)s->End({{"ok", true}, {"collect", c}});
  };
}

TEST(DiffPagingTest, JsonHasEveryChangeFetchedByOffset) {
  Session s(PagedDiff(4500, 2000));
  ASSERT_EQ(s.Run({"diff", "vm1", "--json"}), 0) << s.err.str();
  Json c = Json::parse(s.out.str());
  ASSERT_EQ(c["changes"].size(), 4500u);
  for (int64_t i = 0; i < 4500; ++i) ASSERT_EQ(c["changes"][i]["path"], "f" + std::to_string(i));
  EXPECT_EQ(c["changes_total"], 4500);
  EXPECT_EQ(c["changes_truncated"], false);
  auto reqs = s.daemon->requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0], Json({{"verb", "diff"}, {"vm", "vm1"}}));
  EXPECT_EQ(reqs[1], Json({{"verb", "diff"}, {"vm", "vm1"}, {"offset", 2000}, {"limit", 2000}}));
  EXPECT_EQ(reqs[2], Json({{"verb", "diff"}, {"vm", "vm1"}, {"offset", 4000}, {"limit", 500}}));
}

TEST(DiffPagingTest, HumanOutputListsEveryChange) {
  Session s(PagedDiff(2001, 2000));
  ASSERT_EQ(s.Run({"diff", "vm1"}), 0) << s.err.str();
  std::string text = s.out.str();
  EXPECT_NE(text.find("A  f2000 (2000 bytes)\n"), std::string::npos);
  EXPECT_NE(text.find("2001 files changed (2001 added"), std::string::npos) << text.substr(0, 200);
  EXPECT_EQ(text.find("not shown"), std::string::npos);
}

TEST(DiffPagingTest, ACollectBetweenTwoPagesIsAnError) {
  Session s(PagedDiff(4500, 2000, /*collect_id=*/99));  // the id changes at offset 4000
  EXPECT_EQ(s.Run({"diff", "vm1", "--json"}), 125);
  EXPECT_NE(s.err.str().find("changed while its changes were read"), std::string::npos)
      << s.err.str();
  EXPECT_EQ(s.out.str(), "");
}

TEST(DiffPagingTest, AnOldDaemonAnswersInOneReply) {
  Session s([](std::shared_ptr<channel::Stream> st, const Json&) {
    Json c = {
        {"vm", "vm1"},
        {"counts",
         {{"added", 1}, {"modified", 0}, {"deleted", 0}, {"renamed", 0}, {"mode_changed", 0}}},
        {"changes", {Change(0)}},
        {"commit", ""},
        {"note", "no commit"}};
    (void)st->End({{"ok", true}, {"collect", c}});
  });
  ASSERT_EQ(s.Run({"diff", "vm1", "--json"}), 0) << s.err.str();
  Json c = Json::parse(s.out.str());
  EXPECT_EQ(c["changes"].size(), 1u);
  EXPECT_FALSE(c.contains("changes_total"));
  EXPECT_EQ(s.daemon->requests().size(), 1u);
}

TEST(CollectPagingTest, HumanOutputSaysHowManyChangesWereNotShown) {
  Session s([](std::shared_ptr<channel::Stream> st, const Json&) {
    Json changes = Json::array();
    for (int i = 0; i < 2000; ++i) changes.push_back(Change(i));
    Json c = {
        {"vm", "vm1"},
        {"counts",
         {{"added", 30000}, {"modified", 0}, {"deleted", 0}, {"renamed", 0}, {"mode_changed", 0}}},
        {"changes", changes},
        {"changes_total", 30000},
        {"changes_truncated", true},
        {"commit", "abc"},
        {"branch", "trybox/vm1"},
        {"note", ""},
        {"dir", "/srv/p"}};
    (void)st->End({{"ok", true}, {"collect", c}});
  });
  ASSERT_EQ(s.Run({"collect", "vm1"}), 0) << s.err.str();
  EXPECT_NE(s.out.str().find("30000 files changed"), std::string::npos) << s.out.str();
  EXPECT_NE(s.out.str().find("28000 of these changes are not shown in this reply; trybox diff "
                             "vm1 lists them all"),
            std::string::npos)
      << s.out.str();
  EXPECT_NE(s.out.str().find("committed abc on branch trybox/vm1 in /srv/p"), std::string::npos);
}

}  // namespace
}  // namespace trybox::cli
