#include "util/utf8.h"

#include <gtest/gtest.h>

#include <random>

namespace trybox {
namespace {

using Json = nlohmann::json;

// The yardstick is nlohmann's own check: a string is valid exactly when dump() does not throw.
bool DumpAccepts(const std::string& s) {
  try {
    (void)Json(s).dump();
    return true;
  } catch (const Json::exception&) {
    return false;
  }
}

TEST(Utf8Test, ValidityAgreesWithWhatJsonDumpAccepts) {
  std::vector<std::string> cases = {"",
                                    "plain",
                                    "caf\xc3\xa9",
                                    "\xe2\x82\xac",
                                    "\xf0\x9f\x98\x80",
                                    "\xff",
                                    "\xc0\xaf",          // overlong '/'
                                    "\xe0\x80\xaf",      // overlong '/'
                                    "\xed\xa0\x80",      // a surrogate
                                    "\xf4\x90\x80\x80",  // past U+10FFFF
                                    "\xc3",              // truncated
                                    "a\x80z",
                                    "\xef\xbf\xbf"};
  std::mt19937 rng(42);
  for (int i = 0; i < 20000; ++i) {
    std::string s(1 + rng() % 6, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 3 == 0 ? rng() : 0x80 + rng() % 0x80);
    cases.push_back(s);
  }
  for (const auto& s : cases) {
    EXPECT_EQ(IsValidUtf8(s), DumpAccepts(s)) << Base64Encode(s);
    EXPECT_TRUE(DumpAccepts(JsonSafe(s))) << Base64Encode(s);
  }
}

TEST(Utf8Test, JsonSafeShowsBadBytesAsHexAndKeepsTheRest) {
  EXPECT_EQ(JsonSafe("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(JsonSafe("bad\xff\xfe-\xc3\xa9"), "bad\\xff\\xfe-\xc3\xa9");
  EXPECT_EQ(JsonSafe("\xc3"), "\\xc3");
}

TEST(Utf8Test, BytesFieldRoundTripsAnyByteString) {
  std::mt19937 rng(7);
  for (int i = 0; i < 5000; ++i) {
    std::string s(rng() % 12, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    Json j = Json::object();
    SetBytesField(j, "path", s);
    EXPECT_EQ(j.contains("path_b64"), !IsValidUtf8(s));
    Json back = Json::parse(j.dump());  // dump never throws
    auto got = GetBytesField(back, "path");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, s);
  }
}

TEST(Utf8Test, BytesFieldErrorsAreValuesNotExceptions) {
  EXPECT_FALSE(GetBytesField(Json::object(), "path").ok());
  EXPECT_FALSE(GetBytesField(Json{{"path", 3}}, "path").ok());
  EXPECT_FALSE(GetBytesField(Json{{"path", "x"}, {"path_b64", "!!!!"}}, "path").ok());
  EXPECT_FALSE(GetBytesField(Json{{"path", "x"}, {"path_b64", 5}}, "path").ok());
  EXPECT_FALSE(GetBytesField(Json::array(), "path").ok());
}

TEST(Utf8Test, HexRoundTripsEveryByteAndRefusesWhatIsNotHex) {
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  const std::string hex = HexEncode(all);
  EXPECT_EQ(hex.substr(0, 8), "00010203");
  EXPECT_EQ(hex.substr(hex.size() - 4), "feff");
  EXPECT_EQ(HexDecode(hex), all);
  EXPECT_EQ(HexDecode("A0fF"), std::string("\xa0\xff"));
  EXPECT_EQ(HexDecode(""), std::string());
  EXPECT_EQ(HexDecode("abc"), std::nullopt);  // odd length
  EXPECT_EQ(HexDecode("0g"), std::nullopt);
  EXPECT_EQ(HexDecode("-1"), std::nullopt);
}

TEST(Utf8Test, Base64IsStrictAndCanonical) {
  for (std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"}) {
    EXPECT_EQ(Base64Decode(Base64Encode(s)).value_or("?"), s);
  }
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_FALSE(Base64Decode("Zm8").ok());
  EXPECT_FALSE(Base64Decode("Zm9=").ok());  // non-zero trailing bits
  EXPECT_FALSE(Base64Decode("Z=8=").ok());
  EXPECT_FALSE(Base64Decode("Zm 8").ok());
}

TEST(Utf8Test, OneLineCannotBreakOrReorderALine) {
  EXPECT_EQ(OneLine("plain caf\xc3\xa9\ttab"), "plain caf\xc3\xa9\ttab");
  EXPECT_EQ(OneLine("a\nb\rc\x1b[2J"), "a\\u{000A}b\\u{000D}c\\u{001B}[2J");
  EXPECT_EQ(OneLine("x\xe2\x80\xa8y\xe2\x80\xaez\xc2\x85"), "x\\u{2028}y\\u{202E}z\\u{0085}");
  EXPECT_EQ(OneLine("bad\xff"), "bad\\xff");
}

// Bidi marks reorder neutral characters around them (a file name shown as another).
TEST(Utf8Test, OneLineShowsBidiMarks) {
  EXPECT_EQ(OneLine("a\xe2\x80\x8e"
                    "b\xe2\x80\x8f"
                    "c\xd8\x9c"
                    "d"),
            "a\\u{200E}b\\u{200F}c\\u{061C}d");
  EXPECT_EQ(OneLine("\x7f\x1b]52;c;SGVsbG8=\x07"), "\\u{007F}\\u{001B}]52;c;SGVsbG8=\\u{0007}");
  EXPECT_EQ(OneLine("\xd0\x96\xe6\x97\xa5\xf0\x9f\x98\x80"),
            "\xd0\x96\xe6\x97\xa5\xf0\x9f\x98\x80");
}

TEST(Utf8Test, SafeDumpNeverThrows) {
  Json j = {{"name", std::string("bad\xff")}};
  EXPECT_THROW((void)j.dump(), Json::exception);
  EXPECT_EQ(SafeDump(j), "{\"name\":\"bad\xef\xbf\xbd\"}");
}

}  // namespace
}  // namespace trybox
