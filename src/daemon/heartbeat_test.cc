// The heartbeat's decision, as a pure function of what one look saw.
#include "daemon/heartbeat.h"

#include <gtest/gtest.h>

namespace trybox::daemon {
namespace {

using C = VmEntry::Condition;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{5000};

HeartbeatLook InFlight(milliseconds waited, std::string qemu = "") {
  HeartbeatLook l;
  l.ping_in_flight = true;
  l.waited = waited;
  l.qemu_state = std::move(qemu);
  return l;
}

HeartbeatLook Answered(bool answered) {
  HeartbeatLook l;
  l.last_ping_answered = answered;
  return l;
}

TEST(HeartbeatTest, APingWithinItsTimeoutChangesNothing) {
  EXPECT_EQ(NextCondition(C::kRunning, InFlight(milliseconds(4999)), kTimeout), std::nullopt);
  EXPECT_EQ(NextCondition(C::kRunning, Answered(true), kTimeout), std::nullopt);
}

TEST(HeartbeatTest, APingUnansweredPastItsTimeoutMakesTheVmUnresponsive) {
  EXPECT_EQ(NextCondition(C::kRunning, InFlight(kTimeout), kTimeout), C::kUnresponsive);
  EXPECT_EQ(NextCondition(C::kRunning, InFlight(kTimeout, "running"), kTimeout), C::kUnresponsive);
  // Said once: a VM already unresponsive stays so without a new verdict.
  EXPECT_EQ(NextCondition(C::kUnresponsive, InFlight(milliseconds(60000)), kTimeout), std::nullopt);
}

TEST(HeartbeatTest, QemuPausedOnADiskErrorIsPausedNotUnresponsive) {
  EXPECT_EQ(NextCondition(C::kRunning, InFlight(kTimeout, "io-error"), kTimeout), C::kPaused);
  EXPECT_EQ(NextCondition(C::kUnresponsive, InFlight(kTimeout, "io-error"), kTimeout), C::kPaused);
  EXPECT_EQ(NextCondition(C::kPaused, InFlight(kTimeout, "io-error"), kTimeout), std::nullopt);
}

TEST(HeartbeatTest, AGuestThatAnswersAgainIsRunningAgain) {
  EXPECT_EQ(NextCondition(C::kUnresponsive, Answered(true), kTimeout), C::kRunning);
  EXPECT_EQ(NextCondition(C::kPaused, Answered(true), kTimeout), C::kRunning);
  // A ping that ended without an answer (its channel died) proves nothing.
  EXPECT_EQ(NextCondition(C::kUnresponsive, Answered(false), kTimeout), std::nullopt);
}

}  // namespace
}  // namespace trybox::daemon
