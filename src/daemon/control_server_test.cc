// The control socket with its verb table, over a real unix socket: wrong-typed and
// malformed requests are answered and the daemon keeps serving; a handler that throws costs
// only its request; an ephemeral VM's owner connection closing is reported once.
#include "daemon/control_server.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "util/fd.h"

namespace trybox::daemon {
namespace {

using channel::Stream;
using Kind = Stream::Message::Kind;

class ControlServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::Make(::testing::TempDir(), "ctl");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(*dir));
    verbs_.AddUnary("ping", [](const Json&, Connection&) { return Json{{"ok", true}}; });
    verbs_.AddUnary("boom", [](const Json& j, Connection&) -> Json {
      // A handler bug: reads a field with the wrong type.
      return {{"ok", true}, {"n", j.at("n").get<int>()}};
    });
    verbs_.AddUnary("keep", [](const Json&, Connection& c) {
      return Json{{"ok", c.AddEphemeral("vm-1")}};
    });
    server_ = std::make_unique<ControlServer>(
        verbs_, [this](const std::string& id) { closed_.set_value(id); });
    ASSERT_TRUE(server_->Listen(dir_->path() + "/s").ok());
    serving_ = std::thread([this] { (void)server_->Serve(); });
  }
  void TearDown() override {
    server_->Stop();
    serving_.join();
  }
  std::unique_ptr<channel::Mux> Connect() {
    auto fd = ConnectUnix(dir_->path() + "/s");
    EXPECT_TRUE(fd.ok());
    auto mux = std::make_unique<channel::Mux>(std::move(*fd), channel::Role::kHost);
    mux->Start();
    return mux;
  }
  static Json Call(channel::Mux& mux, const Json& req) {
    auto s = mux.Open(req);
    EXPECT_TRUE(s.ok());
    auto m = (*s)->Next();
    EXPECT_TRUE(m.ok());
    return m.ok() ? m->body : Json();
  }

  std::optional<TempDir> dir_;
  VerbTable verbs_;
  std::unique_ptr<ControlServer> server_;
  std::thread serving_;
  std::promise<std::string> closed_;
};

TEST_F(ControlServerTest, WrongTypedRequestsAreAnsweredAndTheDaemonKeepsServing) {
  auto mux = Connect();
  // {"verb":1} killed tryboxd.
  for (const Json& req : {Json{{"verb", 1}}, Json{{"verb", nullptr}}, Json{{"verb", {1, 2}}},
                          Json{{"nothing", true}}, Json{{"verb", "no-such-verb"}}}) {
    Json r = Call(*mux, req);
    EXPECT_EQ(r["ok"], false) << req.dump();
    EXPECT_EQ(r["error"]["code"], "INVALID_ARGUMENT") << r.dump();
  }
  Json unknown = Call(*mux, {{"verb", "no-such-verb"}});
  EXPECT_NE(unknown["error"]["message"].get<std::string>().find("ping, boom"), std::string::npos);
  EXPECT_EQ(Call(*mux, {{"verb", "ping"}})["ok"], true);
}

TEST_F(ControlServerTest, AHandlerThatThrowsFailsOnlyItsRequest) {
  auto mux = Connect();
  Json r = Call(*mux, {{"verb", "boom"}, {"n", "not a number"}});
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(r["error"]["code"], "INTERNAL");
  EXPECT_EQ(Call(*mux, {{"verb", "ping"}})["ok"], true);
  // And another connection is served all along.
  auto other = Connect();
  EXPECT_EQ(Call(*other, {{"verb", "ping"}})["ok"], true);
}

TEST_F(ControlServerTest, ANonObjectOpenIsRefusedByTheChannelAndTheConnectionLives) {
  auto mux = Connect();
  auto s = mux->Open(Json::array({1, 2}));
  ASSERT_TRUE(s.ok());
  auto m = (*s)->Next();
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kind, Kind::kReset);
  EXPECT_EQ(Call(*mux, {{"verb", "ping"}})["ok"], true);
}

TEST_F(ControlServerTest, EphemeralVmsOfAClosedConnectionAreHandedBackOnce) {
  {
    auto mux = Connect();
    EXPECT_EQ(Call(*mux, {{"verb", "keep"}})["ok"], true);
  }
  // The connection's end is noticed on the server's side, then the callback runs.
  EXPECT_EQ(closed_.get_future().get(), "vm-1");
}

}  // namespace
}  // namespace trybox::daemon
