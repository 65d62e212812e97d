#include "channel/frame.h"

#include <gtest/gtest.h>

namespace trybox::channel {
namespace {

TEST(FrameTest, RoundTripsEveryType) {
  FrameDecoder dec;
  std::string wire;
  std::vector<Frame> sent = {
      {1, FrameType::kOpen, 0, R"({"op":"ping"})"},
      {1, FrameType::kData, kChanOut, std::string("\0\1\2binary", 9)},
      {1, FrameType::kEof, kChanOut, ""},
      {3, FrameType::kEvent, 0, "{}"},
      {3, FrameType::kCredit, 0, std::string("\x00\x10\x00\x00", 4)},
      {3, FrameType::kEnd, 0, R"({"ok":true})"},
      {5, FrameType::kReset, 0, R"({"reason":"x"})"},
  };
  for (const auto& f : sent) wire += EncodeFrame(f);
  dec.Feed(wire);
  for (const auto& want : sent) {
    auto got = dec.Next();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->stream, want.stream);
    EXPECT_EQ(got->type, want.type);
    EXPECT_EQ(got->channel, want.channel);
    EXPECT_EQ(got->payload, want.payload);
  }
  EXPECT_EQ(dec.Next().status().code(), Code::kUnavailable);
  EXPECT_FALSE(dec.HasPartial());
}

TEST(FrameTest, DecodesByteAtATime) {
  std::string wire = EncodeFrame({7, FrameType::kData, kChanErr, "hello"});
  FrameDecoder dec;
  for (size_t i = 0; i + 1 < wire.size(); ++i) {
    dec.Feed(wire.substr(i, 1));
    EXPECT_EQ(dec.Next().status().code(), Code::kUnavailable);
  }
  dec.Feed(wire.substr(wire.size() - 1));
  auto f = dec.Next();
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->payload, "hello");
}

TEST(FrameTest, FrameCutInHalfIsDescribed) {
  std::string wire = EncodeFrame({1, FrameType::kData, kChanIn, std::string(100, 'x')});
  FrameDecoder dec;
  dec.Feed(wire.substr(0, 50));
  EXPECT_EQ(dec.Next().status().code(), Code::kUnavailable);
  EXPECT_TRUE(dec.HasPartial());
  EXPECT_EQ(dec.DescribePartial(), "got 50 of 112 frame bytes");
  FrameDecoder dec2;
  dec2.Feed(wire.substr(0, 5));
  EXPECT_EQ(dec2.DescribePartial(), "got 5 of 12 header bytes");
}

TEST(FrameTest, OversizedLengthIsRejected) {
  char hdr[kHeaderSize];
  EncodeHeader(1, FrameType::kData, 0, kMaxPayload + 1, hdr);
  FrameDecoder dec;
  dec.Feed(std::string_view(hdr, kHeaderSize));
  auto f = dec.Next();
  ASSERT_EQ(f.status().code(), Code::kInvalidArgument);
  EXPECT_NE(f.status().message().find("exceeds the limit"), std::string::npos);
  // The decoder stays failed: framing is lost for good.
  dec.Feed(EncodeFrame({1, FrameType::kEof, 0, ""}));
  EXPECT_EQ(dec.Next().status().code(), Code::kInvalidArgument);
}

TEST(FrameTest, MalformedHeadersAreRejected) {
  auto bad = [](std::string wire) {
    FrameDecoder dec;
    dec.Feed(wire);
    return dec.Next().status();
  };
  std::string unknown_type = EncodeFrame({1, FrameType::kData, 0, ""});
  unknown_type[8] = 9;
  EXPECT_EQ(bad(unknown_type).code(), Code::kInvalidArgument);
  std::string zero_type = EncodeFrame({1, FrameType::kData, 0, ""});
  zero_type[8] = 0;
  EXPECT_EQ(bad(zero_type).code(), Code::kInvalidArgument);
  std::string reserved = EncodeFrame({1, FrameType::kData, 0, ""});
  reserved[11] = 1;
  EXPECT_EQ(bad(reserved).code(), Code::kInvalidArgument);
  EXPECT_EQ(bad(EncodeFrame({1, FrameType::kData, 3, "x"})).code(), Code::kInvalidArgument);
  EXPECT_EQ(bad(EncodeFrame({1, FrameType::kEvent, 1, "{}"})).code(), Code::kInvalidArgument);
  EXPECT_EQ(bad(EncodeFrame({1, FrameType::kEof, 0, "x"})).code(), Code::kInvalidArgument);
  EXPECT_EQ(bad(EncodeFrame({1, FrameType::kCredit, 0, "abc"})).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace trybox::channel
