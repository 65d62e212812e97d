// RateLimitedAudit with an injected clock (no sleeps, no timing), then in front of the real
// proxy over real sockets.
#include "egress/audit_limit.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <mutex>

namespace trybox::egress {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// What reached the daemon's side: every Decided and Closed, with the ids it handed out.
class Recorder : public AuditSink {
 public:
  int64_t Decided(const Decision& d) override {
    std::lock_guard<std::mutex> lock(mu);
    decided.push_back(d);
    return static_cast<int64_t>(decided.size());
  }
  void Closed(int64_t id, const Decision& d) override {
    std::lock_guard<std::mutex> lock(mu);
    closed.emplace_back(id, d);
  }
  std::mutex mu;
  std::vector<Decision> decided;
  std::vector<std::pair<int64_t, Decision>> closed;
};

Decision Refused(const std::string& vm, const std::string& host, int port = 443,
                 const std::string& verdict = "refused") {
  Decision d;
  d.vm_id = vm;
  d.method = "CONNECT";
  d.host = host;
  d.port = port;
  d.verdict = verdict;
  d.reason = host + " is not on the VM's allow-list";
  d.started_at = 1000;
  return d;
}

class RateLimitedAuditTest : public ::testing::Test {
 protected:
  RateLimitedAuditTest() {
    auto rec = std::make_unique<Recorder>();
    rec_ = rec.get();
    RateLimitedAudit::Options o;
    o.per_window = 3;
    o.window = 60s;
    o.max_hosts_named = 2;
    audit_ = std::make_unique<RateLimitedAudit>(std::move(rec), o, [this] { return now_; });
  }
  // Decided then Closed, as the proxy does for a refusal.
  int64_t Refuse(const Decision& d) {
    int64_t id = audit_->Decided(d);
    audit_->Closed(id, d);
    return id;
  }
  Clock::time_point now_{};
  Recorder* rec_;
  std::unique_ptr<RateLimitedAudit> audit_;
};

TEST_F(RateLimitedAuditTest, FirstRefusalsAreRecordedTheRestSummarisedOncePerWindow) {
  for (int i = 0; i < 3; ++i) EXPECT_GT(Refuse(Refused("vm1", "evil.test")), 0);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(Refuse(Refused("vm1", i % 3 == 0 ? "other.test" : "evil.test")),
              RateLimitedAudit::kNotRecorded);
  }
  Refuse(Refused("vm1", "third.test", 80));
  Refuse(Refused("vm1", "fourth.test", 80));
  ASSERT_EQ(rec_->decided.size(), 3u);
  ASSERT_EQ(rec_->closed.size(), 3u);  // suppressed ones never reach Closed either
  now_ += 59s;
  audit_->FlushExpired();  // the window is not over yet
  EXPECT_EQ(rec_->decided.size(), 3u);
  now_ += 1s;
  audit_->FlushExpired();
  ASSERT_EQ(rec_->decided.size(), 4u);
  const Decision& s = rec_->decided[3];
  EXPECT_EQ(s.vm_id, "vm1");
  EXPECT_EQ(s.verdict, "refused");
  EXPECT_EQ(s.reason,
            "1002 more refused connections from this VM in the same 60 s window were not "
            "recorded one by one: evil.test:443 666, other.test:443 334, other hosts 2");
  ASSERT_EQ(rec_->closed.size(), 4u);
  EXPECT_EQ(rec_->closed[3].first, 4);  // closed with the id the inner sink gave it
  // A new window: the first refusals are recorded again.
  EXPECT_GT(Refuse(Refused("vm1", "evil.test")), 0);
}

TEST_F(RateLimitedAuditTest, TheNextRefusalAfterTheWindowWritesItsSummaryFirst) {
  for (int i = 0; i < 5; ++i) Refuse(Refused("vm1", "evil.test"));
  now_ += 61s;
  Refuse(Refused("vm1", "later.test"));
  ASSERT_EQ(rec_->decided.size(), 5u);
  EXPECT_NE(rec_->decided[3].reason.find("2 more refused"), std::string::npos);
  EXPECT_EQ(rec_->decided[4].host, "later.test");
}

TEST_F(RateLimitedAuditTest, AllowedConnectionsAlwaysPassAndSpendNothing) {
  for (int i = 0; i < 10; ++i) Refuse(Refused("vm1", "evil.test"));
  Decision ok = Refused("vm1", "good.test");
  ok.verdict = "allowed";
  for (int i = 0; i < 50; ++i) EXPECT_GT(Refuse(ok), 0);
  EXPECT_EQ(rec_->decided.size(), 3u + 50u);
}

TEST_F(RateLimitedAuditTest, EachVmAndEachVerdictIsCountedApart) {
  for (int i = 0; i < 5; ++i) Refuse(Refused("vm1", "evil.test"));
  for (int i = 0; i < 5; ++i) Refuse(Refused("vm2", "evil.test"));
  for (int i = 0; i < 4; ++i) Refuse(Refused("vm2", "down.test", 443, "failed"));
  EXPECT_EQ(rec_->decided.size(), 6u);
  audit_->FlushVm("vm2");
  ASSERT_EQ(rec_->decided.size(), 8u);
  EXPECT_EQ(rec_->decided[6].verdict, "failed");
  EXPECT_NE(rec_->decided[6].reason.find("4 more failed connections"), std::string::npos);
  EXPECT_NE(rec_->decided[7].reason.find("2 more refused connections"), std::string::npos);
  EXPECT_EQ(rec_->decided[7].vm_id, "vm2");
  audit_->FlushVm("vm2");  // forgotten: nothing twice
  EXPECT_EQ(rec_->decided.size(), 8u);
  audit_->Flush();
  ASSERT_EQ(rec_->decided.size(), 9u);
  EXPECT_EQ(rec_->decided[8].vm_id, "vm1");
}

// The real proxy in front: every connection is still refused, on the wire, while the
// record holds the first few and one summary.
TEST_F(RateLimitedAuditTest, TheProxyStillRefusesEveryConnection) {
  Policy policy;
  policy.reach.allow = *AllowList::Parse({"good.test:443"});
  auto resolver = MapResolver::FromJson(nlohmann::json::object()).value();
  TunnelSlots slots(4);
  for (int i = 0; i < 40; ++i) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    UniqueFd a(sv[0]), b(sv[1]);
    ASSERT_TRUE(WriteFull(a.get(), "CONNECT evil.test:443 HTTP/1.1\r\n\r\n").ok());
    FdClient client(b.get());
    Decision d = ServeConnection(client, {&policy, resolver.get(), &slots, audit_.get(), "vm1"});
    EXPECT_EQ(d.verdict, "refused");
    char buf[12];
    ASSERT_TRUE(ReadFull(a.get(), buf, sizeof buf).ok());
    EXPECT_EQ(std::string(buf, sizeof buf), "HTTP/1.1 403");
  }
  audit_->Flush();
  ASSERT_EQ(rec_->decided.size(), 4u);
  EXPECT_EQ(rec_->decided[3].reason,
            "37 more refused connections from this VM in the same 60 s window were not recorded "
            "one by one: evil.test:443 37");
}

}  // namespace
}  // namespace trybox::egress
