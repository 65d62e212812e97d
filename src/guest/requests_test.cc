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
  EXPECT_FALSE(r->cwd.has_value());  // the account's home
  EXPECT_EQ(r->timeout_ms, 0u);
  EXPECT_FALSE(r->stdin_from_stream);
  EXPECT_TRUE(r->env.empty());
  EXPECT_EQ(r->user, "root");
  EXPECT_FALSE(r->privileged);
}

TEST(ExecRequestTest, AllFieldsAreRead) {
  auto r = ParseExecRequest({{"argv", {"x"}},
                             {"env", {{"A", "1"}}},
                             {"cwd", "/tmp"},
                             {"timeout_ms", 1500},
                             {"stdin", true},
                             {"user", "user"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->env.at("A"), "1");
  EXPECT_EQ(r->cwd, "/tmp");
  EXPECT_EQ(r->timeout_ms, 1500u);
  EXPECT_TRUE(r->stdin_from_stream);
  EXPECT_EQ(r->user, "user");
  EXPECT_FALSE(r->privileged);
}

TEST(ExecRequestTest, PrivilegedIsForRootOnly) {
  for (const Json& req : {Json{{"argv", {"x"}}, {"privileged", true}},
                          Json{{"argv", {"x"}}, {"privileged", true}, {"user", "root"}}}) {
    auto r = ParseExecRequest(req);
    ASSERT_TRUE(r.ok()) << req.dump() << " -> " << r.status().ToString();
    EXPECT_TRUE(r->privileged);
    EXPECT_EQ(r->user, "root");
  }
  for (const char* user : {"user", "nobody", "toor"}) {
    auto r = ParseExecRequest({{"argv", {"x"}}, {"privileged", true}, {"user", user}});
    ASSERT_FALSE(r.ok()) << user;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("privileged"), std::string::npos) << r.status().message();
  }
}

// Numbers arrive as JSON text from the host: a float is refused whatever its value (it
// would otherwise be truncated on its way to an integer), and so is anything out of range.
TEST(ExecRequestTest, NumbersMustBeIntegersWithinRange) {
  auto parse = [](const std::string& timeout) {
    return ParseExecRequest(Json::parse(R"({"argv": ["x"], "timeout_ms": )" + timeout + "}"));
  };
  for (const char* bad : {"4294967.297", "1e20", "1.0", "-1", "1099511627777",
                          "18446744073709551615", "18446744073709551616", "-9223372036854775809"}) {
    auto r = parse(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("\"timeout_ms\" must be an integer"), std::string::npos)
        << bad << " -> " << r.status().message();
  }
  EXPECT_EQ(parse("0")->timeout_ms, 0u);
  EXPECT_EQ(parse("1099511627776")->timeout_ms, kMaxTimeoutMs);
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
      {{{"argv", {"x"}}, {"user", ""}}, "user"},
      {{{"argv", {"x"}}, {"user", 1000}}, "user"},
      {{{"argv", {"x"}}, {"user", "a:b"}}, "user"},
      {{{"argv", {"x"}}, {"user", "a\nb"}}, "user"},
      {{{"argv", {"x"}}, {"user", std::string("a\0b", 3)}}, "user"},
      {{{"argv", {"x"}}, {"user", std::string(257, 'u')}}, "user"},
      {{{"argv", {"x"}}, {"privileged", "yes"}}, "privileged"},
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

TEST(PutRequestTest, ModeAndMtimeAreRangeChecked) {
  auto parse = [](const std::string& field, const std::string& value) {
    return ParsePutRequest(Json::parse(R"({"path": "/a", ")" + field + R"(": )" + value + "}"));
  };
  // An st_mode at most: type and permission bits. 2^32 used to be masked to 0.
  for (const char* bad : {"65536", "4294967296", "-1", "420.0", "1e3"}) {
    auto r = parse("mode", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("\"mode\""), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(parse("mode", "65535")->mode, 07777u);
  for (const char* bad : {"9223372036854775808", "18446744073709551615", "1e18", "0.5"}) {
    auto r = parse("mtime_ns", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("\"mtime_ns\""), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(*parse("mtime_ns", "-9223372036854775808")->mtime_ns, INT64_MIN);
  EXPECT_EQ(*parse("mtime_ns", "9223372036854775807")->mtime_ns, INT64_MAX);
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

TEST(TransferDiskFieldTest, PutBytesAndGetRoomAreCheckedIntegers) {
  auto put = ParsePutRequest({{"path", "/a"}, {"disk", {{"bytes", 4096}}}});
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(put->disk_bytes, 4096u);
  EXPECT_FALSE(ParsePutRequest({{"path", "/a"}})->disk_bytes.has_value());
  auto get = ParseGetRequest({{"path", "/a"}, {"disk", {{"max_bytes", 1 << 20}}}});
  ASSERT_TRUE(get.ok());
  EXPECT_EQ(get->disk_max_bytes, uint64_t{1} << 20);
  for (const char* bad :
       {R"({"path":"/a","disk":{"bytes":-1}})", R"({"path":"/a","disk":{"bytes":1.5}})",
        R"({"path":"/a","disk":{"bytes":"9"}})", R"({"path":"/a","disk":true})",
        R"({"path":"/a","disk":{}})"}) {
    EXPECT_FALSE(ParsePutRequest(Json::parse(bad)).ok()) << bad;
  }
  EXPECT_FALSE(ParseGetRequest({{"path", "/a"}, {"disk", {{"bytes", 1}}}}).ok());
}

TEST(TransferDiskFieldTest, AGetsChannelCapIsACheckedIntegerAndNeverBesideTheDisk) {
  auto get = ParseGetRequest({{"path", "/a"}, {"channel_max_bytes", 1 << 20}});
  ASSERT_TRUE(get.ok()) << get.status().ToString();
  EXPECT_EQ(get->channel_max_bytes, uint64_t{1} << 20);
  EXPECT_FALSE(ParseGetRequest({{"path", "/a"}})->channel_max_bytes.has_value());
  for (const char* bad :
       {R"({"path":"/a","channel_max_bytes":-1})", R"({"path":"/a","channel_max_bytes":"1"})",
        R"({"path":"/a","channel_max_bytes":1,"disk":{"max_bytes":1}})"}) {
    EXPECT_FALSE(ParseGetRequest(Json::parse(bad)).ok()) << bad;
  }
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
      {"time_ns", 1.7e18},
      {"time_ns", Json::parse("9223372036854775808")},
      {"time_ns", Json::parse("18446744073709551615")},
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

TEST(ClockRequestTest, TheTimeIsReadAndABadOneIsNamed) {
  auto r = ParseClockRequest({{"op", "clock"}, {"time_ns", 1796588024565000000}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->time_ns, 1796588024565000000);
  for (const Json& bad :
       {Json(0), Json(-5), Json("now"), Json(1.7e18), Json::parse("9223372036854775808")}) {
    auto b = ParseClockRequest({{"op", "clock"}, {"time_ns", bad}});
    ASSERT_FALSE(b.ok()) << bad.dump();
    EXPECT_NE(b.status().message().find("time_ns"), std::string::npos) << b.status().message();
  }
  auto missing = ParseClockRequest({{"op", "clock"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("time_ns"), std::string::npos);
}

TEST(ExecRequestTest, TtyIsASizeInCells) {
  auto r = ParseExecRequest({{"argv", {"bash"}}, {"tty", {{"rows", 40}, {"cols", 132}}}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->tty.has_value());
  EXPECT_EQ(r->tty->rows, 40);
  EXPECT_EQ(r->tty->cols, 132);
  EXPECT_FALSE(ParseExecRequest({{"argv", {"x"}}})->tty.has_value());
  EXPECT_FALSE(ParseExecRequest({{"argv", {"x"}}, {"tty", nullptr}})->tty.has_value());
}

TEST(ExecRequestTest, ABadTtyIsRefusedByName) {
  const Json bad[] = {true,
                      "24x80",
                      Json::array({24, 80}),
                      {{"rows", 24}},
                      {{"cols", 80}},
                      {{"rows", 0}, {"cols", 80}},
                      {{"rows", 24}, {"cols", 65536}},
                      {{"rows", -1}, {"cols", 80}},
                      {{"rows", 24.0}, {"cols", 80}},
                      {{"rows", "24"}, {"cols", 80}}};
  for (const Json& tty : bad) {
    auto r = ParseExecRequest({{"argv", {"x"}}, {"tty", tty}});
    ASSERT_FALSE(r.ok()) << tty.dump();
    EXPECT_NE(r.status().message().find("tty"), std::string::npos) << r.status().message();
  }
}

TEST(ExecControlTest, ResizeAndSignalAreRead) {
  auto resize = ParseExecControl({{"type", "resize"}, {"rows", 50}, {"cols", 200}});
  ASSERT_TRUE(resize.ok()) << resize.status().ToString();
  EXPECT_EQ(resize->kind, ExecControl::Kind::kResize);
  EXPECT_EQ(resize->size.rows, 50);
  EXPECT_EQ(resize->size.cols, 200);
  auto sig = ParseExecControl({{"type", "signal"}, {"signal", 15}});
  ASSERT_TRUE(sig.ok());
  EXPECT_EQ(sig->kind, ExecControl::Kind::kSignal);
  EXPECT_EQ(sig->signal, 15);
  // A newer host's event is ignored, not an error.
  auto other = ParseExecControl({{"type", "something-new"}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->kind, ExecControl::Kind::kUnknown);
}

TEST(ExecControlTest, AKnownEventWithBadFieldsIsAnError) {
  const Json bad[] = {Json::array(),
                      {{"rows", 1}},
                      {{"type", 7}},
                      {{"type", "resize"}},
                      {{"type", "resize"}, {"rows", 10}},
                      {{"type", "resize"}, {"rows", 10}, {"cols", 0}},
                      {{"type", "resize"}, {"rows", 1e3}, {"cols", 10}},
                      {{"type", "resize"}, {"rows", 70000}, {"cols", 10}},
                      {{"type", "signal"}},
                      {{"type", "signal"}, {"signal", 0}},
                      {{"type", "signal"}, {"signal", 65}},
                      {{"type", "signal"}, {"signal", "TERM"}},
                      {{"type", "signal"}, {"signal", 9.0}},
                      {{"type", "signal"}, {"signal", Json::parse("18446744073709551615")}}};
  for (const Json& e : bad) EXPECT_FALSE(ParseExecControl(e).ok()) << e.dump();
}

TEST(PortRequestTest, APortFrom1To65535) {
  EXPECT_EQ(ParsePortRequest({{"op", "port"}, {"port", 8000}})->port, 8000);
  EXPECT_EQ(ParsePortRequest({{"port", 65535}})->port, 65535);
  for (const Json& p : {Json(0), Json(65536), Json(-1), Json(80.0), Json("80"), Json(nullptr)}) {
    auto r = ParsePortRequest({{"port", p}});
    ASSERT_FALSE(r.ok()) << p.dump();
    EXPECT_NE(r.status().message().find("port"), std::string::npos);
  }
  EXPECT_FALSE(ParsePortRequest(Json::object()).ok());
}

}  // namespace
}  // namespace trybox::guest
