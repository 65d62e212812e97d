#include "util/status.h"

#include <gtest/gtest.h>

namespace trybox {
namespace {

TEST(StatusTest, EveryCodeNameReadsBackAsItsCode) {
  for (int c = 0; c <= static_cast<int>(Code::kCancelled); ++c) {
    const Code code = static_cast<Code>(c);
    EXPECT_EQ(CodeFromName(CodeName(code)), code) << CodeName(code);
  }
  // A name from a newer peer is an error of its own kind, never a success.
  EXPECT_EQ(CodeFromName("SOMETHING_NEW"), Code::kInternal);
  EXPECT_EQ(CodeFromName(""), Code::kInternal);
  EXPECT_EQ(CodeFromName("not_found"), Code::kInternal) << "names are upper case on the wire";
}

}  // namespace
}  // namespace trybox
