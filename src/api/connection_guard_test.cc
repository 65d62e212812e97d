// ConnectionGuard's rules on their own: which connection is cut, and when. The "sockets" are
// numbers here; cutting real sockets is HttpServer's test (http_server_test.cc).
#include "api/connection_guard.h"

#include <gtest/gtest.h>

#include <set>

namespace trybox::api {
namespace {

class ConnectionGuardTest : public ::testing::Test {
 protected:
  std::unique_ptr<ConnectionGuard> Make(
      size_t total, size_t unproven, size_t per_peer,
      std::chrono::milliseconds head_timeout = std::chrono::hours(1)) {
    ConnectionGuard::Limits l;
    l.max_total = total;
    l.max_unproven = unproven;
    l.max_unproven_per_peer = per_peer;
    l.head_timeout = head_timeout;
    return std::make_unique<ConnectionGuard>(l, [this](int fd) {
      MutexLock lock(mu_);
      cut_.insert(fd);
      changed_.SignalAll();
    });
  }
  std::set<int> Cut() {
    MutexLock lock(mu_);
    return cut_;
  }

  Mutex mu_;
  CondVar changed_;
  std::set<int> cut_ GUARDED_BY(mu_);
};

TEST_F(ConnectionGuardTest, PastTheUnprovenCapTheOldestUnprovenIsCut) {
  auto g = Make(100, 3, 100);
  for (int fd = 1; fd <= 5; ++fd) (void)g->Opened(fd, "uid 1");
  EXPECT_EQ(Cut(), (std::set<int>{1, 2}));
  EXPECT_EQ(g->unproven(), 3u);
}

TEST_F(ConnectionGuardTest, AConnectionServingAProvenRequestIsNeverCut) {
  auto g = Make(100, 2, 100);
  const auto first = g->Opened(1, "uid 1");
  g->Proven(first);
  for (int fd = 2; fd <= 6; ++fd) (void)g->Opened(fd, "uid 1");
  EXPECT_EQ(Cut().count(1), 0u);
  EXPECT_EQ(Cut(), (std::set<int>{2, 3, 4}));
  // Its request over, it waits for a head like any other, and is the newest of them.
  g->Unproven(first);
  (void)g->Opened(7, "uid 1");
  EXPECT_EQ(Cut(), (std::set<int>{2, 3, 4, 5, 6}));
  (void)g->Opened(8, "uid 1");
  EXPECT_EQ(Cut().count(1), 1u);
}

TEST_F(ConnectionGuardTest, APeerPastItsShareLosesItsOwnOldestAndNoOneElses) {
  auto g = Make(100, 10, 3);
  (void)g->Opened(100, "uid 1000");
  (void)g->Opened(101, "uid 1000");
  for (int fd = 1; fd <= 6; ++fd) (void)g->Opened(fd, "uid 0");
  EXPECT_EQ(Cut(), (std::set<int>{1, 2, 3}));
  EXPECT_EQ(g->unproven(), 5u);
}

TEST_F(ConnectionGuardTest, PastTheCapAnUnprovenConnectionGoesAndTheNewOneOnlyIfAlone) {
  auto g = Make(4, 4, 4);
  for (int fd = 1; fd <= 3; ++fd) g->Proven(g->Opened(fd, "uid 1"));
  (void)g->Opened(4, "uid 1");
  EXPECT_TRUE(Cut().empty());
  // A fifth: the oldest unproven one goes, not the newcomer.
  g->Proven(g->Opened(5, "uid 1"));
  EXPECT_EQ(Cut(), (std::set<int>{4}));
  // A sixth, every other one proven: the newcomer itself is refused.
  (void)g->Opened(6, "uid 1");
  EXPECT_EQ(Cut(), (std::set<int>{4, 6}));
  EXPECT_EQ(g->open(), 4u);
  // Cut connections do not count: one closing makes room.
  g->Closed(1);
  (void)g->Opened(7, "uid 1");
  EXPECT_EQ(Cut(), (std::set<int>{4, 6}));
}

TEST_F(ConnectionGuardTest, AnUnprovenConnectionPastItsDeadlineIsCut) {
  auto g = Make(100, 100, 100, std::chrono::milliseconds(20));
  const auto kept = g->Opened(1, "uid 1");
  g->Proven(kept);
  (void)g->Opened(2, "uid 1");
  MutexLock lock(mu_);
  while (cut_.count(2) == 0) changed_.Wait(mu_);
  EXPECT_EQ(cut_.count(1), 0u);
}

TEST_F(ConnectionGuardTest, AClosedConnectionIsNeverCut) {
  auto g = Make(100, 1, 100);
  const auto a = g->Opened(1, "uid 1");
  g->Closed(a);
  (void)g->Opened(2, "uid 1");
  EXPECT_TRUE(Cut().empty());
}

}  // namespace
}  // namespace trybox::api
