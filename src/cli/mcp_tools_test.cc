#include "cli/mcp_tools.h"

#include <gtest/gtest.h>

namespace trybox::cli::mcp {
namespace {

TEST(McpToolsTest, VmCreateTakesSecretNamesButNeverASourceOrValue) {
  auto c = ParseCreate(Json{{"allow", {"api.github.test"}}, {"secrets", {"GH_TOKEN"}}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->secrets, std::vector<std::string>{"GH_TOKEN"});
  for (const char* bad : {"GH=env:HOME@a.test", "GH=file:/etc/shadow@a.test", "1GH", ""}) {
    auto r = ParseCreate(Json{{"secrets", {bad}}});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("names of secrets in secrets.json"), std::string::npos);
  }
}

TEST(McpToolsTest, VmCreateTakesHttpRulesAndNamesABadOne) {
  auto c = ParseCreate(Json{{"http_rules", {"allow GET api.github.test/repos/me/proj"}}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->http_rules, std::vector<std::string>{"allow GET api.github.test/repos/me/proj"});
  auto bad = ParseCreate(Json{{"http_rules", {"allow GET a.test/x/../y"}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("http_rules"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("'..'"), std::string::npos) << bad.status().message();
}

TEST(McpToolsTest, OutputKeeperKeepsEverythingUpToItsLimit) {
  OutputKeeper k(10);
  k.Add("abc");
  k.Add("defghij");
  EXPECT_FALSE(k.truncated());
  EXPECT_EQ(k.Text("hint"), "abcdefghij");
}

TEST(McpToolsTest, OutputKeeperKeepsHeadAndTailOfALongStream) {
  OutputKeeper k(10);
  for (char c = 'a'; c <= 'z'; ++c) k.Add(std::string(1, c));
  EXPECT_TRUE(k.truncated());
  EXPECT_EQ(k.total(), 26u);
  EXPECT_EQ(k.Text("trybox logs 3"),
            "abcde\n[... 16 bytes left out; the whole output: trybox logs 3 ...]\nvwxyz");
}

TEST(McpToolsTest, FindRecordsParseAndMalformedOnesAreNamed) {
  std::string one = std::string("f\0", 2) + std::string("3\0", 2) + std::string("600\0", 4) +
                    std::string("1.25\0", 5) + std::string("a\nb\0", 4) + std::string("\0", 1);
  auto e = ParseFindRecords(one);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ(e->size(), 1u);
  EXPECT_EQ((*e)[0].path, "a\nb");  // a newline in a name cannot split a record
  EXPECT_EQ((*e)[0].size, 3u);
  EXPECT_EQ((*e)[0].mtime, 1.25);
  EXPECT_TRUE(ParseFindRecords("").ok());
  EXPECT_FALSE(ParseFindRecords(one.substr(0, one.size() - 1)).ok());  // cut mid-record
  std::string bad_size = one;
  bad_size[2] = 'x';
  EXPECT_FALSE(ParseFindRecords(bad_size).ok());
  std::string bad_mode = one;
  bad_mode[4] = '9';
  EXPECT_FALSE(ParseFindRecords(bad_mode).ok());
}

TEST(McpToolsTest, ListDirArgvUsesNulSeparatedRecordsToTheGivenDepth) {
  ListArgs a;
  a.path = "/srv/x y";
  a.depth = 3;
  auto argv = ListDirArgv(a);
  ASSERT_GE(argv.size(), 9u);
  EXPECT_EQ(argv[0], "find");
  EXPECT_EQ(argv[2], "/srv/x y");
  EXPECT_EQ(argv[6], "3");
  EXPECT_NE(argv.back().find("\\0"), std::string::npos);
}

TEST(McpToolsTest, ChooseToolsKeepsListingOrder) {
  auto t = ChooseTools("vm_destroy,vm_create");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, std::vector<std::string>({"vm_create", "vm_destroy"}));
  EXPECT_EQ(ChooseTools("")->size(), AllToolNames().size());
  EXPECT_FALSE(ChooseTools(",").ok());
  EXPECT_FALSE(ChooseTools("vm_agent,nope").ok());
}

TEST(McpToolsTest, WriteArgsDecodeBase64AndDefaultToMkdirs) {
  auto w = ParseWrite({{"vm", "v"}, {"path", "/x"}, {"content", "hi"}});
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->mkdirs);
  EXPECT_EQ(w->mode, 0644u);
  EXPECT_EQ(ParseWrite({{"vm", "v"}, {"path", "/x"}, {"content_b64", "aGk="}})->content, "hi");
  EXPECT_FALSE(ParseWrite({{"vm", "v"}, {"path", "/x/"}, {"content", "hi"}}).ok());
}

TEST(McpToolsTest, ExecArgsDefaultToTenMinutesAndAShellForCommand) {
  auto e = ParseExec({{"vm", "v"}, {"command", "make test"}});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->argv, std::vector<std::string>({"/bin/sh", "-c", "make test"}));
  EXPECT_EQ(e->timeout_ms, 600000);
  EXPECT_GT(e->max_output, 0u);
}

}  // namespace
}  // namespace trybox::cli::mcp
