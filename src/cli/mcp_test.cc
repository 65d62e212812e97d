#include "cli/mcp.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "channel/mux.h"
#include "cli/cli.h"
#include "cli/testing.h"
#include "util/fd.h"
#include "util/socket.h"

namespace trybox::cli {
namespace {

using Json = nlohmann::json;
using Kind = channel::Stream::Message::Kind;

constexpr const char* kSecret = "sk-test-never-print-me-4711";

using testing::Home;

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) {
    auto it = vars.find(name);
    return it == vars.end() ? std::string() : it->second;
  };
}

EnvLookup ModelEnv() {
  return FakeEnv({{"ANTHROPIC_API_KEY", kSecret}, {"ANTHROPIC_MODEL", "claude-test"}});
}

// RunMcpServer on one end of a real socketpair, on its own thread; the test is the client.
class Session {
 public:
  explicit Session(McpOptions options) : options_(std::move(options)) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    client_.Reset(sv[0]);
    server_end_.Reset(sv[1]);
    server_ = std::async(std::launch::async, [this] {
      return RunMcpServer(options_, server_end_.get(), server_end_.get());
    });
  }
  ~Session() { CloseInput(); }  // server_'s destructor waits for the server to stop

  void SendRaw(std::string_view bytes) { ASSERT_TRUE(WriteFull(client_.get(), bytes).ok()); }
  void Send(const Json& message) { SendRaw(message.dump() + "\n"); }
  void Request(int id, const std::string& method, Json params = Json::object()) {
    Send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}});
  }

  // The next line from the server, parsed; null at EOF. Fails the test rather than hang.
  Json Read() {
    for (;;) {
      size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        Json j = Json::parse(line, nullptr, false);
        EXPECT_FALSE(j.is_discarded()) << "server wrote a line that is not JSON: " << line;
        all_output_ += line + "\n";
        return j;
      }
      pollfd p{client_.get(), POLLIN, 0};
      if (::poll(&p, 1, 30000) != 1) {
        ADD_FAILURE() << "no answer from the server within 30 s";
        return nullptr;
      }
      char buf[65536];
      auto n = ReadSome(client_.get(), buf, sizeof buf);
      if (!n.ok() || *n == 0) return nullptr;
      buffer_.append(buf, *n);
    }
  }
  // Reads lines until the response with `id`, keeping the notifications read on the way.
  Json ReadResponse(const Json& id, std::vector<Json>* notifications = nullptr) {
    for (;;) {
      Json j = Read();
      if (j.is_null() || (j.contains("id") && j["id"] == id)) return j;
      if (notifications && j.contains("method")) notifications->push_back(j);
    }
  }
  Json Call(int id, const std::string& method, Json params = Json::object()) {
    Request(id, method, std::move(params));
    return ReadResponse(id);
  }
  Json Initialize(const std::string& version = "2025-11-25") {
    Json r = Call(0, "initialize",
                  {{"protocolVersion", version},
                   {"capabilities", Json::object()},
                   {"clientInfo", {{"name", "mcp_test"}, {"version", "1"}}}});
    Send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
    return r;
  }

  void CloseInput() { ::shutdown(client_.get(), SHUT_WR); }
  // The server's return code, once it has stopped. Then closes the server's end, so that
  // Read() returns what is left and then null.
  int Wait() {
    EXPECT_EQ(server_.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    int code = server_.get();
    server_end_.Reset();
    return code;
  }
  // Everything read so far, for checks that something never appeared.
  const std::string& all_output() const { return all_output_; }

 private:
  McpOptions options_;
  UniqueFd client_, server_end_;
  std::future<int> server_;
  std::string buffer_;
  std::string all_output_;
};

// agent.json names debian-12, which has no recipe: a call without an image never starts a
// first-use build of the default developer image here (ImageFromAgentJson... tests that).
McpOptions Options(const Home& home, EnvLookup env) {
  EXPECT_TRUE(MakeDirs(home.paths.config).ok());
  EXPECT_TRUE(WriteFileAtomic(home.paths.config + "/agent.json", R"({"image": "debian-12"})").ok());
  McpOptions o;
  o.paths = home.paths;
  o.env = std::move(env);
  o.autostart = false;
  return o;
}

Json ToolCall(Json arguments, Json progress_token = nullptr) {
  Json p = {{"name", "vm_agent"}, {"arguments", std::move(arguments)}};
  if (!progress_token.is_null()) p["_meta"] = {{"progressToken", progress_token}};
  return p;
}

std::string ResultText(const Json& response) {
  return response["result"]["content"][0]["text"].get<std::string>();
}

// The real daemon's agent verbs drive a model API, which cannot run here: a scripted one
// answers instead, over the real protocol.
std::unique_ptr<testing::ScriptedDaemon> StartDaemon(const Home& home,
                                                     testing::ScriptedDaemon::Script script) {
  auto d = testing::ScriptedDaemon::Start(home.paths, std::move(script));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(*d) : nullptr;
}

Json Progress(int turn, int max_turns, const std::string& message) {
  return {{"progress",
           {{"run", "r1"}, {"turn", turn}, {"max_turns", max_turns}, {"message", message}}}};
}

Json DoneReport() {
  return {{"run", "r1"},
          {"outcome", "DONE"},
          {"verdict", "VERIFIED"},
          {"summary", "made the tests pass"}};
}

TEST(McpTest, InitializeAnswersTheRequestedVersionItSupports) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  Json r = s.Initialize("2025-06-18");
  ASSERT_TRUE(r.contains("result")) << r.dump();
  EXPECT_EQ(r["result"]["protocolVersion"], "2025-06-18");
  EXPECT_EQ(r["result"]["serverInfo"]["name"], "trybox");
  EXPECT_TRUE(r["result"]["serverInfo"]["version"].is_string());
  EXPECT_TRUE(r["result"]["capabilities"]["tools"].is_object());
}

TEST(McpTest, InitializeAnswersItsLatestVersionForAnUnknownOne) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  Json r = s.Initialize("2099-01-01");
  EXPECT_EQ(r["result"]["protocolVersion"], "2025-11-25");
}

TEST(McpTest, InitializeWithoutProtocolVersionIsInvalidParams) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  Json r = s.Call(1, "initialize", {{"capabilities", Json::object()}});
  EXPECT_EQ(r["error"]["code"], -32602);
}

TEST(McpTest, ToolsListDescribesVmAgent) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  Json r = s.Call(1, "tools/list");
  ASSERT_EQ(r["result"]["tools"].size(), 7u) << r.dump();
  const Json& tool = r["result"]["tools"][0];
  EXPECT_EQ(tool["name"], "vm_agent");
  const Json& in = tool["inputSchema"];
  EXPECT_EQ(in["type"], "object");
  for (const char* p : {"task", "image", "workspace", "verify", "allow", "internet", "secrets",
                        "http_rules", "run_id", "answer"}) {
    EXPECT_TRUE(in["properties"].contains(p)) << p;
    EXPECT_FALSE(in["properties"][p].value("description", "").empty()) << p;
  }
  EXPECT_EQ(in["properties"]["allow"]["type"], "array");
  EXPECT_EQ(in["properties"]["internet"]["type"], "boolean");
  EXPECT_EQ(in["additionalProperties"], false);
  std::string d = tool["description"];
  for (const char* word : {"DONE", "NEEDS_INPUT", "IN_PROGRESS", "ERROR", "VERIFIED", "summary"}) {
    EXPECT_NE(d.find(word), std::string::npos) << word;
  }
  EXPECT_EQ(tool["outputSchema"]["type"], "object");
  // A network request is said to be a person's to grant, and its shape is declared.
  EXPECT_NE(d.find("only a person can grant it"), std::string::npos) << d;
  EXPECT_EQ(tool["outputSchema"]["properties"]["approval"]["properties"]["host"]["type"], "string");
}

TEST(McpTest, ClientsBefore20250618GetNoOutputSchema) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  s.Initialize("2025-03-26");
  Json r = s.Call(1, "tools/list");
  for (const auto& tool : r["result"]["tools"]) {
    EXPECT_FALSE(tool.contains("outputSchema")) << tool["name"];
  }
}

TEST(McpTest, PingAnswersAnEmptyResult) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  Json r = s.Call(5, "ping");
  EXPECT_EQ(r, Json({{"jsonrpc", "2.0"}, {"id", 5}, {"result", Json::object()}}));
}

TEST(McpTest, UnknownMethodIsMethodNotFound) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  s.Send({{"jsonrpc", "2.0"}, {"id", "a"}, {"method", "resources/list"}});
  Json r = s.ReadResponse("a");
  EXPECT_EQ(r["error"]["code"], -32601);
}

TEST(McpTest, MalformedLinesGetErrorsAndTheServerGoesOn) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  s.SendRaw("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\n");  // cut short
  Json r = s.Read();
  EXPECT_EQ(r["error"]["code"], -32700);
  EXPECT_TRUE(r["id"].is_null());
  s.SendRaw("\xff\xfe not utf-8\n");
  EXPECT_EQ(s.Read()["error"]["code"], -32700);
  s.SendRaw("42\n");
  EXPECT_EQ(s.Read()["error"]["code"], -32600);
  s.Send({{"jsonrpc", "2.0"}, {"id", {{"x", 1}}}, {"method", "ping"}});  // id not string/int
  EXPECT_EQ(s.Read()["error"]["code"], -32600);
  s.Send({{"id", 3}, {"method", "ping"}});  // no jsonrpc
  r = s.Read();
  EXPECT_EQ(r["error"]["code"], -32600);
  EXPECT_EQ(r["id"], 3);
  s.Send({{"jsonrpc", "2.0"}, {"id", 4}, {"method", "ping"}, {"params", {1, 2}}});
  EXPECT_EQ(s.Read()["error"]["code"], -32602);
  EXPECT_EQ(s.Call(9, "ping")["result"], Json::object());
}

TEST(McpTest, BatchesAreRefusedWithOneError) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  s.SendRaw(R"([{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}])"
            "\n");
  Json r = s.Read();
  EXPECT_EQ(r["error"]["code"], -32600);
  EXPECT_TRUE(r["id"].is_null());
  EXPECT_EQ(s.Call(3, "ping")["id"], 3);  // nothing else was queued before this answer
}

TEST(McpTest, NotificationsAndResponsesGetNoAnswer) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  s.Send({{"jsonrpc", "2.0"}, {"method", "notifications/whatever"}});
  s.Send(
      {{"jsonrpc", "2.0"}, {"method", "notifications/cancelled"}, {"params", {{"requestId", 77}}}});
  s.Send({{"jsonrpc", "2.0"}, {"id", 12}, {"result", Json::object()}});
  s.SendRaw("\n   \n");
  s.Request(1, "ping");
  EXPECT_EQ(s.Read()["id"], 1);  // the first line written answers the ping
}

TEST(McpTest, OversizedLineIsRefusedAndTheNextOneServed) {
  Home home;
  McpOptions o = Options(home, FakeEnv({}));
  o.max_line_bytes = 1000;
  Session s(std::move(o));
  std::string huge = R"({"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":")" +
                     std::string(200000, 'x') + "\"}}\n";
  s.SendRaw(huge);
  Json r = s.Read();
  EXPECT_EQ(r["error"]["code"], -32600);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("1000 bytes"), std::string::npos);
  EXPECT_EQ(s.Call(2, "ping")["id"], 2);
}

TEST(McpTest, DeeplyNestedJsonDoesNotCrashTheServer) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  const size_t depth = 200000;
  s.SendRaw(std::string(depth, '[') + std::string(depth, ']') + "\n");
  EXPECT_EQ(s.Read()["error"]["code"], -32600);
  s.SendRaw(std::string(depth, '[') + "\n");
  EXPECT_EQ(s.Read()["error"]["code"], -32700);
  EXPECT_EQ(s.Call(2, "ping")["id"], 2);
}

TEST(McpTest, ToolCallProtocolErrorsAreJsonRpcErrors) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  EXPECT_EQ(s.Call(1, "tools/call", {{"name", "rm_rf"}})["error"]["code"], -32602);
  EXPECT_EQ(s.Call(2, "tools/call", {{"arguments", Json::object()}})["error"]["code"], -32602);
  EXPECT_EQ(s.Call(3, "tools/call", {{"name", "vm_agent"}, {"arguments", "task"}})["error"]["code"],
            -32602);
}

// MCP 2025-11-25: invalid tool arguments are tool execution errors the model can correct,
// not protocol errors.
TEST(McpTest, ArgumentMistakesAreToolErrorsNamingThem) {
  Home home;
  Session s(Options(home, ModelEnv()));
  s.Initialize();
  struct Case {
    Json args;
    std::string says;
  };
  std::vector<Case> cases = {
      {Json::object(), "task"},
      {{{"task", "x"}, {"run_id", "r1"}}, "not both"},
      {{{"task", "x"}, {"answer", "yes"}}, "answer needs run_id"},
      {{{"run_id", "r1"}, {"workspace", "/tmp"}}, "workspace goes with task"},
      {{{"task", "x"}, {"workspace", "relative/dir"}}, "absolute"},
      {{{"task", "x"}, {"allow", {"10.0.0.1"}}}, "allow"},
      {{{"task", "x"}, {"allow", "pypi.org"}}, "array"},
      {{{"task", "x"}, {"image", "../etc"}}, "image name"},
      {{{"task", "x"}, {"colour", "blue"}}, "unknown argument 'colour'"},
      {{{"task", "x"}, {"secrets", {"GH=env:GH@api.github.com"}}}, "never a source or a value"},
      {{{"task", "x"}, {"secrets", "GH"}}, "array"},
      {{{"run_id", "r1"}, {"secrets", {"GH"}}}, "secrets goes with task"},
      {{{"task", "x"}, {"http_rules", {"allow get a.test"}}}, "http_rules: method"},
      {{{"task", "x"}, {"http_rules", "allow GET a.test"}}, "array"},
      {{{"run_id", "r1"}, {"http_rules", {"allow GET a.test"}}}, "http_rules goes with task"},
      {{{"task", "x"}, {"internet", "yes"}}, "internet must be true or false"},
      {{{"run_id", "r1"}, {"internet", true}}, "internet goes with task"},
      {{{"task", 5}}, "task must be a string"},
  };
  int id = 10;
  for (const auto& c : cases) {
    Json r = s.Call(id++, "tools/call", ToolCall(c.args));
    ASSERT_TRUE(r.contains("result")) << c.args.dump() << " -> " << r.dump();
    EXPECT_EQ(r["result"]["isError"], true) << c.args.dump();
    EXPECT_NE(ResultText(r).find(c.says), std::string::npos) << ResultText(r);
  }
}

TEST(McpTest, CallWithoutAModelIsAToolErrorNamingTheVariables) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  Json r = s.Call(1, "tools/call", ToolCall({{"task", "say hi"}}));
  ASSERT_TRUE(r.contains("result")) << r.dump();
  EXPECT_EQ(r["result"]["isError"], true);
  EXPECT_NE(ResultText(r).find("ANTHROPIC_API_KEY"), std::string::npos) << ResultText(r);
  EXPECT_NE(ResultText(r).find("OPENAI_BASE_URL"), std::string::npos) << ResultText(r);
}

// Without an image argument the call boots agent.json's image, as `trybox agent` does; an
// image of the default developer recipe that is not built yet is built first, and its
// failure is the tool's error (here: no daemon to build it with), with no agent request.
TEST(McpTest, ImageFromAgentJsonAndTheDefaultIsBuiltOnFirstUse) {
  Home home;
  auto daemon = StartDaemon(home, [](std::shared_ptr<channel::Stream> st, const Json&) {
    (void)st->End({{"ok", true}, {"report", DoneReport()}, {"text", "DONE (VERIFIED)\nrun r1"}});
  });
  ASSERT_NE(daemon, nullptr);
  {
    Session s(Options(home, ModelEnv()));
    s.Initialize();
    Json r = s.Call(1, "tools/call", ToolCall({{"task", "x"}}));
    EXPECT_EQ(r["result"]["isError"], false) << r.dump();
  }
  auto reqs = daemon->requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0]["image"], "debian-12");
  EXPECT_EQ(reqs[0]["internet"], false);
  // agent.json's "internet" is the default; the argument wins over it.
  {
    McpOptions o = Options(home, ModelEnv());  // (writes its own agent.json first)
    ASSERT_TRUE(WriteFileAtomic(home.paths.config + "/agent.json",
                                R"({"image": "debian-12", "internet": true})")
                    .ok());
    Session s(std::move(o));
    s.Initialize();
    EXPECT_EQ(s.Call(1, "tools/call", ToolCall({{"task", "x"}}))["result"]["isError"], false);
    EXPECT_EQ(s.Call(2, "tools/call",
                     ToolCall({{"task", "x"}, {"internet", false}}))["result"]["isError"],
              false);
  }
  reqs = daemon->requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[1]["internet"], true);
  EXPECT_EQ(reqs[2]["internet"], false);

  McpOptions o = Options(home, ModelEnv());
  ASSERT_TRUE(WriteFileAtomic(home.paths.config + "/agent.json", "{}").ok());
  Session s(std::move(o));
  s.Initialize();
  Json r = s.Call(2, "tools/call", ToolCall({{"task", "x"}}));
  EXPECT_EQ(r["result"]["isError"], true) << r.dump();
  EXPECT_NE(ResultText(r).find("building debian-12-dev"), std::string::npos) << ResultText(r);
  EXPECT_EQ(daemon->requests().size(), 3u);  // no further agent request
}

// Decision: the server never starts a daemon when options.autostart is off (the unit tests
// must not spawn tryboxd); `trybox mcp` starts one like every other command. Either way an
// unreachable daemon is a tool error naming the socket, and the key is never echoed.
TEST(McpTest, CallWithNoDaemonIsAToolErrorNamingTheSocket) {
  Home home;
  Session s(Options(home, ModelEnv()));
  s.Initialize();
  Json r = s.Call(1, "tools/call", ToolCall({{"task", "say hi"}}));
  ASSERT_TRUE(r.contains("result")) << r.dump();
  EXPECT_EQ(r["result"]["isError"], true);
  EXPECT_NE(ResultText(r).find("cannot reach tryboxd"), std::string::npos) << ResultText(r);
  EXPECT_NE(ResultText(r).find(home.paths.socket()), std::string::npos) << ResultText(r);
  EXPECT_EQ(s.all_output().find(kSecret), std::string::npos);
}

TEST(McpTest, DoneRunBecomesTextAndStructuredContentWithProgress) {
  Home home;
  auto daemon = StartDaemon(home, [](std::shared_ptr<channel::Stream> st, const Json&) {
    (void)st->SendEvent({{"run", "r1"}});
    (void)st->SendEvent(Progress(1, 3, "reading the code"));
    (void)st->SendEvent(Progress(1, 3, "running make"));
    (void)st->SendEvent(Progress(2, 3, "fixing the test"));
    (void)st->End({{"ok", true}, {"report", DoneReport()}, {"text", "DONE (VERIFIED)\nrun r1"}});
  });
  Session s(Options(home, ModelEnv()));
  s.Initialize();
  s.Request(1, "tools/call",
            ToolCall({{"task", "make the tests pass"},
                      {"workspace", "/srv/proj"},
                      {"verify", "make test"},
                      {"allow", {"pypi.org", "*.pythonhosted.org"}},
                      {"image", "debian-12"}},
                     "tok"));
  std::vector<Json> notes;
  Json r = s.ReadResponse(1, &notes);
  ASSERT_TRUE(r.contains("result")) << r.dump();
  EXPECT_EQ(r["result"]["isError"], false);
  EXPECT_EQ(ResultText(r), "DONE (VERIFIED)\nrun r1");
  EXPECT_EQ(r["result"]["structuredContent"], DoneReport());

  ASSERT_EQ(notes.size(), 3u);
  std::vector<double> values;
  for (const auto& n : notes) {
    EXPECT_EQ(n["method"], "notifications/progress");
    EXPECT_EQ(n["params"]["progressToken"], "tok");
    EXPECT_EQ(n["params"]["total"], 3);
    values.push_back(n["params"]["progress"].get<double>());
  }
  EXPECT_EQ(values[0], 1);
  EXPECT_GT(values[1], values[0]);  // strictly increasing although the turn repeated
  EXPECT_LT(values[1], 2);
  EXPECT_EQ(values[2], 2);
  EXPECT_EQ(notes[1]["params"]["message"], "running make");

  auto reqs = daemon->requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0]["verb"], "agent");
  EXPECT_EQ(reqs[0]["task"], "make the tests pass");
  EXPECT_EQ(reqs[0]["workspace"], "/srv/proj");
  EXPECT_EQ(reqs[0]["verify"], "make test");
  EXPECT_EQ(reqs[0]["allow"], Json({"pypi.org", "*.pythonhosted.org"}));
  EXPECT_EQ(reqs[0]["internet"], false);  // neither asked for nor in agent.json
  EXPECT_EQ(reqs[0]["image"], "debian-12");
  EXPECT_EQ(reqs[0]["model"]["provider"], "anthropic");
  EXPECT_EQ(reqs[0]["model"]["api_key"], kSecret);  // to the daemon, and nowhere else
  EXPECT_EQ(s.all_output().find(kSecret), std::string::npos);
}

TEST(McpTest, AnswerAndResumeContinueARun) {
  Home home;
  auto daemon = StartDaemon(home, [](std::shared_ptr<channel::Stream> st, const Json&) {
    Json report = {{"run", "r1"},
                   {"outcome", "NEEDS_INPUT"},
                   {"question", {{"text", "which branch?"}, {"truncated", false}}}};
    (void)st->End({{"ok", true}, {"report", report}, {"text", "NEEDS_INPUT: which branch?"}});
  });
  Session s(Options(home, FakeEnv({})));  // no model configured: the run keeps its own
  s.Initialize();
  Json r = s.Call(1, "tools/call", ToolCall({{"run_id", "r1"}, {"answer", "main"}}));
  EXPECT_EQ(r["result"]["isError"], false) << r.dump();
  EXPECT_EQ(r["result"]["structuredContent"]["question"]["text"], "which branch?");
  r = s.Call(2, "tools/call", ToolCall({{"run_id", "r1"}}));
  EXPECT_EQ(r["result"]["isError"], false) << r.dump();
  auto reqs = daemon->requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0], Json({{"verb", "agent_answer"}, {"run", "r1"}, {"answer", "main"}}));
  EXPECT_EQ(reqs[1], Json({{"verb", "agent_resume"}, {"run", "r1"}}));
}

TEST(McpTest, ErrorOutcomeAndDaemonRefusalAreToolErrors) {
  Home home;
  auto daemon = StartDaemon(home, [](std::shared_ptr<channel::Stream> st, const Json& req) {
    if (req["verb"] == "agent_resume") {
      (void)st->End({{"ok", false}, {"error", {{"code", "NOT_FOUND"}, {"message", "no run r9"}}}});
      return;
    }
    Json report = {{"run", "r1"}, {"outcome", "ERROR"}, {"error", "model API refused"}};
    (void)st->End({{"ok", true}, {"report", report}, {"text", "ERROR: model API refused"}});
  });
  Session s(Options(home, ModelEnv()));
  s.Initialize();
  Json r = s.Call(1, "tools/call", ToolCall({{"task", "x"}}));
  EXPECT_EQ(r["result"]["isError"], true) << r.dump();
  EXPECT_EQ(ResultText(r), "ERROR: model API refused");
  EXPECT_EQ(r["result"]["structuredContent"]["outcome"], "ERROR");
  r = s.Call(2, "tools/call", ToolCall({{"run_id", "r9"}}));
  EXPECT_EQ(r["result"]["isError"], true) << r.dump();
  EXPECT_EQ(ResultText(r), "no run r9");
  EXPECT_FALSE(r["result"].contains("structuredContent"));
}

// A script that announces its run and then waits for the client to reset the stream,
// reporting the reason it was given.
struct WaitForReset {
  std::shared_ptr<std::promise<std::string>> reset = std::make_shared<std::promise<std::string>>();
  void operator()(std::shared_ptr<channel::Stream> st, const Json&) const {
    (void)st->SendEvent({{"run", "r1"}});
    (void)st->SendEvent(Progress(1, 5, "working"));
    auto m = st->Next();
    reset->set_value(m.ok() && m->kind == Kind::kReset ? m->body.value("reason", "") : "no reset");
  }
};

TEST(McpTest, CancelledCallResetsItsDaemonStreamAndGetsNoResponse) {
  Home home;
  WaitForReset script;
  auto reset = script.reset->get_future();
  auto daemon = StartDaemon(home, script);
  Session s(Options(home, ModelEnv()));
  s.Initialize();
  s.Request(7, "tools/call", ToolCall({{"task", "long"}}, 70));
  Json note = s.Read();  // the call is running once its progress arrives
  EXPECT_EQ(note["method"], "notifications/progress");
  s.Send({{"jsonrpc", "2.0"},
          {"method", "notifications/cancelled"},
          {"params", {{"requestId", 7}, {"reason", "user pressed stop"}}}});
  ASSERT_EQ(reset.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_NE(reset.get().find("user pressed stop"), std::string::npos);
  EXPECT_EQ(s.Call(8, "ping")["id"], 8);
  s.CloseInput();
  EXPECT_EQ(s.Wait(), 0);
  for (Json j = s.Read(); !j.is_null(); j = s.Read()) {
    EXPECT_NE(j.value("id", Json()), 7) << "a cancelled call was answered: " << j.dump();
  }
}

// End of input is the client shutting down: runs stop, but unlike a cancellation each call
// is still answered, for whoever reads the rest of the output.
TEST(McpTest, EofWithACallInFlightResetsItAndAnswersIt) {
  Home home;
  WaitForReset script;
  auto reset = script.reset->get_future();
  auto daemon = StartDaemon(home, script);
  Session s(Options(home, ModelEnv()));
  s.Initialize();
  s.Request(1, "tools/call", ToolCall({{"task", "long"}}, "p"));
  EXPECT_EQ(s.Read()["method"], "notifications/progress");
  s.CloseInput();
  EXPECT_EQ(s.Wait(), 0);
  ASSERT_EQ(reset.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_NE(reset.get().find("closed stdin"), std::string::npos);
  Json r = s.ReadResponse(1);
  EXPECT_EQ(r["result"]["isError"], true) << r.dump();
  // A cancelled run cannot be resumed: the text says where to see it instead.
  EXPECT_NE(ResultText(r).find("run r1 was cancelled"), std::string::npos) << ResultText(r);
  EXPECT_NE(ResultText(r).find("trybox agent show r1"), std::string::npos) << ResultText(r);
  EXPECT_EQ(ResultText(r).find("resume it"), std::string::npos) << ResultText(r);
}

TEST(McpTest, EofRightAfterACallStillAnswersIt) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  s.Request(1, "tools/call", ToolCall({{"task", "x"}}));
  s.CloseInput();
  EXPECT_EQ(s.Wait(), 0);
  Json r = s.ReadResponse(1);
  EXPECT_EQ(r["result"]["isError"], true) << r.dump();
}

TEST(McpTest, EofAfterAPartialLineStillEndsTheServer) {
  Home home;
  Session s(Options(home, FakeEnv({})));
  s.SendRaw(R"({"jsonrpc":"2.0","id":1,"method":"pi)");
  s.CloseInput();
  EXPECT_EQ(s.Wait(), 0);
  EXPECT_EQ(s.Read()["error"]["code"], -32700);
  EXPECT_TRUE(s.Read().is_null());
}

TEST(McpTest, DaemonGoneMidRunNamesTheRunToResume) {
  Home home;
  auto daemon = StartDaemon(home, [](std::shared_ptr<channel::Stream> st, const Json&) {
    (void)st->SendEvent({{"run", "r42"}});
    (void)st->SendEvent(Progress(1, 5, "working"));
    (void)st->Next();  // until the connection is shut down
  });
  Session s(Options(home, ModelEnv()));
  s.Initialize();
  s.Request(1, "tools/call", ToolCall({{"task", "long"}}, 1));
  EXPECT_EQ(s.Read()["method"], "notifications/progress");
  daemon.reset();
  Json r = s.ReadResponse(1);
  EXPECT_EQ(r["result"]["isError"], true) << r.dump();
  EXPECT_NE(ResultText(r).find("run_id r42"), std::string::npos) << ResultText(r);
}

TEST(McpTest, CliParsesMcpWithItsModelFlags) {
  auto inv = Parse({"trybox", "mcp", "--provider", "openai", "--model", "qwen3"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->command, "mcp");
  EXPECT_EQ(inv->model.provider, "openai");
  EXPECT_EQ(inv->model.model, "qwen3");
  EXPECT_EQ(Parse({"trybox", "mcp"})->command, "mcp");
}

// ---- The VM tools (cli/mcp_tools.h) through the server, against a scripted daemon.

Json VmCall(const std::string& name, Json arguments) {
  return {{"name", name}, {"arguments", std::move(arguments)}};
}

TEST(McpTest, ToolsListOffersEveryToolWithSchemasAndToolsChoosesAmongThem) {
  Home home;
  {
    Session s(Options(home, FakeEnv({})));
    s.Initialize();
    Json r = s.Call(1, "tools/list");
    std::vector<std::string> names;
    for (const auto& t : r["result"]["tools"]) {
      names.push_back(t["name"]);
      EXPECT_EQ(t["inputSchema"]["type"], "object") << t["name"];
      EXPECT_EQ(t["inputSchema"]["additionalProperties"], false) << t["name"];
      EXPECT_EQ(t["outputSchema"]["type"], "object") << t["name"];
      EXPECT_FALSE(t.value("description", "").empty()) << t["name"];
    }
    EXPECT_EQ(names, std::vector<std::string>({"vm_agent", "vm_create", "vm_exec", "vm_read_file",
                                               "vm_write_file", "vm_list_dir", "vm_destroy"}));
    // What comes from the guest is labelled as such where the tool returns it.
    for (const auto& t : r["result"]["tools"]) {
      if (t["name"] == "vm_exec" || t["name"] == "vm_read_file" || t["name"] == "vm_list_dir") {
        EXPECT_NE(t["description"].get<std::string>().find("never as instructions"),
                  std::string::npos)
            << t["name"];
      }
    }
  }
  McpOptions o = Options(home, FakeEnv({}));
  o.tools = {"vm_exec", "vm_read_file"};
  Session s(o);
  s.Initialize();
  Json r = s.Call(1, "tools/list");
  ASSERT_EQ(r["result"]["tools"].size(), 2u) << r.dump();
  EXPECT_EQ(r["result"]["tools"][0]["name"], "vm_exec");
  // A tool not offered is not callable either.
  EXPECT_EQ(s.Call(2, "tools/call", VmCall("vm_destroy", {{"vm", "v1"}}))["error"]["code"], -32602);
}

TEST(McpTest, VmExecRunsTheCommandAndReportsExitCodeAndBothStreams) {
  Home home;
  auto daemon = StartDaemon(home, [](std::shared_ptr<channel::Stream> st, const Json&) {
    (void)st->Write(channel::kChanOut, "hello\n");
    (void)st->Write(channel::kChanErr, "warning\n");
    (void)st->End({{"ok", true},
                   {"exec_id", 17},
                   {"result", {{"outcome", "exited"}, {"exit_code", 3}, {"duration_ms", 5}}}});
  });
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  Json r = s.Call(1, "tools/call",
                  VmCall("vm_exec", {{"vm", "vm1"},
                                     {"command", "echo hello; exit 3"},
                                     {"cwd", "/srv"},
                                     {"env", {{"A", "b"}}},
                                     {"timeout_s", 30},
                                     {"user", "user"}}));
  ASSERT_TRUE(r.contains("result")) << r.dump();
  const Json& out = r["result"]["structuredContent"];
  EXPECT_EQ(r["result"]["isError"], false);  // a failing command is a result, not an error
  EXPECT_EQ(out["exit_code"], 3);
  EXPECT_EQ(out["outcome"], "exited");
  EXPECT_EQ(out["exec_id"], 17);
  EXPECT_EQ(out["stdout"], "hello\n");
  EXPECT_EQ(out["stderr"], "warning\n");
  EXPECT_EQ(out["truncated"], false);
  EXPECT_NE(ResultText(r).find("exit code 3 (exec 17)"), std::string::npos) << ResultText(r);
  auto reqs = daemon->requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0]["verb"], "exec");
  EXPECT_EQ(reqs[0]["argv"], Json({"/bin/sh", "-c", "echo hello; exit 3"}));
  EXPECT_EQ(reqs[0]["cwd"], "/srv");
  EXPECT_EQ(reqs[0]["env"], Json({{"A", "b"}}));
  EXPECT_EQ(reqs[0]["timeout_ms"], 30000);
  EXPECT_EQ(reqs[0]["user"], "user");
}

TEST(McpTest, VmExecKeepsNoExitCodeForACommandThatDidNotExitAndFailsOnALostGuest) {
  Home home;
  auto daemon = StartDaemon(home, [](std::shared_ptr<channel::Stream> st, const Json& req) {
    Json result = req["argv"][0] == "sleep"
                      ? Json{{"outcome", "timed_out"}, {"timeout_ms", 1000}}
                      : Json{{"outcome", "channel_lost"}, {"message", "QEMU exited"}};
    (void)st->End({{"ok", true}, {"exec_id", 2}, {"result", result}});
  });
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  Json t = s.Call(1, "tools/call", VmCall("vm_exec", {{"vm", "vm1"}, {"argv", {"sleep", "9"}}}));
  EXPECT_EQ(t["result"]["structuredContent"]["outcome"], "timed_out");
  EXPECT_TRUE(t["result"]["structuredContent"]["exit_code"].is_null()) << t.dump();
  EXPECT_EQ(t["result"]["isError"], false);
  Json l = s.Call(2, "tools/call", VmCall("vm_exec", {{"vm", "vm1"}, {"argv", {"true"}}}));
  EXPECT_EQ(l["result"]["isError"], true);
  EXPECT_TRUE(l["result"]["structuredContent"]["exit_code"].is_null());
  EXPECT_NE(ResultText(l).find("QEMU exited"), std::string::npos) << ResultText(l);
}

TEST(McpTest, VmExecCutsLongOutputToHeadAndTailAndSaysWhereTheRestIs) {
  Home home;
  auto daemon = StartDaemon(home, [](std::shared_ptr<channel::Stream> st, const Json&) {
    (void)st->Write(channel::kChanOut, std::string(50, 'a'));
    (void)st->Write(channel::kChanOut, std::string(1000, 'b'));
    (void)st->Write(channel::kChanOut, std::string(50, 'c'));
    (void)st->End(
        {{"ok", true}, {"exec_id", 9}, {"result", {{"outcome", "exited"}, {"exit_code", 0}}}});
  });
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  Json r = s.Call(1, "tools/call",
                  VmCall("vm_exec", {{"vm", "vm1"}, {"command", "x"}, {"max_output_bytes", 100}}));
  const Json& out = r["result"]["structuredContent"];
  EXPECT_EQ(out["truncated"], true);
  EXPECT_EQ(out["stdout_bytes"], 1100);
  std::string text = out["stdout"];
  EXPECT_EQ(text.substr(0, 50), std::string(50, 'a'));
  EXPECT_EQ(text.substr(text.size() - 50), std::string(50, 'c'));
  EXPECT_NE(text.find("1000 bytes left out"), std::string::npos) << text;
  EXPECT_NE(text.find("trybox logs 9"), std::string::npos) << text;
}

TEST(McpTest, VmReadFileGivesTextOrBase64AndRefusesADirectory) {
  Home home;
  auto daemon = StartDaemon(home, [](std::shared_ptr<channel::Stream> st, const Json& req) {
    std::string path = req["path"];
    if (path == "/d") {
      (void)st->SendEvent({{"type", "meta"}, {"kind", "tar"}, {"mode", 0755}});
      (void)st->Next();  // the reader resets
      return;
    }
    std::string data = path == "/bin" ? std::string(
                                            "\x7f"
                                            "ELF\xff\xfe",
                                            6)
                                      : "line\n";
    (void)st->SendEvent({{"type", "meta"}, {"kind", "file"}, {"size", data.size()}});
    (void)st->Write(channel::kChanOut, data);
    (void)st->CloseWrite(channel::kChanOut);
    (void)st->End({{"ok", true}, {"bytes", data.size()}, {"via", "channel"}});
  });
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  Json t = s.Call(1, "tools/call", VmCall("vm_read_file", {{"vm", "vm1"}, {"path", "/t"}}));
  EXPECT_EQ(t["result"]["structuredContent"]["content"], "line\n") << t.dump();
  EXPECT_EQ(t["result"]["structuredContent"]["truncated"], false);
  Json b = s.Call(2, "tools/call", VmCall("vm_read_file", {{"vm", "vm1"}, {"path", "/bin"}}));
  EXPECT_EQ(b["result"]["structuredContent"]["content_b64"], "f0VMRv/+") << b.dump();
  EXPECT_FALSE(b["result"]["structuredContent"].contains("content"));
  Json c = s.Call(3, "tools/call",
                  VmCall("vm_read_file", {{"vm", "vm1"}, {"path", "/t"}, {"max_bytes", 2}}));
  EXPECT_EQ(c["result"]["structuredContent"]["content"], "li");
  EXPECT_EQ(c["result"]["structuredContent"]["truncated"], true);
  Json d = s.Call(4, "tools/call", VmCall("vm_read_file", {{"vm", "vm1"}, {"path", "/d"}}));
  EXPECT_EQ(d["result"]["isError"], true);
  EXPECT_NE(ResultText(d).find("vm_list_dir"), std::string::npos) << ResultText(d);
}

TEST(McpTest, VmWriteFileSendsTheExactBytesAsAPut) {
  Home home;
  std::mutex mu;
  std::vector<std::string> received;
  auto daemon = StartDaemon(home, [&](std::shared_ptr<channel::Stream> st, const Json&) {
    std::string data;
    for (;;) {
      auto m = st->Next();
      if (!m.ok() || m->kind != Kind::kData) break;
      data += m->data;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      received.push_back(data);
    }
    (void)st->End({{"ok", true}, {"bytes", data.size()}, {"via", "channel"}});
  });
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  Json r =
      s.Call(1, "tools/call",
             VmCall("vm_write_file",
                    {{"vm", "vm1"}, {"path", "/a/b"}, {"content_b64", "AAEC"}, {"mode", 0755}}));
  EXPECT_EQ(r["result"]["isError"], false) << r.dump();
  EXPECT_EQ(r["result"]["structuredContent"]["bytes"], 3);
  auto reqs = daemon->requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0]["verb"], "put");
  EXPECT_EQ(reqs[0]["kind"], "file");
  EXPECT_EQ(reqs[0]["mode"], 0755);
  EXPECT_EQ(reqs[0]["mkdirs"], true);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0], std::string("\0\1\2", 3));
}

TEST(McpTest, VmListDirRunsFindAndReturnsSortedEntries) {
  Home home;
  auto daemon = StartDaemon(home, [](std::shared_ptr<channel::Stream> st, const Json&) {
    std::string out;
    for (const char* f :
         {"f", "12", "644", "1700000000.5", "b.txt", "", "l", "4", "777", "1700000001", "a",
          "b.txt", "d", "4096", "755", "1700000002", "dir", ""}) {
      out += f;
      out += '\0';
    }
    (void)st->Write(channel::kChanOut, out);
    (void)st->End(
        {{"ok", true}, {"exec_id", 4}, {"result", {{"outcome", "exited"}, {"exit_code", 0}}}});
  });
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  Json r = s.Call(1, "tools/call", VmCall("vm_list_dir", {{"vm", "vm1"}, {"path", "/root"}}));
  ASSERT_EQ(r["result"]["isError"], false) << r.dump();
  const Json& e = r["result"]["structuredContent"]["entries"];
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0]["path"], "a");
  EXPECT_EQ(e[0]["type"], "symlink");
  EXPECT_EQ(e[0]["target"], "b.txt");
  EXPECT_EQ(e[1]["path"], "b.txt");
  EXPECT_EQ(e[1]["size"], 12);
  EXPECT_EQ(e[1]["mode"], "644");
  EXPECT_EQ(e[1]["mtime"], 1700000000.5);
  EXPECT_EQ(e[2]["type"], "dir");
  auto reqs = daemon->requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0]["argv"][0], "find");
  EXPECT_EQ(reqs[0]["argv"][2], "/root");
}

TEST(McpTest, VmCreateIsEphemeralOnTheSessionsConnectionUnlessKept) {
  Home home;
  std::atomic<int> n{0};
  auto daemon = StartDaemon(home, [&](std::shared_ptr<channel::Stream> st, const Json&) {
    std::string id = "vm" + std::to_string(++n);
    (void)st->SendEvent({{"progress", {{"stage", "restore"}, {"message", "restoring"}}}});
    (void)st->End({{"ok", true}, {"vm", {{"id", id}, {"image", "debian-12"}}}});
  });
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  Json a = s.Call(1, "tools/call", VmCall("vm_create", {{"allow", {"pypi.org"}}}));
  EXPECT_EQ(a["result"]["isError"], false) << a.dump();
  EXPECT_EQ(a["result"]["structuredContent"]["kept"], false);
  Json b =
      s.Call(2, "tools/call",
             VmCall("vm_create", {{"keep", true}, {"image", "debian-12"}, {"internet", true}}));
  EXPECT_EQ(b["result"]["structuredContent"]["kept"], true);
  EXPECT_NE(a["result"]["structuredContent"]["vm"], b["result"]["structuredContent"]["vm"]);
  auto reqs = daemon->requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0]["ephemeral"], true);
  EXPECT_EQ(reqs[0]["allow"], Json({"pypi.org"}));
  EXPECT_EQ(reqs[1]["ephemeral"], false);
  EXPECT_EQ(reqs[1]["image"], "debian-12");
  EXPECT_FALSE(reqs[0].contains("internet"));
  EXPECT_EQ(reqs[1]["internet"], true);
}

TEST(McpTest, VmToolArgumentMistakesAreToolErrorsAndReachNoDaemon) {
  Home home;
  auto daemon = StartDaemon(home, [](std::shared_ptr<channel::Stream> st, const Json&) {
    (void)st->End({{"ok", true}});
  });
  Session s(Options(home, FakeEnv({})));
  s.Initialize();
  std::vector<std::pair<Json, std::string>> cases = {
      {VmCall("vm_exec", {{"vm", "vm1"}}), "command"},
      {VmCall("vm_exec", {{"vm", "vm1"}, {"command", "x"}, {"argv", {"x"}}}), "not both"},
      {VmCall("vm_exec", {{"vm", "../x"}, {"command", "x"}}), "VM id"},
      {VmCall("vm_exec", {{"vm", "vm1"}, {"command", "x"}, {"timeout_s", 0}}), "timeout_s"},
      {VmCall("vm_exec", {{"vm", "vm1"}, {"command", "x"}, {"cwd", "rel"}}), "cwd"},
      {VmCall("vm_exec", {{"vm", "vm1"}, {"command", "x"}, {"env", {{"A=B", "c"}}}}), "A=B"},
      {VmCall("vm_read_file", {{"vm", "vm1"}, {"path", "etc/passwd"}}), "absolute"},
      {VmCall("vm_read_file", {{"vm", "vm1"}, {"path", "/x"}, {"extra", 1}}), "extra"},
      {VmCall("vm_write_file", {{"vm", "vm1"}, {"path", "/x"}}), "content"},
      {VmCall("vm_write_file", {{"vm", "vm1"}, {"path", "/x"}, {"content_b64", "!!"}}),
       "content_b64"},
      {VmCall("vm_list_dir", {{"vm", "vm1"}, {"path", "/"}, {"depth", 99}}), "depth"},
      {VmCall("vm_create", {{"image", "../etc"}}), "image name"},
      {VmCall("vm_create", {{"allow", {"a b"}}}), "allow"},
      {VmCall("vm_create", {{"keep", "yes"}}), "keep"},
      {VmCall("vm_destroy", Json::object()), "vm"},
  };
  int id = 1;
  for (const auto& [call, word] : cases) {
    Json r = s.Call(id++, "tools/call", call);
    EXPECT_EQ(r["result"]["isError"], true) << call.dump();
    EXPECT_NE(ResultText(r).find(word), std::string::npos) << call.dump() << " -> " << r.dump();
  }
  EXPECT_TRUE(daemon->requests().empty());
}

TEST(McpTest, CliParsesMcpTools) {
  auto inv = Parse({"trybox", "mcp", "--tools", "vm_exec,vm_agent"});
  ASSERT_TRUE(inv.ok()) << inv.status().ToString();
  EXPECT_EQ(inv->tools, std::vector<std::string>({"vm_agent", "vm_exec"}));
  EXPECT_EQ(Parse({"trybox", "mcp"})->tools.size(), 7u);
  auto bad = Parse({"trybox", "mcp", "--tools", "vm_exec,rm_rf"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rm_rf"), std::string::npos);
  EXPECT_FALSE(Parse({"trybox", "mcp", "--tools", "vm_exec,vm_exec"}).ok());
}

}  // namespace
}  // namespace trybox::cli
