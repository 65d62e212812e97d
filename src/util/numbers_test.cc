#include "util/numbers.h"

#include <gtest/gtest.h>

namespace trybox {
namespace {

TEST(ParseBoundedIntTest, AcceptsDigitsInRange) {
  EXPECT_EQ(ParseBoundedInt("512", 128, 65536, "--memory").value(), 512);
  EXPECT_EQ(ParseBoundedInt("00128", 128, 65536, "--memory").value(), 128);
  EXPECT_EQ(ParseBoundedInt("-5", -10, 10, "--x").value(), -5);
  EXPECT_EQ(ParseBoundedInt("9223372036854775807", 0, INT64_MAX, "--x").value(), INT64_MAX);
  EXPECT_EQ(ParseBoundedInt("-9223372036854775808", INT64_MIN, 0, "--x").value(), INT64_MIN);
}

// 4294967808 is 2^32 + 512: read into 32 bits it was 512.
TEST(ParseBoundedIntTest, RefusesWhatWouldWrapOrIsNotAWholeNumber) {
  for (const char* bad :
       {"4294967808", "65537", "127", "0", "-1", "+512", " 512", "512 ", "512.0", "5e2", "0x200",
        "", "-", "99999999999999999999", "9223372036854775808", "512MiB"}) {
    auto r = ParseBoundedInt(bad, 128, 65536, "--memory", "MiB");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--memory must be a whole number from 128 to 65536 (MiB)"),
              std::string::npos)
        << r.status().message();
  }
}

TEST(ParseSecondsToMsTest, FractionsRoundUpToWholeMilliseconds) {
  const int64_t week = 604800000;
  EXPECT_EQ(ParseSecondsToMs("5", week, "--timeout").value(), 5000);
  EXPECT_EQ(ParseSecondsToMs("2.5", week, "--timeout").value(), 2500);
  EXPECT_EQ(ParseSecondsToMs("0.001", week, "--timeout").value(), 1);
  EXPECT_EQ(ParseSecondsToMs("0.0001", week, "--timeout").value(), 1);  // never 0 (= none)
  EXPECT_EQ(ParseSecondsToMs("1.0005", week, "--timeout").value(), 1001);
  EXPECT_EQ(ParseSecondsToMs("1.000000", week, "--timeout").value(), 1000);
  EXPECT_EQ(ParseSecondsToMs("604800", week, "--timeout").value(), week);
  EXPECT_EQ(ParseSecondsToMs("604800.000", week, "--timeout").value(), week);
}

// 4294967.297 s is 2^32 + 1 ms: read into 32 bits it killed after 1 ms; 1e20 meant none.
TEST(ParseSecondsToMsTest, RefusesWhatWouldWrapOrIsNotAFinitePositiveDecimal) {
  for (const char* bad :
       {"4294967.297", "1e20", "1e3", "inf", "nan", "-1", "0", "0.0", "0.0000", "", ".5", "5.",
        "+5", " 5", "5s", "604800.001", "604801", "99999999999999999999999"}) {
    auto r = ParseSecondsToMs(bad, 604800000, "--timeout");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--timeout must be a number of seconds greater than 0 "
                                        "and at most 604800"),
              std::string::npos)
        << r.status().message();
  }
}

TEST(ParseByteSizeTest, UnitsAreBinaryAndBoundsHold) {
  const uint64_t tib = 1ull << 40;
  EXPECT_EQ(ParseByteSize("1", 1, tib, "--q").value(), 1u);
  EXPECT_EQ(ParseByteSize("4k", 1, tib, "--q").value(), 4096u);
  EXPECT_EQ(ParseByteSize("1G", 1, tib, "--q").value(), 1ull << 30);
  EXPECT_EQ(ParseByteSize("512MiB", 1, tib, "--q").value(), 512ull << 20);
  EXPECT_EQ(ParseByteSize("1T", 1, tib, "--q").value(), tib);
  for (const char* bad : {"0", "-1", "2T", "1025G", "18014398509481984G", "1.5G", "1g", "G", "",
                          "1 G", "99999999999999999999999"}) {
    auto r = ParseByteSize(bad, 1, tib, "--workspace-quota");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--workspace-quota must be a size from 1 to"),
              std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace trybox
