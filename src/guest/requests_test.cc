#include "guest/requests.h"

#include <gtest/gtest.h>

namespace trybox::guest {
namespace {

TEST(RequestOpTest, MissingOrNonStringOpIsAnError) {
  EXPECT_FALSE(RequestOp(Json::object()).ok());
  EXPECT_FALSE(RequestOp({{"op", 3}}).ok());
  EXPECT_EQ(*RequestOp({{"op", "ping"}}), "ping");
}

TEST(ExecRequestTest, DefaultsApply) {
  auto r = ParseExecRequest({{"op", "exec"}, {"argv", {"ls", "-l"}}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->argv, (std::vector<std::string>{"ls", "-l"}));
  EXPECT_EQ(r->cwd, "/root");
  EXPECT_EQ(r->timeout_ms, 0u);
  EXPECT_FALSE(r->stdin_from_stream);
  EXPECT_TRUE(r->env.empty());
}

TEST(ExecRequestTest, AllFieldsAreRead) {
  auto r = ParseExecRequest({{"argv", {"x"}},
                             {"env", {{"A", "1"}}},
                             {"cwd", "/tmp"},
                             {"timeout_ms", 1500},
                             {"stdin", true}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->env.at("A"), "1");
  EXPECT_EQ(r->cwd, "/tmp");
  EXPECT_EQ(r->timeout_ms, 1500u);
  EXPECT_TRUE(r->stdin_from_stream);
}

TEST(ExecRequestTest, BadFieldsAreRejectedByName) {
  struct Case {
    Json req;
    const char* names;
  } cases[] = {
      {{{"op", "exec"}}, "argv"},
      {{{"argv", Json::array()}}, "argv"},
      {{{"argv", {1}}}, "argv"},
      {{{"argv", {""}}}, "argv[0]"},
      {{{"argv", {std::string("a\0b", 3)}}}, "NUL"},
      {{{"argv", {"x"}}, {"env", {{"A", 1}}}}, "env"},
      {{{"argv", {"x"}}, {"env", {{"A=B", "1"}}}}, "env name"},
      {{{"argv", {"x"}}, {"env", {"A"}}}, "env"},
      {{{"argv", {"x"}}, {"cwd", "tmp"}}, "cwd"},
      {{{"argv", {"x"}}, {"timeout_ms", -1}}, "timeout_ms"},
      {{{"argv", {"x"}}, {"timeout_ms", 1.5}}, "timeout_ms"},
      {{{"argv", {"x"}}, {"timeout_ms", "5"}}, "timeout_ms"},
      {{{"argv", {"x"}}, {"stdin", "yes"}}, "stdin"},
  };
  for (const auto& c : cases) {
    auto r = ParseExecRequest(c.req);
    ASSERT_FALSE(r.ok()) << c.req.dump();
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.names), std::string::npos)
        << c.req.dump() << " -> " << r.status().message();
  }
}

TEST(PutRequestTest, DefaultsApply) {
  auto r = ParsePutRequest({{"path", "/a/b"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kind, PutKind::kFile);
  EXPECT_EQ(r->mode, 0644u);
  EXPECT_FALSE(r->mtime_ns.has_value());
  EXPECT_FALSE(r->mkdirs);
}

TEST(PutRequestTest, ModeIsMaskedToPermissionBits) {
  auto r = ParsePutRequest({{"path", "/a"}, {"mode", 0100755}, {"mtime_ns", -5}, {"mkdirs", true}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->mode, 0755u);
  EXPECT_EQ(*r->mtime_ns, -5);
  EXPECT_TRUE(r->mkdirs);
}

TEST(PutRequestTest, TarMayTargetTheRoot) {
  auto r = ParsePutRequest({{"path", "/"}, {"kind", "tar"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kind, PutKind::kTar);
}

TEST(PutRequestTest, BadFieldsAreRejected) {
  for (const Json& req :
       {Json{{"op", "put"}}, Json{{"path", "rel/x"}}, Json{{"path", 5}}, Json{{"path", "/"}},
        Json{{"path", "/a/.."}}, Json{{"path", "/a"}, {"kind", "dir"}},
        Json{{"path", "/a"}, {"mode", -1}}, Json{{"path", "/a"}, {"mode", "644"}},
        Json{{"path", "/a"}, {"mtime_ns", 1.5}}, Json{{"path", "/a"}, {"mkdirs", 1}}}) {
    EXPECT_FALSE(ParsePutRequest(req).ok()) << req.dump();
  }
}

TEST(GetRequestTest, PathMustBeAbsolute) {
  EXPECT_TRUE(ParseGetRequest({{"path", "/etc"}}).ok());
  EXPECT_FALSE(ParseGetRequest({{"path", "etc"}}).ok());
  EXPECT_FALSE(ParseGetRequest({{"path", ""}}).ok());
  EXPECT_FALSE(ParseGetRequest(Json::object()).ok());
}

}  // namespace
}  // namespace trybox::guest
