#include "daemon/spare_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace trybox::daemon {
namespace {

using Pool = SparePool<int>;
using std::chrono::seconds;

constexpr int kMib = 256;
const Pool::Time t0 = Pool::Clock::now();  // the tests' clock starts here

SparePoolOptions Options(int min = 1, int64_t budget = 10 * kMib) {
  SparePoolOptions o;
  o.min_spares = min;
  o.memory_budget_mib = budget;
  o.demand_window = seconds(60);
  o.idle_release = seconds(30);
  return o;
}

bool Any(const int&) { return true; }

// A create at `at` that finds nothing ready and waits for nothing.
std::optional<int> Create(Pool& p, Pool::Time at, std::vector<int>* stale = nullptr) {
  std::vector<int> ignored;
  return p.Take("s", kMib, at, at, Any, stale ? stale : &ignored);
}

// Refills `n` spares numbered from `first`, ready at `at`.
void Fill(Pool& p, int n, Pool::Time at, int first = 100) {
  for (int i = 0; i < n; ++i) {
    p.RefillStarted("s");
    EXPECT_FALSE(p.RefillDone("s", first + i, at).has_value());
  }
}

TEST(SparePoolTest, FirstUseAsksForTheFloor) {
  Pool p(Options());
  EXPECT_EQ(p.Wanted("s", kMib, t0), 0);  // a shape nobody used has no spares
  EXPECT_FALSE(Create(p, t0).has_value());
  EXPECT_EQ(p.Wanted("s", kMib, t0), 1);
}

TEST(SparePoolTest, TargetGrowsWithCreatesInTheWindow) {
  Pool p(Options());
  for (int i = 0; i < 5; ++i) Create(p, t0 + seconds(i));
  EXPECT_EQ(p.Wanted("s", kMib, t0 + seconds(5)), 5);
  // Those being prepared and those ready count toward it.
  p.RefillStarted("s");
  Fill(p, 2, t0 + seconds(6));
  EXPECT_EQ(p.Wanted("s", kMib, t0 + seconds(6)), 2);
  // Once the creates leave the window, the floor is all that is wanted.
  EXPECT_EQ(p.Wanted("s", kMib, t0 + seconds(70)), 0);
}

TEST(SparePoolTest, TheMemoryBudgetCapsEveryShapeTogether) {
  Pool p(Options(1, 3 * kMib));
  for (int i = 0; i < 10; ++i) Create(p, t0);
  EXPECT_EQ(p.Wanted("s", kMib, t0), 3);
  Fill(p, 2, t0);
  p.RefillStarted("s");
  EXPECT_EQ(p.Wanted("s", kMib, t0), 0);
  // Another shape finds no room left.
  std::vector<int> stale;
  EXPECT_FALSE(p.Take("big", 2 * kMib, t0, t0, Any, &stale).has_value());
  EXPECT_EQ(p.Wanted("big", 2 * kMib, t0), 0);
}

TEST(SparePoolTest, IdleSparesBeyondTheTargetAreReleasedAndTheFloorStays) {
  Pool p(Options());
  for (int i = 0; i < 4; ++i) Create(p, t0);
  Fill(p, 4, t0 + seconds(1));
  // Demand is still in the window: nothing goes, however idle.
  EXPECT_TRUE(p.Release(t0 + seconds(50)).empty());
  auto next = p.NextRelease(t0 + seconds(50));
  ASSERT_TRUE(next.has_value());
  // The creates leave the window at 60 s; the spares have been idle 30 s by 31 s.
  EXPECT_EQ(*next, t0 + seconds(60));
  EXPECT_TRUE(p.Release(t0 + seconds(59)).empty());
  std::vector<int> released = p.Release(*next);
  EXPECT_EQ(released, (std::vector<int>{100, 101, 102}));  // oldest first; one stays
  EXPECT_FALSE(p.NextRelease(*next).has_value());
  EXPECT_EQ(p.ReadyCounts()["s"], 1u);
}

TEST(SparePoolTest, ASpareIsReleasedOnlyAfterItsIdleTime) {
  Pool p(Options());
  Create(p, t0);
  Create(p, t0);
  Fill(p, 1, t0);
  Fill(p, 1, t0 + seconds(100), 200);  // after the demand left: beyond the target of 1
  auto next = p.NextRelease(t0 + seconds(100));
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next, t0 + seconds(100));  // the older spare has been idle 100 s
  EXPECT_EQ(p.Release(*next), std::vector<int>{100});
  EXPECT_EQ(p.ReadyCounts()["s"], 1u);
}

TEST(SparePoolTest, TakeGivesTheNewestFittingSpareAndHandsBackStaleOnes) {
  Pool p(Options());
  Create(p, t0);
  Fill(p, 3, t0, 1);  // 1, 2, 3
  std::vector<int> stale;
  auto got = p.Take(
      "s", kMib, t0, t0, [](const int& v) { return v == 1; }, &stale);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, 1);
  EXPECT_EQ(stale, (std::vector<int>{3, 2}));
  EXPECT_EQ(p.ReadyCounts()["s"], 0u);
}

TEST(SparePoolTest, ACreateWaitsForTheRefillUnderWayInsteadOfRestoringItsOwn) {
  Pool p(Options());
  Create(p, t0);
  p.RefillStarted("s");
  std::optional<int> got;
  std::thread create([&] {
    std::vector<int> stale;
    got = p.Take("s", kMib, t0, Pool::Clock::now() + seconds(600), Any, &stale);
  });
  while (!p.Claimed("s")) std::this_thread::yield();  // the create is waiting
  EXPECT_FALSE(p.RefillDone("s", 42, t0).has_value());
  create.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, 42);
  EXPECT_EQ(p.ReadyCounts()["s"], 0u);
  // A second create finds neither a spare nor a refill: it does not wait.
  EXPECT_FALSE(Create(p, t0).has_value());
}

TEST(SparePoolTest, AFailedRefillWakesItsWaiterEmptyHanded) {
  Pool p(Options());
  Create(p, t0);
  p.RefillStarted("s");
  std::optional<int> got = 7;
  std::thread create([&] {
    std::vector<int> stale;
    got = p.Take("s", kMib, t0, Pool::Clock::now() + seconds(600), Any, &stale);
  });
  while (!p.Claimed("s")) std::this_thread::yield();
  EXPECT_FALSE(p.RefillDone("s", std::nullopt, t0).has_value());
  create.join();
  EXPECT_FALSE(got.has_value());
}

TEST(SparePoolTest, AWaiterThatGivesUpLeavesTheSpareReady) {
  Pool p(Options());
  Create(p, t0);
  p.RefillStarted("s");
  std::vector<int> stale;
  // The deadline has passed: the claim is dropped at once.
  EXPECT_FALSE(p.Take("s", kMib, t0, Pool::Clock::now() - seconds(1), Any, &stale).has_value());
  EXPECT_FALSE(p.Claimed("s"));
  EXPECT_FALSE(p.RefillDone("s", 5, t0).has_value());
  EXPECT_EQ(p.ReadyCounts()["s"], 1u);
}

TEST(SparePoolTest, NoSparesWhenTurnedOff) {
  Pool p(Options(0));
  for (int i = 0; i < 5; ++i) Create(p, t0);
  EXPECT_FALSE(p.enabled());
  EXPECT_EQ(p.Wanted("s", kMib, t0), 0);
}

TEST(SparePoolTest, StopGivesBackEverySpareAndWakesWaiters) {
  Pool p(Options());
  Create(p, t0);
  Fill(p, 2, t0);
  p.RefillStarted("s");
  std::vector<int> back = p.Stop();
  EXPECT_EQ(back.size(), 2u);
  EXPECT_EQ(p.Wanted("s", kMib, t0), 0);
  // A refill that ends after the stop is handed back for destruction.
  auto leftover = p.RefillDone("s", 9, t0);
  ASSERT_TRUE(leftover.has_value());
  EXPECT_EQ(*leftover, 9);
  EXPECT_FALSE(Create(p, t0).has_value());
}

TEST(SparePoolTest, DescribeShowsTargetReadyAndRefilling) {
  Pool p(Options());
  Create(p, t0);
  Create(p, t0);
  Fill(p, 1, t0);
  p.RefillStarted("s");
  auto d = p.Describe(t0);
  EXPECT_EQ(d["shapes"]["s"]["target"], 2);
  EXPECT_EQ(d["shapes"]["s"]["ready"], 1);
  EXPECT_EQ(d["shapes"]["s"]["refilling"], 1);
  EXPECT_EQ(d["shapes"]["s"]["recent_creates"], 2);
  EXPECT_EQ(d["used_mib"], 2 * kMib);
  EXPECT_EQ(d["budget_mib"], 10 * kMib);
}

// Refills run on several threads: a refill begins in one step with the pool, so however
// many threads ask at once, no more spares are begun than are wanted.
TEST(SparePoolTest, ConcurrentRefillsBeginNoMoreThanWanted) {
  Pool p(Options());
  for (int i = 0; i < 3; ++i) Create(p, t0 + seconds(i));
  ASSERT_EQ(p.Wanted("s", kMib, t0 + seconds(3)), 3);
  std::atomic<int> begun{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      while (p.BeginRefill("s", kMib, t0 + seconds(3))) ++begun;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(begun.load(), 3);
  EXPECT_EQ(p.Wanted("s", kMib, t0 + seconds(3)), 0);
  EXPECT_EQ(p.Describe(t0 + seconds(3))["shapes"]["s"]["refilling"], 3);
  // Each that ends makes room for none: the three cover the target.
  EXPECT_FALSE(p.RefillDone("s", 1, t0 + seconds(4)).has_value());
  EXPECT_FALSE(p.BeginRefill("s", kMib, t0 + seconds(4)));
}

// A spare that ends on the ready list passes through `to_ready` (the launcher lowers its
// priority there); one handed to a waiting create does not.
TEST(SparePoolTest, OnlyASpareThatGoesToTheReadyListPassesThroughToReady) {
  Pool p(Options());
  std::vector<int> readied;
  auto note = [&](int& s) { readied.push_back(s); };
  Create(p, t0);
  ASSERT_TRUE(p.BeginRefill("s", kMib, t0));
  std::thread waiter([&] {
    std::vector<int> stale;
    auto got = p.Take("s", kMib, t0, t0 + seconds(3600), Any, &stale);
    EXPECT_EQ(got, std::optional<int>(7));
  });
  while (!p.Claimed("s")) std::this_thread::yield();
  EXPECT_FALSE(p.RefillDone("s", 7, t0 + seconds(1), note).has_value());
  waiter.join();
  EXPECT_TRUE(readied.empty());
  ASSERT_TRUE(p.BeginRefill("s", kMib, t0 + seconds(2)));
  EXPECT_FALSE(p.RefillDone("s", 8, t0 + seconds(2), note).has_value());
  EXPECT_EQ(readied, std::vector<int>{8});
}

}  // namespace
}  // namespace trybox::daemon
