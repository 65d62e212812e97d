#include "api/connect.h"

#include <gtest/gtest.h>

#include <vector>

namespace trybox::api::connect {
namespace {

TEST(ConnectTest, EnvelopesRoundTripAndCutOnesAreRefused) {
  const std::string e = Envelope({{"a", 1}});
  ASSERT_EQ(e.size(), 5u + 7u);
  EXPECT_EQ(e[0], 0);
  EXPECT_EQ(e[4], 7);
  auto back = ParseStreamingRequest(e);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ((*back)["a"], 1);

  EXPECT_FALSE(ParseStreamingRequest("").ok());
  EXPECT_FALSE(ParseStreamingRequest(e.substr(0, 4)).ok());
  auto cut = ParseStreamingRequest(e.substr(0, e.size() - 1));
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("says 7 bytes and 6 came"), std::string::npos);
  EXPECT_FALSE(ParseStreamingRequest(e + e).ok());
  std::string compressed = e;
  compressed[0] = 1;
  EXPECT_NE(ParseStreamingRequest(compressed).status().message().find("compressed"),
            std::string::npos);
  EXPECT_FALSE(ParseStreamingRequest(Envelope(Json::array())).ok());
  std::string garbage = e;
  garbage[6] = '!';
  EXPECT_FALSE(ParseStreamingRequest(garbage).ok());
}

TEST(ConnectTest, EndOfStreamCarriesTheError) {
  const std::string ok = EndStream(Status::Ok());
  EXPECT_EQ(static_cast<uint8_t>(ok[0]), kEndStreamFlag);
  EXPECT_EQ(ok.substr(5), "{}");
  const std::string bad = EndStream(NotFound("process 7 not found"));
  Json j = Json::parse(bad.substr(5));
  EXPECT_EQ(j["error"]["code"], "not_found");
  EXPECT_EQ(j["error"]["message"], "process 7 not found");
  HttpResponse u = UnaryError(FailedPrecondition("no"));
  EXPECT_EQ(u.status, 400);
  EXPECT_EQ(Json::parse(u.body)["code"], "failed_precondition");
  EXPECT_EQ(UnaryHttpStatus(NotFound("")), 404);
  EXPECT_EQ(UnaryHttpStatus(Unavailable("")), 503);
}

TEST(ConnectTest, Base64BothWaysAndBothAlphabets) {
  for (const std::string& s :
       std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\xfe", 3)}) {
    auto back = FromBase64(Base64(s));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, s);
  }
  EXPECT_EQ(Base64("hi\n"), "aGkK");
  EXPECT_EQ(*FromBase64("aGkK"), "hi\n");
  EXPECT_EQ(*FromBase64("_-8"), std::string("\xff\xef", 2));
  EXPECT_FALSE(FromBase64("a!b=").ok());
}

TEST(ConnectTest, TimeoutHeader) {
  HttpRequest r;
  EXPECT_EQ(*TimeoutMs(r), 0);
  r.headers["connect-timeout-ms"] = "60000";
  EXPECT_EQ(*TimeoutMs(r), 60000);
  r.headers["connect-timeout-ms"] = "12345678901";
  EXPECT_FALSE(TimeoutMs(r).ok());
  r.headers["connect-timeout-ms"] = "-1";
  EXPECT_FALSE(TimeoutMs(r).ok());
}

}  // namespace
}  // namespace trybox::api::connect
