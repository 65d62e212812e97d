#include "daemon/background.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace trybox::daemon {
namespace {

// Counts tasks that have started and holds them until released.
class Gate {
 public:
  void Enter() {
    std::unique_lock<std::mutex> lock(mu_);
    ++inside_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  // True once `n` tasks are inside at the same time (false after a minute: a hang, not a
  // timing figure).
  bool WaitInside(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::minutes(1), [&] { return inside_ >= n; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  int inside() {
    std::lock_guard<std::mutex> lock(mu_);
    return inside_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int inside_ = 0;
  bool open_ = false;
};

// A refill asked for again while one runs starts beside it on a second worker: a burst of
// creates is refilled two at a time.
TEST(BackgroundQueueTest, TheSameTaskAskedForWhileItRunsRunsBesideItOnAnotherWorker) {
  Gate gate;
  BackgroundQueue q(2);
  q.Enqueue("refill", [&] { gate.Enter(); });
  ASSERT_TRUE(gate.WaitInside(1));
  q.Enqueue("refill", [&] { gate.Enter(); });
  EXPECT_TRUE(gate.WaitInside(2));
  gate.Open();
}

// Asked for twice before it starts, a task runs once.
TEST(BackgroundQueueTest, ATaskQueuedTwiceBeforeItStartsRunsOnce) {
  Gate busy;
  BackgroundQueue q(1);
  q.Enqueue("busy", [&] { busy.Enter(); });
  ASSERT_TRUE(busy.WaitInside(1));
  std::mutex mu;
  std::condition_variable cv;
  int runs = 0;
  bool last = false;
  auto count = [&] {
    std::lock_guard<std::mutex> lock(mu);
    ++runs;
  };
  q.Enqueue("refill", count);
  q.Enqueue("refill", count);
  q.Enqueue("last", [&] {
    std::lock_guard<std::mutex> lock(mu);
    last = true;
    cv.notify_all();
  });
  busy.Open();
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::minutes(1), [&] { return last; }));
  EXPECT_EQ(runs, 1);
}

// One worker runs one task at a time.
TEST(BackgroundQueueTest, OneWorkerRunsOneTaskAtATime) {
  Gate gate;
  BackgroundQueue q(1);
  q.Enqueue("a", [&] { gate.Enter(); });
  q.Enqueue("b", [&] { gate.Enter(); });
  ASSERT_TRUE(gate.WaitInside(1));
  EXPECT_EQ(gate.inside(), 1);
  gate.Open();
  EXPECT_TRUE(gate.WaitInside(2));
}

}  // namespace
}  // namespace trybox::daemon
