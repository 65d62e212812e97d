// The scrubber against every form a host can hand a value back in, whole and split at every
// byte of a stream.
#include "egress/scrub.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "egress/secrets.h"
#include "util/utf8.h"

namespace trybox::egress {
namespace {

// A token, and a value with every byte class the escapes care about (reserved, quote,
// ampersand, angle brackets, a space, a slash and plus for base64, a 2-byte UTF-8 letter).
constexpr char kToken[] = "ghs_0f3c9A7e51d24b6b8a1eZZ";
constexpr char kOdd[] = "p@ss/w+rd=\"q\"&<x> \xc3\xa9nd?";

std::shared_ptr<const SecretSet> Make(std::vector<std::pair<std::string, std::string>> nv) {
  std::vector<SecretInput> in;
  for (auto& [n, v] : nv) {
    SecretInput i;
    i.name = n;
    i.value = v;
    i.hosts = {"api.test"};
    in.push_back(std::move(i));
  }
  auto set = SecretSet::Make(std::move(in));
  EXPECT_TRUE(set.ok()) << set.status().ToString();
  return set.ok() ? *set : nullptr;
}

Scrubber For(const SecretSet& set) {
  std::vector<const Secret*> s;
  for (const auto& x : set.secrets()) s.push_back(&x);
  return Scrubber(std::move(s));
}

std::string Percent(std::string_view v, bool all, bool lower) {
  const char* hex = lower ? "0123456789abcdef" : "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : v) {
    bool keep = !all && (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~');
    if (keep) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// JSON as Python's json.dumps writes it (ensure_ascii): \" \\ and \uXXXX for non-ASCII; with
// `all`, every byte as \u00XX; `slash` writes / as \/ (PHP, Java's org.json).
std::string Json(std::string_view v, bool all, bool slash) {
  std::string out;
  char buf[8];
  for (size_t i = 0; i < v.size(); ++i) {
    auto c = static_cast<unsigned char>(v[i]);
    if (c >= 0x80) {  // the 2-byte letter in kOdd
      uint32_t cp = ((c & 0x1F) << 6) | (static_cast<unsigned char>(v[++i]) & 0x3F);
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      out += buf;
    } else if (all) {
      std::snprintf(buf, sizeof buf, "\\u%04X", c);
      out += buf;
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '/' && slash) {
      out += "\\/";
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string Html(std::string_view v) {
  std::string out;
  for (unsigned char c : v) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else if (c == '/')
      out += "&#x2F;";
    else if (c == '@')
      out += "&#64;";
    else
      out += static_cast<char>(c);
  }
  return out;
}

std::string UrlSafe(std::string b64, bool pad) {
  for (char& c : b64) c = c == '+' ? '-' : c == '/' ? '_' : c;
  if (!pad) b64.erase(b64.find_last_not_of('=') + 1);
  return b64;
}

class ScrubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_ = Make({{"TOKEN", kToken}, {"ODD", kOdd}});
    ASSERT_NE(set_, nullptr);
    scrub_ = For(*set_);
    ph_token_ = set_->GuestEnv().at("TOKEN");
    ph_odd_ = set_->GuestEnv().at("ODD");
  }

  // Every form of every value the tests hand the scrubber, in a sentence.
  std::vector<std::string> Forms(std::string_view v) const {
    std::string b64 = Base64Encode(v);
    return {std::string(v),
            AsciiUpper(v),
            Percent(v, false, false),
            Percent(v, true, false),
            Percent(v, true, true),
            Percent(Percent(v, false, false), false, false),  // twice: %252F
            Json(v, false, false),
            Json(v, false, true),
            Json(v, true, false),
            Html(v),
            b64,
            UrlSafe(b64, true),
            UrlSafe(b64, false),
            Json(b64, false, true),
            Percent(b64, false, false)};
  }
  static std::string AsciiUpper(std::string_view v) {
    std::string s(v);
    for (char& c : s) c = (c >= 'a' && c <= 'z') ? static_cast<char>(c - 32) : c;
    return s;
  }

  std::shared_ptr<const SecretSet> set_;
  Scrubber scrub_;
  std::string ph_token_, ph_odd_;
};

TEST_F(ScrubTest, TextWithoutAValueComesBackUnchanged) {
  const std::string text =
      "HTTP/1.1 404 Not Found: /repos/me/proj?x=%41&y=\\u0041 &amp; dGhpcyBpcyBub3Q= ghs_0f3c";
  int n = 0;
  EXPECT_EQ(scrub_.ScrubAll(text, &n), text);
  EXPECT_EQ(n, 0);
}

TEST_F(ScrubTest, EveryFormOfEveryValueIsReplaced) {
  for (std::string_view v : {std::string_view(kToken), std::string_view(kOdd)}) {
    for (const std::string& form : Forms(v)) {
      SCOPED_TRACE(form);
      int n = 0;
      std::string out = scrub_.ScrubAll("before " + form + " after", &n);
      EXPECT_EQ(n, 1);
      EXPECT_EQ(out.find(form), std::string::npos) << out;
      EXPECT_EQ(out.rfind("before ", 0), 0u) << out;
      EXPECT_EQ(out.substr(out.size() - 6), " after") << out;
      // What is left decodes to no value either.
      EXPECT_EQ(out.find(v), std::string::npos);
    }
  }
}

TEST_F(ScrubTest, ARawOrUniformlyEscapedValueBecomesItsPlaceholderWrittenTheSameWay) {
  EXPECT_EQ(scrub_.ScrubAll(std::string("Location: /x?t=") + kToken),
            "Location: /x?t=" + ph_token_);
  EXPECT_EQ(scrub_.ScrubAll(Percent(kToken, true, true)), Percent(ph_token_, true, true));
  EXPECT_EQ(scrub_.ScrubAll(Percent(kOdd, true, false)), Percent(ph_odd_, true, false));
  EXPECT_EQ(scrub_.ScrubAll("{\"t\":\"" + Json(kToken, true, false) + "\"}"),
            "{\"t\":\"" + Json(ph_token_, true, false) + "\"}");
}

// The value's base64 inside a longer run, at each alignment (0..5 bytes before it, 0..3 after)
// and in both alphabets, with and without padding: the run still decodes, to the same bytes
// around the placeholder.
TEST_F(ScrubTest, Base64AtEveryAlignmentDecodesToThePlaceholderWithItsNeighboursKept) {
  for (std::string_view v : {std::string_view(kToken), std::string_view(kOdd)}) {
    const std::string& ph = v == kToken ? ph_token_ : ph_odd_;
    for (size_t before = 0; before < 6; ++before) {
      for (size_t after = 0; after < 4; ++after) {
        std::string pre = std::string("user:xy").substr(0, before);
        std::string post = std::string("!?#").substr(0, after);
        for (bool url : {false, true}) {
          for (bool pad : {false, true}) {
            SCOPED_TRACE(std::to_string(before) + "/" + std::to_string(after) +
                         " url=" + std::to_string(url) + " pad=" + std::to_string(pad));
            std::string b64 = Base64Encode(pre + std::string(v) + post);
            if (url) b64 = UrlSafe(b64, true);
            if (!pad) b64.erase(b64.find_last_not_of('=') + 1);
            int n = 0;
            std::string out = scrub_.ScrubAll("Basic " + b64, &n);
            EXPECT_EQ(n, 1) << out;
            ASSERT_EQ(out.rfind("Basic ", 0), 0u);
            std::string run = out.substr(6);
            for (char& c : run) c = c == '-' ? '+' : c == '_' ? '/' : c;
            while (run.size() % 4 != 0) run += '=';
            auto decoded = Base64Decode(run);
            ASSERT_TRUE(decoded.ok()) << out;
            EXPECT_EQ(*decoded, pre + ph + post);
          }
        }
      }
    }
  }
}

// A stream split at every byte: what comes out is what the whole text gives, and no value.
TEST_F(ScrubTest, EverySplitPointOfAStreamGivesTheSameAsTheWholeText) {
  for (std::string_view v : {std::string_view(kToken), std::string_view(kOdd)}) {
    for (const std::string& form : Forms(v)) {
      const std::string text = "data: {\"echo\": \"" + form + "\"}\n\n";
      for (bool fit : {false, true}) {
        std::string whole;
        {
          ScrubStream s(scrub_, fit);
          s.Feed(text, &whole);
          s.Finish(&whole);
        }
        if (fit) {
          EXPECT_EQ(whole.size(), text.size()) << form;
        }
        EXPECT_EQ(whole.find(form), std::string::npos);
        for (size_t cut = 0; cut <= text.size(); ++cut) {
          ScrubStream s(scrub_, fit);
          std::string out;
          s.Feed(std::string_view(text).substr(0, cut), &out);
          EXPECT_LT(s.held(), scrub_.max_encoded());
          s.Feed(std::string_view(text).substr(cut), &out);
          s.Finish(&out);
          ASSERT_EQ(out, whole) << "cut at " << cut << " of " << form;
        }
        // Byte by byte.
        ScrubStream s(scrub_, fit);
        std::string out;
        for (char c : text) s.Feed(std::string_view(&c, 1), &out);
        s.Finish(&out);
        EXPECT_EQ(out, whole) << form;
      }
    }
  }
}

// A stream that holds no beginning of a value is released at once: server-sent events arrive
// as they come.
TEST_F(ScrubTest, AStreamReleasesEveryByteThatCannotStartAValue) {
  ScrubStream s(scrub_, true);
  std::string out;
  s.Feed("event: token\ndata: {\"text\": \"hello\"}\n\n", &out);
  EXPECT_EQ(out, "event: token\ndata: {\"text\": \"hello\"}\n\n");
  EXPECT_EQ(s.held(), 0u);
  // The first half of the value is held (it may be the value), and no more than that.
  const std::string half = std::string(kToken).substr(0, 10);
  s.Feed("data: " + half, &out);
  EXPECT_EQ(out.find(half), std::string::npos);
  EXPECT_EQ(s.held(), half.size());
  s.Feed(std::string(kToken).substr(10) + "\n\n", &out);
  EXPECT_EQ(out.find(kToken), std::string::npos);
  EXPECT_NE(out.find("data: " + ph_token_ + "\n\n"), std::string::npos) << out;
  EXPECT_EQ(s.replaced(), 1);
  // Something that only began like the value is released once it stops being it.
  s.Feed("data: " + half + "-not-it\n", &out);
  EXPECT_EQ(s.held(), 0u);
  EXPECT_NE(out.find(half + "-not-it\n"), std::string::npos);
}

TEST_F(ScrubTest, FitKeepsTheLengthOfWhatItReplaces) {
  std::string mixed = "%67hs_0f3c9A7e51d24b6b8a1e&#90;Z";  // percent, raw and a reference
  for (const std::string& text : {mixed, std::string(kToken), Percent(kToken, true, false)}) {
    ScrubStream s(scrub_, true);
    std::string out;
    s.Feed(text, &out);
    s.Finish(&out);
    EXPECT_EQ(out.size(), text.size());
    EXPECT_EQ(s.replaced(), 1) << text;
  }
}

TEST_F(ScrubTest, AShortValueIsScrubbedRawButNotInBase64) {
  auto set = Make({{"PIN", "k9"}});
  ASSERT_NE(set, nullptr);
  Scrubber s = For(*set);
  const std::string ph = set->GuestEnv().at("PIN");
  EXPECT_EQ(s.ScrubAll("pin=k9;"), "pin=" + ph + ";");
  EXPECT_EQ(s.ScrubAll("azk="), "azk=");  // base64 of "k9" is "azk="
}

TEST_F(ScrubTest, AnEmptyScrubberPassesEverything) {
  Scrubber none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.ScrubAll(kToken), kToken);
}

}  // namespace
}  // namespace trybox::egress
