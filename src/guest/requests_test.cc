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

Json GoodIdentity() {
  return {{"op", "identity"},
          {"vm_id", "abc123"},
          {"hostname", "trybox-abc123"},
          {"machine_id", "0123456789ABCDEF0123456789abcdef"},
          {"seed", std::string(64, 'f') + std::string(64, '0')},
          {"time_ns", 1700000000000000000}};
}

TEST(IdentityRequestTest, AllFieldsAreReadAndNormalised) {
  auto r = ParseIdentityRequest(GoodIdentity());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->vm_id, "abc123");
  EXPECT_EQ(r->hostname, "trybox-abc123");
  EXPECT_EQ(r->machine_id, "0123456789abcdef0123456789abcdef");
  ASSERT_EQ(r->seed.size(), 64u);
  EXPECT_EQ(r->seed[0], 0xff);
  EXPECT_EQ(r->seed[63], 0x00);
  EXPECT_EQ(r->time_ns, 1700000000000000000);
}

TEST(IdentityRequestTest, EachBadFieldIsNamed) {
  struct Case {
    const char* field;
    Json value;
  };
  const Case cases[] = {
      {"vm_id", "../x"},
      {"vm_id", 7},
      {"hostname", "bad_host!"},
      {"hostname", ""},
      {"machine_id", "00000000000000000000000000000000"},
      {"machine_id", "0123"},
      {"seed", "abc"},                   // odd length
      {"seed", std::string(62, 'a')},    // 31 bytes: too little entropy
      {"seed", std::string(1026, 'a')},  // too long
      {"seed", std::string(63, 'a') + "g"},
      {"time_ns", 0},
      {"time_ns", -5},
      {"time_ns", "now"},
  };
  for (const auto& c : cases) {
    Json req = GoodIdentity();
    req[c.field] = c.value;
    auto r = ParseIdentityRequest(req);
    ASSERT_FALSE(r.ok()) << c.field << "=" << c.value.dump();
    EXPECT_NE(r.status().message().find(c.field), std::string::npos) << r.status().message();
  }
  for (const char* field : {"vm_id", "hostname", "machine_id", "seed", "time_ns"}) {
    Json req = GoodIdentity();
    req.erase(field);
    auto r = ParseIdentityRequest(req);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace trybox::guest
