#include "egress/http_rules.h"

#include <gtest/gtest.h>

namespace trybox::egress {
namespace {

HttpRules Rules(const std::vector<std::string>& texts) {
  auto r = HttpRules::Make(texts);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(*r) : HttpRules();
}

TEST(HttpRuleParse, ReadsActionMethodsHostAndPath) {
  auto r = ParseHttpRule("allow GET,HEAD  API.GitHub.com/repos/Me/Proj/");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->allow);
  EXPECT_EQ(r->methods, (std::vector<std::string>{"GET", "HEAD"}));
  EXPECT_EQ(r->host, "api.github.com");
  EXPECT_EQ(r->path, "/repos/me/proj");
  EXPECT_EQ(r->text, "allow GET,HEAD api.github.com/repos/me/proj");
  auto whole = ParseHttpRule("deny * forge.test");
  ASSERT_TRUE(whole.ok());
  EXPECT_FALSE(whole->allow);
  EXPECT_TRUE(whole->methods.empty());
  EXPECT_EQ(whole->path, "/");
}

TEST(HttpRuleParse, RefusesWhatHasNoOneMeaningNamingIt) {
  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {"allow GET", "ACTION METHODS HOST"},       {"allow GET a.test /x", "ACTION METHODS HOST"},
      {"permit GET a.test", "allow or deny"},     {"allow get a.test", "upper-case"},
      {"allow GET,,POST a.test", "comma list"},   {"allow GET 127.0.0.1/x", "host"},
      {"allow GET a.test:443/x", "host"},         {"allow GET a.test/x?y=1", "'?'"},
      {"allow GET a.test/x%2Fy", "'%'"},          {"allow GET a.test/a/../b", "'..'"},
      {"allow GET a.test/a//b", "empty segment"}, {"allow GET a.test/a;b", "';'"},
  };
  for (const auto& c : cases) {
    auto r = ParseHttpRule(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos)
        << c.text << ": " << r.status().message();
  }
  auto many = HttpRules::Make({"allow GET a.test", "allow GET"});
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("HTTP rule 1"), std::string::npos);
}

TEST(HttpRulesCheck, AForgeOpenForOneRepositoryOnly) {
  HttpRules r = Rules({"allow GET,POST api.forge.test/repos/me/proj"});
  EXPECT_TRUE(r.Covers("api.forge.test"));
  EXPECT_FALSE(r.Covers("other.test"));
  EXPECT_EQ(r.Check("api.forge.test", "GET", "/repos/me/proj"), "");
  EXPECT_EQ(r.Check("api.forge.test", "POST", "/repos/me/proj/issues?x=1"), "");
  EXPECT_EQ(r.Check("api.forge.test", "GET", "/repos/me/proj/"), "");
  // A different repository, a longer name with the same prefix, another method.
  std::string other = r.Check("api.forge.test", "GET", "/repos/me/other");
  EXPECT_EQ(other, "no HTTP rule for api.forge.test allows GET /repos/me/other");
  EXPECT_NE(r.Check("api.forge.test", "GET", "/repos/me/project"), "");
  EXPECT_NE(r.Check("api.forge.test", "DELETE", "/repos/me/proj"), "");
  EXPECT_NE(r.Check("api.forge.test", "GET", "/"), "");
  // A host without rules is not the rules' business.
  EXPECT_EQ(r.Check("other.test", "DELETE", "/anything"), "");
}

TEST(HttpRulesCheck, TheFirstMatchingRuleDecidesInOrder) {
  HttpRules r = Rules(
      {"deny * forge.test/me/proj/settings", "allow * forge.test/me/proj", "allow GET forge.test"});
  EXPECT_EQ(r.Check("forge.test", "GET", "/me/proj/settings/keys"),
            "HTTP rule 'deny * forge.test/me/proj/settings' refuses GET /me/proj/settings/keys");
  EXPECT_EQ(r.Check("forge.test", "PUT", "/me/proj/file"), "");
  EXPECT_EQ(r.Check("forge.test", "GET", "/someone/else"), "");
  EXPECT_NE(r.Check("forge.test", "POST", "/someone/else"), "");
  // OPTIONS * is the whole host's: only a rule for "/" decides it.
  EXPECT_EQ(r.Check("forge.test", "GET", "*"), "");
  EXPECT_NE(r.Check("forge.test", "OPTIONS", "*"), "");
}

TEST(HttpRulesCheck, SpellingsThatCouldPassADenyRuleAreRefusedOrSeenThrough) {
  HttpRules r = Rules({"deny * forge.test/me/secret", "allow * forge.test"});
  // Case and percent-encoding of ordinary bytes are seen through.
  EXPECT_NE(r.Check("forge.test", "GET", "/ME/Secret"), "");
  EXPECT_NE(r.Check("forge.test", "GET", "/me/%73ecret/x"), "");
  // What servers read differently is refused outright, whichever rule it would meet.
  for (const char* t :
       {"/me/x/../secret", "/me/./secret", "/me//secret", "/me%2fsecret", "/me%5Csecret",
        "/me\\secret", "/me/secret;x", "/me/%zz", "/me/%4", "/me/%00"}) {
    std::string why = r.Check("forge.test", "GET", t);
    EXPECT_NE(why.find("cannot decide"), std::string::npos) << t << ": " << why;
  }
  EXPECT_EQ(r.Check("forge.test", "GET", "/me/secretary"), "");
  EXPECT_EQ(r.Check("forge.test", "GET", "/me/open?path=../secret"), "");
}

TEST(HttpRulesCheck, AReasonQuotesAtMostTwoHundredBytesOfThePath) {
  HttpRules r = Rules({"allow GET forge.test/a"});
  std::string why = r.Check("forge.test", "GET", "/b/" + std::string(5000, 'x'));
  EXPECT_LT(why.size(), 300u);
  EXPECT_NE(why.find("..."), std::string::npos);
}

}  // namespace
}  // namespace trybox::egress
