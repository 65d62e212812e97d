#include "util/ascii.h"

#include <gtest/gtest.h>

namespace trybox {
namespace {

TEST(AsciiTest, LowersOnlyAsciiLetters) {
  EXPECT_EQ(AsciiLower("Content-Length: 12"), "content-length: 12");
  EXPECT_EQ(AsciiLower("@[`{"), "@[`{") << "the bytes beside A-Z and a-z stay";
  // UTF-8 passes through byte for byte ("Ä" is C3 84; a locale's tolower could touch 0xC3).
  EXPECT_EQ(AsciiLower("\xC3\x84X"), "\xC3\x84x");
  EXPECT_EQ(AsciiLower(std::string_view("A\0B", 3)), std::string("a\0b", 3));
}

TEST(AsciiTest, ComparesIgnoringCaseButNotLength) {
  EXPECT_TRUE(AsciiEqualsIgnoreCase("Host", "hOST"));
  EXPECT_TRUE(AsciiEqualsIgnoreCase("", ""));
  EXPECT_FALSE(AsciiEqualsIgnoreCase("host", "hosts"));
  EXPECT_FALSE(AsciiEqualsIgnoreCase("[", "{")) << "0x5B and 0x7B differ by the case bit only";
}

}  // namespace
}  // namespace trybox
