#include "api/api_keys.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "util/fd.h"

namespace trybox::api {
namespace {

class KeyRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = TempDir::Make("/tmp", "keyring-test-");
    ASSERT_TRUE(d.ok());
    dir_.emplace(std::move(*d));
    auto s = store::Store::Open(dir_->path() + "/trybox.db");
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(*s);
  }
  std::optional<TempDir> dir_;
  std::unique_ptr<store::Store> store_;
};

TEST_F(KeyRingTest, AKeyWorksUntilRemovedAndOnlyItsHashIsKept) {
  KeyRing ring(*store_);
  ASSERT_TRUE(ring.Load().ok());
  auto k = ring.Create("ci");
  ASSERT_TRUE(k.ok()) << k.status().message();
  EXPECT_TRUE(LooksLikeApiKey(k->key)) << k->key;
  EXPECT_EQ(k->key.rfind("e2b_", 0), 0u);
  auto who = ring.Check(k->key);
  ASSERT_TRUE(who.has_value());
  EXPECT_EQ(who->name, "ci");
  EXPECT_EQ(who->id, k->record.id);

  // Another ring on the same store (a restarted daemon) knows it too.
  KeyRing again(*store_);
  ASSERT_TRUE(again.Load().ok());
  EXPECT_TRUE(again.Check(k->key).has_value());

  // A near miss, a malformed key and nothing are refused.
  std::string near = k->key;
  near.back() = near.back() == '0' ? '1' : '0';
  EXPECT_FALSE(ring.Check(near).has_value());
  EXPECT_FALSE(ring.Check("e2b_" + std::string(40, 'g')).has_value());
  EXPECT_FALSE(ring.Check("").has_value());
  EXPECT_FALSE(ring.Check(k->key + "0").has_value());

  EXPECT_EQ(ring.Create("ci").status().code(), Code::kAlreadyExists);
  EXPECT_EQ(ring.Create("bad name").status().code(), Code::kInvalidArgument);

  ASSERT_TRUE(store_->Checkpoint().ok());
  for (const char* suffix : {"", "-wal"}) {
    std::ifstream f(dir_->path() + "/trybox.db" + suffix, std::ios::binary);
    std::stringstream all;
    all << f.rdbuf();
    EXPECT_EQ(all.str().find(k->key), std::string::npos) << "the key is in trybox.db" << suffix;
    EXPECT_EQ(all.str().find(k->key.substr(4)), std::string::npos);
  }

  ASSERT_TRUE(ring.Remove("ci").ok());
  EXPECT_FALSE(ring.Check(k->key).has_value());
  EXPECT_EQ(ring.Remove("ci").code(), Code::kNotFound);
  auto list = ring.List();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
}

TEST(RateLimiterTest, ABurstThenRefusedWithARetryTime) {
  RateLimiter limiter(/*per_second=*/0.001, /*burst=*/3);
  int retry = 0;
  EXPECT_TRUE(limiter.Allow("a", &retry));
  EXPECT_TRUE(limiter.Allow("a", &retry));
  EXPECT_TRUE(limiter.Allow("a", &retry));
  EXPECT_FALSE(limiter.Allow("a", &retry));
  EXPECT_GE(retry, 1);
  // Each key has its own bucket.
  EXPECT_TRUE(limiter.Allow("b", &retry));
}

}  // namespace
}  // namespace trybox::api
