#include "api/dashboard_auth.h"

#include <gtest/gtest.h>

namespace trybox::api {
namespace {

HttpRequest Req(std::map<std::string, std::string> headers) {
  HttpRequest r;
  r.method = "POST";
  r.path = "/trybox/v1/vms";
  r.headers = std::move(headers);
  return r;
}

TEST(SessionBookTest, ASessionIsFoundByItsTokenOnlyUntilItEndsOrIsClosed) {
  SessionBook book(std::chrono::seconds(60));
  auto now = SessionBook::Clock::now();
  book.SetClockForTest([&] { return now; });
  auto [token, session] = book.Open("key-1234abcd");
  EXPECT_EQ(token.size(), 64u);
  EXPECT_EQ(session.csrf.size(), 64u);
  EXPECT_NE(token, session.csrf);
  auto found = book.Find(token);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->key_id, "key-1234abcd");
  EXPECT_EQ(found->csrf, session.csrf);

  // Another session of the same key is another token and another CSRF token.
  auto [token2, session2] = book.Open("key-1234abcd");
  EXPECT_NE(token2, token);
  EXPECT_NE(session2.csrf, session.csrf);

  // A token one digit off, a malformed one, an empty one: nothing.
  std::string off = token;
  off[0] = off[0] == 'a' ? 'b' : 'a';
  EXPECT_FALSE(book.Find(off).has_value());
  EXPECT_FALSE(book.Find(token.substr(1)).has_value());
  EXPECT_FALSE(book.Find(token + "0").has_value());
  EXPECT_FALSE(book.Find("").has_value());

  book.Close(token2);
  EXPECT_FALSE(book.Find(token2).has_value());
  EXPECT_TRUE(book.Find(token).has_value());

  now += std::chrono::seconds(61);
  EXPECT_FALSE(book.Find(token).has_value()) << "a session past its lifetime is over";
}

TEST(SessionBookTest, PastTheCapTheOldestSessionEnds) {
  SessionBook book(std::chrono::seconds(3600), 3);
  auto now = SessionBook::Clock::now();
  book.SetClockForTest([&] { return now; });
  std::vector<std::string> tokens;
  for (int i = 0; i < 4; ++i) {
    tokens.push_back(book.Open("key-" + std::to_string(i)).first);
    now += std::chrono::seconds(1);
  }
  EXPECT_FALSE(book.Find(tokens[0]).has_value());
  for (int i = 1; i < 4; ++i) EXPECT_TRUE(book.Find(tokens[i]).has_value()) << i;
}

TEST(CookieValueTest, FindsTheNamedCookieAmongOthers) {
  EXPECT_EQ(CookieValue("trybox_session=abc", "trybox_session"), "abc");
  EXPECT_EQ(CookieValue("a=1; trybox_session=abc; b=2", "trybox_session"), "abc");
  EXPECT_EQ(CookieValue("a=1;trybox_session=abc", "trybox_session"), "abc");
  EXPECT_EQ(CookieValue("xtrybox_session=abc", "trybox_session"), "");
  EXPECT_EQ(CookieValue("trybox_session_old=abc", "trybox_session"), "");
  EXPECT_EQ(CookieValue("", "trybox_session"), "");
  EXPECT_EQ(CookieValue("trybox_session", "trybox_session"), "");
  EXPECT_EQ(CookieValue("trybox_session=", "trybox_session"), "");
}

TEST(FormValueTest, DecodesUrlencodedFields) {
  EXPECT_EQ(FormValue("key=e2b_abc", "key"), "e2b_abc");
  EXPECT_EQ(FormValue("a=1&key=x%2By+z&b=2", "key"), "x+y z");
  EXPECT_EQ(FormValue("k%65y=v", "key"), "v");
  EXPECT_EQ(FormValue("key=", "key"), "");
  EXPECT_EQ(FormValue("key", "key"), "");
  EXPECT_FALSE(FormValue("a=1&b=2", "key").has_value());
  EXPECT_FALSE(FormValue("", "key").has_value());
}

TEST(CrossOriginRefusalTest, OnlyTheServersOwnOriginOnALoopbackNameMayUseTheSession) {
  // A same-origin fetch, a navigation typed by hand, a client that sends neither header.
  EXPECT_FALSE(CrossOriginRefusal(Req({{"host", "127.0.0.1:3000"},
                                       {"origin", "http://127.0.0.1:3000"},
                                       {"sec-fetch-site", "same-origin"}}))
                   .has_value());
  EXPECT_FALSE(CrossOriginRefusal(Req({{"host", "localhost:3000"}, {"sec-fetch-site", "none"}}))
                   .has_value());
  EXPECT_FALSE(CrossOriginRefusal(Req({{"host", "[::1]:3000"}})).has_value());

  // Another port of the same address is the same site, but another origin.
  auto r =
      CrossOriginRefusal(Req({{"host", "127.0.0.1:3000"}, {"origin", "http://127.0.0.1:3001"}}));
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->find("http://127.0.0.1:3001"), std::string::npos) << *r;
  EXPECT_TRUE(CrossOriginRefusal(Req({{"host", "127.0.0.1:3000"}, {"sec-fetch-site", "same-site"}}))
                  .has_value());
  EXPECT_TRUE(
      CrossOriginRefusal(Req({{"host", "127.0.0.1:3000"}, {"sec-fetch-site", "cross-site"}}))
          .has_value());
  EXPECT_TRUE(
      CrossOriginRefusal(Req({{"host", "127.0.0.1:3000"}, {"origin", "null"}})).has_value());
  // A name rebound to 127.0.0.1 is its own origin, with its own Origin to match.
  r = CrossOriginRefusal(
      Req({{"host", "evil.example:3000"}, {"origin", "http://evil.example:3000"}}));
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->find("loopback"), std::string::npos) << *r;
  EXPECT_TRUE(CrossOriginRefusal(Req({{"host", "127.0.0.1.evil.example"}})).has_value());
  EXPECT_TRUE(CrossOriginRefusal(Req({})).has_value()) << "no Host at all";
}

TEST(DashboardHeadersTest, EveryAnswerCarriesAStrictPolicy) {
  HttpResponse r;
  AddSecurityHeaders(&r);
  std::map<std::string, std::string> h(r.headers.begin(), r.headers.end());
  const std::string csp = h["Content-Security-Policy"];
  EXPECT_NE(csp.find("default-src 'none'"), std::string::npos);
  EXPECT_NE(csp.find("script-src 'self'"), std::string::npos);
  EXPECT_EQ(csp.find("unsafe-inline"), std::string::npos);
  EXPECT_EQ(csp.find("unsafe-eval"), std::string::npos);
  EXPECT_NE(csp.find("frame-ancestors 'none'"), std::string::npos);
  EXPECT_EQ(h["X-Content-Type-Options"], "nosniff");

  EXPECT_EQ(SessionCookie("ab", std::chrono::seconds(10)),
            "trybox_session=ab; Path=/; HttpOnly; SameSite=Strict; Max-Age=10");
  EXPECT_NE(ClearedSessionCookie().find("Max-Age=0"), std::string::npos);
  EXPECT_EQ(HtmlEscape("<img src=x onerror='a(\"1\")'>&"),
            "&lt;img src=x onerror=&#39;a(&quot;1&quot;)&#39;&gt;&amp;");
}

}  // namespace
}  // namespace trybox::api
