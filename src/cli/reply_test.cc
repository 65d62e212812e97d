#include "cli/reply.h"

#include <gtest/gtest.h>

#include <sstream>

#include "cli/cli.h"
#include "cli/client.h"
#include "cli/testing.h"

namespace trybox::cli {
namespace {

using testing::Home;

TEST(ReplyViewTest, FieldsAreTypedAndNamedByTheirPath) {
  Json body = {{"vm", {{"id", 5}, {"start", {{"note", "x"}}}, {"n", -3}, {"big", 1ull << 63}}},
               {"list", {{{"a", 1}}, 7}}};
  ReplyView r(body);
  auto vm = r.Object("vm");
  ASSERT_TRUE(vm.ok());
  EXPECT_EQ(vm->String("id").status().message(),
            "malformed reply from tryboxd: 'vm.id' must be a string");
  EXPECT_EQ(vm->Int("id").value(), 5);
  EXPECT_EQ(vm->Object("start")->String("note").value(), "x");
  EXPECT_EQ(vm->Int("n", 0).status().message(),
            "malformed reply from tryboxd: 'vm.n' must be an integer from 0 to "
            "9223372036854775807");
  EXPECT_FALSE(vm->Int("big").ok());  // 2^63 does not fit
  EXPECT_EQ(r.Objects("list").status().message(),
            "malformed reply from tryboxd: 'list[1]' must be an object");
  EXPECT_EQ(r.String("missing").status().message(),
            "malformed reply from tryboxd: 'missing' must be a string");
  EXPECT_EQ(r.StringOr("missing", "d").value(), "d");
  EXPECT_FALSE(vm->StringOr("id", "d").ok());  // present with the wrong type is still wrong
  EXPECT_FALSE(r.OptionalObject("missing").value().has_value());
  EXPECT_EQ(vm->Object("id").status().message(),
            "malformed reply from tryboxd: 'vm.id' must be an object");
  Json lists = {{"ok", {"a", "b"}}, {"bad", {"a", 1}}};
  EXPECT_EQ(ReplyView(lists).Strings("ok").value(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ReplyView(lists).Strings("bad").status().message(),
            "malformed reply from tryboxd: 'bad[1]' must be a string");
}

TEST(ReplyViewTest, StatusFromReplyReadsTypesNotExceptions) {
  EXPECT_TRUE(StatusFromReply({{"ok", true}}).ok());
  EXPECT_EQ(StatusFromReply({{"ok", "yes"}}).message(),
            "malformed reply from tryboxd: 'ok' must be true or false");
  Status st =
      StatusFromReply({{"ok", false}, {"error", {{"code", "NOT_FOUND"}, {"message", "m"}}}});
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_EQ(st.message(), "m");
  EXPECT_EQ(StatusFromReply({{"ok", false}, {"error", {{"code", 5}}}}).message(),
            "malformed reply from tryboxd: 'error.code' must be a string");
  EXPECT_EQ(StatusFromReply({{"ok", false}, {"error", "boom"}}).message(),
            "malformed reply from tryboxd: 'error' must be an object");
  EXPECT_EQ(StatusFromReset({{"reason", 7}}, "the run").message(),
            "malformed reply from tryboxd: 'reason' must be a string");
  EXPECT_EQ(StatusFromReset(Json::object(), "the run").message(),
            "tryboxd aborted the run: no reason given");
}

// One command against a scripted tryboxd on a real unix socket whose every stream gets
// `script`; returns the exit code, with the output and messages.
struct Outcome {
  int code = -1;
  std::string out, err;
};
Outcome RunAgainst(std::vector<std::string> args, testing::ScriptedDaemon::Script script) {
  Home home;
  auto daemon = testing::ScriptedDaemon::Start(home.paths, std::move(script));
  EXPECT_TRUE(daemon.ok()) << daemon.status().ToString();
  auto client = Client::Connect(home.paths, /*autostart=*/false);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  args.insert(args.begin(), "trybox");
  auto inv = Parse(args);
  EXPECT_TRUE(inv.ok()) << inv.status().ToString();
  Outcome o;
  if (!daemon.ok() || !client.ok() || !inv.ok()) return o;
  std::ostringstream out, err;
  o.code = RunWithClient(**client, *inv, out, err);
  o.out = out.str();
  o.err = err.str();
  return o;
}

testing::ScriptedDaemon::Script EndWith(Json body) {
  return [body](std::shared_ptr<channel::Stream> s, const Json&) { (void)s->End(body); };
}

Json With(Json j, const Json& patch) {
  j.update(patch);
  return j;
}

struct MalformedCase {
  std::vector<std::string> args;
  Json end;           // the END every stream gets
  std::string field;  // the field the message must name
};

// Before, each of these threw nlohmann::json::type_error out of the CLI: exit 134, a core.
TEST(MalformedReplyTest, EveryCommandExits125NamingTheField) {
  Json vm = {{"id", "vm1"},       {"image", "debian-12"}, {"state", "running"}, {"accel", "tcg"},
             {"memory_mib", 512}, {"created_at", 1.7e9},  {"note", ""}};
  Json row = {{"id", 1},          {"vm", "vm1"},       {"started_at", 1.7e9}, {"ended_at", 1.7e9},
              {"host", "x.test"}, {"port", "443"},     {"address", ""},       {"verdict", "allow"},
              {"reason", ""},     {"override", false}, {"status", 200},       {"bytes_up", 1},
              {"bytes_down", 2},  {"duration_ms", 3}};
  Json collect = {
      {"vm", "vm1"},
      {"outcome", "ok"},
      {"counts",
       {{"added", "1"}, {"modified", 0}, {"deleted", 0}, {"renamed", 0}, {"mode_changed", 0}}},
      {"changes", Json::array()},
      {"commit", ""},
      {"branch", ""},
      {"note", ""}};
  Json change_collect = collect;
  change_collect["counts"]["added"] = 1;
  change_collect["changes"] = {{{"change", "added"}, {"path", "a"}, {"new_size", "big"}}};
  std::vector<MalformedCase> cases = {
      {{"create"}, {{"ok", true}, {"vm", {{"id", 5}}}}, "vm.id"},
      {{"create"}, {{"ok", true}, {"vm", "vm1"}}, "vm"},
      {{"create"}, {{"ok", true}, {"vm", {{"id", "../x"}}}}, "vm.id"},
      {{"create"},
       {{"ok", true}, {"vm", {{"id", "v"}, {"start", {{"note", 1}}}}}},
       "vm.start.note"},
      {{"ls"}, {{"ok", true}, {"vms", {With(vm, {{"image", 3}})}}}, "vms[0].image"},
      {{"ls"}, {{"ok", true}, {"vms", {With(vm, {{"created_at", "now"}})}}}, "vms[0].created_at"},
      {{"ls"}, {{"ok", true}, {"vms", {With(vm, {{"privileged", "yes"}})}}}, "vms[0].privileged"},
      {{"ls", "--json"}, {{"ok", true}, {"vms", "none"}}, "vms"},
      {{"rm", "vm1"}, {{"ok", true}, {"report", {{"process_gone", "yes"}}}}, "report.process_gone"},
      {{"doctor"}, {{"ok", true}, {"accel", {{"accel", 1}, {"reason", "r"}}}}, "accel.accel"},
      {{"audit"}, {{"ok", true}, {"egress", {row}}}, "egress[0].port"},
      {{"audit", "--json"}, {{"ok", true}, {"egress", {1, 2}}}, "egress[0]"},
      {{"audit"},
       {{"ok", true}, {"egress", Json::array()}, {"next_before_id", "x"}},
       "next_before_id"},
      {{"collect", "vm1"}, {{"ok", true}, {"collect", collect}}, "collect.counts.added"},
      {{"collect", "vm1", "--json"}, {{"ok", true}, {"collect", 3}}, "collect"},
      {{"diff", "vm1"}, {{"ok", true}, {"collect", change_collect}}, "collect.changes[0].new_size"},
      {{"diff", "vm1"},
       {{"ok", true}, {"collect", With(collect, {{"changes_total", -1}})}},
       "collect.changes_total"},
      {{"exec", "vm1", "--", "true"},
       {{"ok", true}, {"result", {{"outcome", "exited"}, {"exit_code", "0"}}}},
       "result.exit_code"},
      {{"exec", "vm1", "--", "true"},
       {{"ok", true}, {"result", {{"outcome", "exited"}, {"exit_code", 4096}}}},
       "result.exit_code"},
      {{"exec", "vm1", "--", "true"}, {{"ok", true}, {"result", "exited"}}, "result"},
      {{"agent", "show", "r1"}, {{"ok", true}, {"report", "DONE"}}, "report"},
      {{"agent", "show", "r1"},
       {{"ok", true}, {"report", {{"outcome", "DONE"}}}, {"text", 5}},
       "text"},
      {{"ls"}, {{"ok", "true"}}, "ok"},
      {{"ls"},
       {{"ok", false}, {"error", {{"code", "NOT_FOUND"}, {"message", 404}}}},
       "error.message"},
  };
  for (const auto& c : cases) {
    std::string what = ::testing::PrintToString(c.args) + " <- " + c.end.dump();
    Outcome o = RunAgainst(c.args, EndWith(c.end));
    EXPECT_EQ(o.code, 125) << what << "\n" << o.err;
    EXPECT_NE(o.err.find("malformed reply from tryboxd: '" + c.field + "'"), std::string::npos)
        << what << "\n"
        << o.err;
    EXPECT_EQ(o.out, "") << what << ": printed before it was validated";
  }
}

TEST(MalformedReplyTest, ResetsAndEventsOfTheWrongShapeAreErrorsToo) {
  Outcome o = RunAgainst({"exec", "vm1", "--", "true"},
                         [](std::shared_ptr<channel::Stream> s, const Json&) {
                           (void)s->Reset("x");  // a reason is a string: fine
                         });
  EXPECT_EQ(o.code, 125);
  EXPECT_NE(o.err.find("tryboxd aborted the exec: x"), std::string::npos) << o.err;
  o = RunAgainst({"agent", "show", "r1"}, [](std::shared_ptr<channel::Stream> s, const Json&) {
    (void)s->SendEvent({{"run", 42}});
    (void)s->Next();  // the client resets the stream
  });
  EXPECT_EQ(o.code, 125);
  EXPECT_NE(o.err.find("malformed reply from tryboxd: 'run' must be a string"), std::string::npos)
      << o.err;
  o = RunAgainst({"cp", "vm1:/f", "/tmp/never-written-by-reply-test"},
                 [](std::shared_ptr<channel::Stream> s, const Json&) {
                   (void)s->SendEvent({{"type", "meta"}, {"kind", "file"}, {"mode", "0755"}});
                   (void)s->Next();
                 });
  EXPECT_EQ(o.code, 125);
  EXPECT_NE(o.err.find("malformed reply from tryboxd: 'mode'"), std::string::npos) << o.err;
}

TEST(MalformedReplyTest, WellFormedRepliesStillPrint) {
  Json vm = {{"id", "vm1"},       {"image", "debian-12"}, {"state", "running"}, {"accel", "tcg"},
             {"memory_mib", 512}, {"created_at", 0},      {"note", "hi"}};
  Outcome o = RunAgainst({"ls"}, EndWith({{"ok", true}, {"vms", {vm}}}));
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("vm1"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("512M"), std::string::npos) << o.out;
  // Issue 41.5: the PRIVILEGED column: yes, no, or ? for a record from before it was kept.
  EXPECT_NE(o.out.find(" running  ?          tcg"), std::string::npos) << o.out;
  Json priv = vm;
  priv["privileged"] = true;
  o = RunAgainst({"ls"}, EndWith({{"ok", true}, {"vms", {priv}}}));
  EXPECT_NE(o.out.find(" running  yes        tcg"), std::string::npos) << o.out;
  o = RunAgainst({"exec", "vm1", "--", "true"},
                 EndWith({{"ok", true}, {"result", {{"outcome", "exited"}, {"exit_code", 3}}}}));
  EXPECT_EQ(o.code, 3) << o.err;
}

// The real binary against the scripted daemon: before, `trybox ls` died of an uncaught
// nlohmann::json::type_error (SIGABRT, exit 134).
TEST(MalformedReplyTest, TheTryboxBinaryExits125InsteadOfAborting) {
  Home home;
  auto daemon = testing::ScriptedDaemon::Start(
      home.paths, EndWith({{"ok", true}, {"vms", {{{"id", 5}, {"image", "debian-12"}}}}}));
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  auto r = testing::RunTryboxBinary(home, {"ls"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::string& text = r->err;
  EXPECT_TRUE(r->exit.exited) << r->exit.Describe() << "\n" << text;
  EXPECT_EQ(r->exit.code, 125) << text;
  EXPECT_NE(text.find("malformed reply from tryboxd: 'vms[0].id' must be a string"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace trybox::cli
