#include "util/names.h"

#include <gtest/gtest.h>

namespace trybox {
namespace {

TEST(NamesTest, AcceptsTheAllowedAlphabet) {
  EXPECT_TRUE(ValidateName("image name", "debian-12").ok());
  EXPECT_TRUE(ValidateName("VM id", "A_b-9").ok());
  EXPECT_TRUE(ValidateName("VM id", std::string(64, 'a')).ok());
}

TEST(NamesTest, RejectsEverythingElseWithTheNameQuoted) {
  for (const std::string& bad :
       std::vector<std::string>{"", "a/b", "..", "a b", "a.b", "ä", std::string("a\0b", 3), "a\n",
                                std::string(65, 'a')}) {
    Status st = ValidateName("image name", bad);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("image name"), std::string::npos);
  }
  EXPECT_NE(ValidateName("VM id", "a\nb").message().find("\\x0a"), std::string::npos);
}

// A name on a child's command line (`trybox image build NAME`) must not read as an option:
// `--rebuild-rootfs` as an image name once rebuilt debian-12 (issue 41.8).
TEST(NamesTest, ANameStartingWithADashIsRefusedNamingTheRule) {
  for (const char* bad : {"-", "-x", "--rebuild-rootfs", "-f"}) {
    Status st = ValidateName("image name", bad);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("does not start with '-'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(QuoteForMessage(bad)), std::string::npos) << st.message();
  }
  EXPECT_TRUE(ValidateName("image name", "x-").ok());
  EXPECT_TRUE(ValidateName("image name", "_x").ok());
}

TEST(NamesTest, NewIdsAreValidAndDistinct) {
  std::string a = NewId(), b = NewId();
  EXPECT_EQ(a.size(), 12u);
  EXPECT_NE(a, b);
  EXPECT_TRUE(ValidateName("VM id", a).ok());
}

}  // namespace
}  // namespace trybox
