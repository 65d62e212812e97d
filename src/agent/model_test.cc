// The model clients against the scripted fake model server (tests/fake_model/) over real
// loopback HTTP and HTTPS: both wire formats, retries, the failure names, the truncation
// guard and the probe.
#include "agent/model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <thread>
#include <type_traits>

#include "agent/http.h"
#include "egress/secrets_test_util.h"
#include "tests/fake_model/fake_model.h"
#include "util/tcp.h"

namespace trybox::agent {
namespace {

using egress::VmFlagsOf;

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;
using trybox::testing::FakeModelServer;

constexpr char kKey[] = "sk-test-5ecret-KEY-0123456789abcdef";

std::shared_ptr<const egress::SecretValue> Key() {
  auto k = MakeModelKey(kKey);
  EXPECT_TRUE(k.ok()) << k.status().ToString();
  return std::move(k).value();
}

std::unique_ptr<FakeModelServer> StartServer(bool tls = false) {
  auto s = FakeModelServer::Start({.tls = tls});
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

ModelSettings Settings(const FakeModelServer& s, const std::string& provider) {
  ModelSettings m;
  m.provider = provider;
  m.base_url = provider == "anthropic" ? s.anthropic_base_url() : s.openai_base_url();
  m.api_key = Key();
  m.model = "fake-model";
  m.ca_file = s.ca_file();
  m.request_timeout = seconds(20);
  m.max_attempts = 3;
  return m;
}

std::unique_ptr<ModelClient> Client(const ModelSettings& m) {
  auto c = ModelClient::Make(m);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

Outcome SendHello(ModelClient& c) {
  return c.Send("be brief", {Entry{Entry::Kind::kUser, "hello", {}, {}}}, {}, std::nullopt);
}

// A transcript that exercises every entry kind: a question, a tool call, its result, and a
// follow-up from the user.
std::vector<Entry> ToolTranscript() {
  ToolCall call;
  call.id = "call-1";
  call.name = "exec";
  call.input = {{"cmd", "ls"}};
  call.raw_arguments = R"({"cmd":"ls"})";
  return {Entry{Entry::Kind::kUser, "list the files", {}, {}},
          Entry{Entry::Kind::kAssistant, "looking", {call}, {}},
          Entry{Entry::Kind::kToolResults, "", {}, {ToolResult{"call-1", "exec", "a.txt", true}}},
          Entry{Entry::Kind::kUser, "and now?", {}, {}}};
}

std::vector<ToolSpec> Tools() {
  return {ToolSpec{"exec",
                   "Runs a command",
                   {{"type", "object"}, {"properties", {{"cmd", {{"type", "string"}}}}}}}};
}

// About 48,000 words: the prompt Ollama with its default window silently cuts.
std::string LongText() {
  std::string s;
  for (int i = 0; i < 48000; ++i) s += "word" + std::to_string(i) + " ";
  return s;
}

TEST(ModelAnthropic, RoundTripsTextAndToolCallsAndSendsTheWireFormat) {
  auto server = StartServer();
  server->Push({{"expect_key", kKey},
                {"text", "I will run it"},
                {"tool_calls", {{{"name", "exec"}, {"input", {{"cmd", "pwd"}}}}}}});
  auto client = Client(Settings(*server, "anthropic"));
  Outcome out = client->Send("you are a test", ToolTranscript(), Tools(), std::nullopt);
  ASSERT_TRUE(out.ok()) << out.message;
  EXPECT_EQ(out.attempts, 1);
  EXPECT_EQ(out.http_status, 200);
  EXPECT_EQ(out.reply.text, "I will run it");
  EXPECT_EQ(out.reply.stop_reason, "tool_use");
  ASSERT_EQ(out.reply.calls.size(), 1u);
  EXPECT_FALSE(out.reply.calls[0].id.empty());
  EXPECT_EQ(out.reply.calls[0].name, "exec");
  EXPECT_EQ(out.reply.calls[0].input, Json({{"cmd", "pwd"}}));
  EXPECT_TRUE(out.reply.calls[0].input_error.empty());
  EXPECT_EQ(out.reply.usage.input_tokens, out.request_bytes / 4);

  auto reqs = server->requests();
  ASSERT_EQ(reqs.size(), 1u);
  const auto& r = reqs[0];
  EXPECT_EQ(r.path, "/v1/messages");
  EXPECT_EQ(r.headers.at("x-api-key"), kKey);
  EXPECT_EQ(r.headers.at("anthropic-version"), "2023-06-01");
  EXPECT_EQ(r.headers.at("content-type"), "application/json");
  EXPECT_EQ(r.headers.count("authorization"), 0u);
  EXPECT_EQ(static_cast<int64_t>(r.body_bytes), out.request_bytes);
  const Json& b = r.body;
  EXPECT_EQ(b["model"], "fake-model");
  EXPECT_EQ(b["max_tokens"], 4096);
  EXPECT_EQ(b["system"], "you are a test");
  EXPECT_EQ(b["tools"][0]["name"], "exec");
  EXPECT_EQ(b["tools"][0]["description"], "Runs a command");
  EXPECT_EQ(b["tools"][0]["input_schema"]["type"], "object");
  ASSERT_EQ(b["messages"].size(), 3u);
  EXPECT_EQ(b["messages"][0]["role"], "user");
  EXPECT_EQ(b["messages"][0]["content"][0]["text"], "list the files");
  const Json& assistant = b["messages"][1];
  EXPECT_EQ(assistant["role"], "assistant");
  EXPECT_EQ(assistant["content"][0], Json({{"type", "text"}, {"text", "looking"}}));
  EXPECT_EQ(
      assistant["content"][1],
      Json({{"type", "tool_use"}, {"id", "call-1"}, {"name", "exec"}, {"input", {{"cmd", "ls"}}}}));
  // The tool results and the user's next words are one user message.
  const Json& results = b["messages"][2];
  EXPECT_EQ(results["role"], "user");
  EXPECT_EQ(results["content"][0], Json({{"type", "tool_result"},
                                         {"tool_use_id", "call-1"},
                                         {"content", "a.txt"},
                                         {"is_error", true}}));
  EXPECT_EQ(results["content"][1], Json({{"type", "text"}, {"text", "and now?"}}));
}

TEST(ModelOpenAi, RoundTripsTextAndToolCallsAndSendsTheWireFormat) {
  auto server = StartServer();
  server->Push(
      {{"expect_key", kKey}, {"tool_calls", {{{"name", "exec"}, {"input", {{"cmd", "pwd"}}}}}}});
  server->Push({{"text", "done"}});
  auto client = Client(Settings(*server, "openai"));
  Outcome out = client->Send("you are a test", ToolTranscript(), Tools(), std::nullopt);
  ASSERT_TRUE(out.ok()) << out.message;
  EXPECT_EQ(out.reply.text, "");
  EXPECT_EQ(out.reply.stop_reason, "tool_calls");
  ASSERT_EQ(out.reply.calls.size(), 1u);
  EXPECT_FALSE(out.reply.calls[0].id.empty());
  EXPECT_EQ(out.reply.calls[0].name, "exec");
  EXPECT_EQ(out.reply.calls[0].input, Json({{"cmd", "pwd"}}));
  EXPECT_EQ(out.reply.calls[0].raw_arguments, R"({"cmd":"pwd"})");
  EXPECT_EQ(out.reply.usage.input_tokens, out.request_bytes / 4);

  out = SendHello(*client);
  ASSERT_TRUE(out.ok()) << out.message;
  EXPECT_EQ(out.reply.text, "done");
  EXPECT_EQ(out.reply.stop_reason, "stop");
  EXPECT_TRUE(out.reply.calls.empty());

  auto reqs = server->requests();
  ASSERT_EQ(reqs.size(), 2u);
  const auto& r = reqs[0];
  EXPECT_EQ(r.path, "/v1/chat/completions");
  EXPECT_EQ(r.headers.at("authorization"), std::string("Bearer ") + kKey);
  EXPECT_EQ(r.headers.count("x-api-key"), 0u);
  const Json& b = r.body;
  EXPECT_EQ(b["model"], "fake-model");
  EXPECT_EQ(b["max_tokens"], 4096);
  EXPECT_EQ(b["tools"][0], Json({{"type", "function"},
                                 {"function",
                                  {{"name", "exec"},
                                   {"description", "Runs a command"},
                                   {"parameters", Tools()[0].input_schema}}}}));
  const Json& m = b["messages"];
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], Json({{"role", "system"}, {"content", "you are a test"}}));
  EXPECT_EQ(m[1], Json({{"role", "user"}, {"content", "list the files"}}));
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["content"], "looking");
  EXPECT_EQ(m[2]["tool_calls"][0],
            Json({{"id", "call-1"},
                  {"type", "function"},
                  {"function", {{"name", "exec"}, {"arguments", R"({"cmd":"ls"})"}}}}));
  EXPECT_EQ(m[3],
            Json({{"role", "tool"}, {"tool_call_id", "call-1"}, {"content", "error: a.txt"}}));
  EXPECT_EQ(m[4], Json({{"role", "user"}, {"content", "and now?"}}));
}

TEST(ModelOpenAi, NoAuthorizationHeaderWithoutKey) {
  auto server = StartServer();
  server->Push({{"text", "hi"}});
  ModelSettings m = Settings(*server, "openai");
  m.api_key.reset();
  Outcome out = SendHello(*Client(m));
  ASSERT_TRUE(out.ok()) << out.message;
  EXPECT_EQ(server->requests()[0].headers.count("authorization"), 0u);
}

TEST(ModelOpenAi, MalformedArgumentsGiveInputErrorAndKeepTheRawText) {
  auto server = StartServer();
  server->Push({{"tool_calls",
                 {{{"name", "exec"}, {"raw_arguments", "{\"cmd\": \"ls"}},
                  {{"name", "exec"}, {"raw_arguments", "[1, 2]"}},
                  {{"name", "exec"}, {"raw_arguments", "{\"cmd\": \"ls\"}"}}}}});
  Outcome out = SendHello(*Client(Settings(*server, "openai")));
  ASSERT_TRUE(out.ok()) << out.message;
  ASSERT_EQ(out.reply.calls.size(), 3u);
  EXPECT_NE(out.reply.calls[0].input_error, "");
  EXPECT_EQ(out.reply.calls[0].raw_arguments, "{\"cmd\": \"ls");
  EXPECT_NE(out.reply.calls[1].input_error, "");
  EXPECT_EQ(out.reply.calls[1].raw_arguments, "[1, 2]");
  EXPECT_EQ(out.reply.calls[2].input_error, "");
  EXPECT_EQ(out.reply.calls[2].input, Json({{"cmd", "ls"}}));
}

TEST(ModelClient, RateLimitedThenSuccessWaitsTheRetryAfterSeconds) {
  auto server = StartServer();
  server->Push({{"status", 429}, {"retry_after", "1"}});
  server->Push({{"text", "ok"}});
  ::testing::internal::CaptureStderr();
  Outcome out = SendHello(*Client(Settings(*server, "anthropic")));
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(out.ok()) << out.message;
  EXPECT_EQ(out.attempts, 2);
  EXPECT_NE(log.find("HTTP 429"), std::string::npos) << log;
  EXPECT_NE(log.find("retrying in 1000 ms"), std::string::npos) << log;
}

TEST(ModelClient, ServiceUnavailableThenSuccessWaitsRetryAfterMs) {
  auto server = StartServer();
  server->Push({{"status", 503}, {"retry_after_ms", "20"}, {"retry_after", "30"}});
  server->Push({{"text", "ok"}});
  ::testing::internal::CaptureStderr();
  Outcome out = SendHello(*Client(Settings(*server, "openai")));
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(out.ok()) << out.message;
  EXPECT_EQ(out.attempts, 2);
  EXPECT_NE(log.find("retrying in 20 ms"), std::string::npos) << log;
}

TEST(ModelClient, WithoutRetryAfterBacksOffFrom500Ms) {
  auto server = StartServer();
  server->Push({{"status", 502}});
  server->Push({{"text", "ok"}});
  ::testing::internal::CaptureStderr();
  Outcome out = SendHello(*Client(Settings(*server, "openai")));
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(out.ok()) << out.message;
  EXPECT_EQ(out.attempts, 2);
  EXPECT_NE(log.find("retrying in 500 ms"), std::string::npos) << log;
}

TEST(ModelClient, ServerErrorsExhaustTheAttempts) {
  auto server = StartServer();
  server->Push({{"status", 529}, {"retry_after_ms", "1"}});
  server->Push({{"status", 500}, {"retry_after_ms", "1"}});
  server->Push({{"status", 500},
                {"retry_after_ms", "1"},
                {"error", {{"type", "api_error"}, {"message", "the fake is down"}}}});
  ::testing::internal::CaptureStderr();
  Outcome out = SendHello(*Client(Settings(*server, "anthropic")));
  (void)::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.failure, Failure::kServer);
  EXPECT_EQ(out.attempts, 3);
  EXPECT_EQ(out.http_status, 500);
  EXPECT_NE(out.message.find("anthropic"), std::string::npos) << out.message;
  EXPECT_NE(out.message.find("fake-model"), std::string::npos) << out.message;
  EXPECT_NE(out.message.find("HTTP 500"), std::string::npos) << out.message;
  EXPECT_NE(out.message.find("the fake is down"), std::string::npos) << out.message;
  EXPECT_NE(out.message.find("after 3 attempts"), std::string::npos) << out.message;
  EXPECT_EQ(server->steps_left(), 0u);
}

TEST(ModelClient, RateLimitStillAfterTheLastAttemptIsRateLimited) {
  auto server = StartServer();
  for (int i = 0; i < 3; ++i) server->Push({{"status", 429}, {"retry_after_ms", "1"}});
  ::testing::internal::CaptureStderr();
  Outcome out = SendHello(*Client(Settings(*server, "openai")));
  (void)::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.failure, Failure::kRateLimited);
  EXPECT_EQ(out.attempts, 3);
}

TEST(ModelClient, UnauthorizedIsAuthAndNotRetried) {
  auto server = StartServer();
  server->Push({{"expect_key", "another-key"}});
  server->Push({{"text", "never reached"}});
  Outcome out = SendHello(*Client(Settings(*server, "anthropic")));
  EXPECT_EQ(out.failure, Failure::kAuth);
  EXPECT_EQ(out.http_status, 401);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_NE(out.message.find("authentication_error"), std::string::npos) << out.message;
  EXPECT_EQ(server->steps_left(), 1u);
}

TEST(ModelClient, OtherClientErrorIsBadRequest) {
  auto server = StartServer();
  server->Push({{"status", 400}, {"error", {{"message", "max_tokens: too large"}}}});
  Outcome out = SendHello(*Client(Settings(*server, "anthropic")));
  EXPECT_EQ(out.failure, Failure::kBadRequest);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_NE(out.message.find("max_tokens: too large"), std::string::npos) << out.message;
}

TEST(ModelAnthropic, PromptTooLongIsContextOverflow) {
  auto server = StartServer();
  server->Push({{"status", 400},
                {"error",
                 {{"type", "invalid_request_error"},
                  {"message", "prompt is too long: 210000 tokens > 200000 maximum"}}}});
  Outcome out = SendHello(*Client(Settings(*server, "anthropic")));
  EXPECT_EQ(out.failure, Failure::kContextOverflow) << out.message;
  EXPECT_NE(out.message.find("210000 tokens"), std::string::npos) << out.message;
}

TEST(ModelOpenAi, ContextLengthExceededIsContextOverflow) {
  auto server = StartServer();
  server->Push({{"status", 400},
                {"error",
                 {{"code", "context_length_exceeded"},
                  {"message", "This model's maximum context length is 8192 tokens."}}}});
  server->Push({{"status", 400},
                {"error", {{"message", "the request exceeds the available context size"}}}});
  auto client = Client(Settings(*server, "openai"));
  Outcome out = SendHello(*client);
  EXPECT_EQ(out.failure, Failure::kContextOverflow) << out.message;
  out = SendHello(*client);
  EXPECT_EQ(out.failure, Failure::kContextOverflow) << out.message;
}

TEST(ModelClient, UnderCountedInputTokensIsContextTruncated) {
  for (const char* provider : {"anthropic", "openai"}) {
    auto server = StartServer();
    server->Push({{"text", "sure"}, {"input_tokens", 2050}});
    Outcome out = Client(Settings(*server, provider))
                      ->Send("", {Entry{Entry::Kind::kUser, LongText(), {}, {}}}, {}, std::nullopt);
    EXPECT_EQ(out.failure, Failure::kContextTruncated) << provider << ": " << out.message;
    EXPECT_NE(out.message.find("sent " + std::to_string(out.request_bytes) + " bytes"),
              std::string::npos)
        << out.message;
    EXPECT_NE(out.message.find("2050"), std::string::npos) << out.message;
    EXPECT_NE(out.message.find("context window is smaller"), std::string::npos) << out.message;
  }
}

TEST(ModelClient, FaithfulCountOfALongPromptPasses) {
  auto server = StartServer();
  server->Push({{"text", "sure"}});  // reports body bytes / 4
  Outcome out = Client(Settings(*server, "openai"))
                    ->Send("", {Entry{Entry::Kind::kUser, LongText(), {}, {}}}, {}, std::nullopt);
  EXPECT_TRUE(out.ok()) << out.message;
}

TEST(ModelClient, SmallRequestsAreNotCheckedForTruncation) {
  auto server = StartServer();
  server->Push({{"text", "hi"}, {"input_tokens", 1}});
  Outcome out = SendHello(*Client(Settings(*server, "anthropic")));
  EXPECT_TRUE(out.ok()) << out.message;
}

TEST(ModelClient, ProbePassesWhenTheProviderCountsFaithfully) {
  for (const char* provider : {"anthropic", "openai"}) {
    auto server = StartServer();
    server->Push({{"text", "OK"}});
    Outcome out = Client(Settings(*server, provider))->Probe(std::nullopt);
    EXPECT_TRUE(out.ok()) << provider << ": " << out.message;
    EXPECT_GE(out.request_bytes, 64 * 1024);
    auto reqs = server->requests();
    ASSERT_EQ(reqs.size(), 1u);
    EXPECT_FALSE(reqs[0].body.contains("tools"));
  }
}

TEST(ModelClient, ProbeFailsWhenTheProviderUnderCounts) {
  auto server = StartServer();
  // Above the Send guard's 1/16 but below the probe's 1/8: only the probe catches it.
  server->Push({{"text", "OK"}, {"input_tokens", 6000}});
  Outcome out = Client(Settings(*server, "openai"))->Probe(std::nullopt);
  EXPECT_EQ(out.failure, Failure::kContextTruncated) << out.message;
  EXPECT_NE(out.message.find("sent " + std::to_string(out.request_bytes) +
                             " bytes, provider counted 6000 tokens"),
            std::string::npos)
      << out.message;
}

TEST(ModelOpenAi, MissingUsagePassesSendButFailsTheProbe) {
  auto server = StartServer();
  server->Push({{"text", "hi"}, {"omit_usage", true}});
  server->Push({{"text", "OK"}, {"omit_usage", true}});
  auto client = Client(Settings(*server, "openai"));
  Outcome out = SendHello(*client);
  ASSERT_TRUE(out.ok()) << out.message;
  EXPECT_EQ(out.reply.usage.input_tokens, 0);
  out = client->Probe(std::nullopt);
  EXPECT_EQ(out.failure, Failure::kProtocol);
  EXPECT_NE(out.message.find("usage.prompt_tokens"), std::string::npos) << out.message;
}

TEST(ModelAnthropic, MissingUsageIsProtocol) {
  auto server = StartServer();
  server->Push({{"text", "hi"}, {"omit_usage", true}});
  Outcome out = SendHello(*Client(Settings(*server, "anthropic")));
  EXPECT_EQ(out.failure, Failure::kProtocol);
  EXPECT_NE(out.message.find("usage.input_tokens"), std::string::npos) << out.message;
}

TEST(ModelClient, LongRetryAfterWithAShortDeadlineReturnsAtOnceAsTimeout) {
  auto server = StartServer();
  server->Push({{"status", 429}, {"retry_after", "30"}});
  auto start = steady_clock::now();
  Outcome out = Client(Settings(*server, "anthropic"))
                    ->Send("", {Entry{Entry::Kind::kUser, "hi", {}, {}}}, {}, start + seconds(5));
  EXPECT_LT(steady_clock::now() - start, seconds(5));
  EXPECT_EQ(out.failure, Failure::kTimeout);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_EQ(out.http_status, 429);
  EXPECT_NE(out.message.find("would pass the deadline"), std::string::npos) << out.message;
  EXPECT_NE(out.message.find("HTTP 429"), std::string::npos) << out.message;
}

TEST(ModelClient, ASlowReplyIsCutAtTheDeadline) {
  auto server = StartServer();
  server->Push({{"text", "late"}, {"delay_ms", 10000}});
  auto start = steady_clock::now();
  Outcome out =
      Client(Settings(*server, "openai"))
          ->Send("", {Entry{Entry::Kind::kUser, "hi", {}, {}}}, {}, start + milliseconds(300));
  EXPECT_LT(steady_clock::now() - start, seconds(5));
  EXPECT_EQ(out.failure, Failure::kTimeout) << out.message;
  EXPECT_NE(out.message.find("deadline"), std::string::npos) << out.message;
}

// Issue 41.7: a request the server never answers is dropped when its cancel flag is set
// (tryboxd sets it when the agent process that asked is gone): Post returns kCancelled and
// the server sees its connection closed, long before the request's own timeout.
TEST(HttpClient, CancelDropsARequestTheServerNeverAnswers) {
  auto server = StartServer();
  server->Push({{"hang", true}});
  auto post = ModelEndpoint(Settings(*server, "openai"));
  ASSERT_TRUE(post.ok()) << post.status().ToString();
  post->body = R"({"model": "fake-model", "messages": []})";
  post->timeout = seconds(600);
  std::atomic<bool> cancel{false};
  post->cancel = &cancel;
  auto client = HttpClient::Make();
  ASSERT_TRUE(client.ok());
  std::thread canceller([&] {
    EXPECT_TRUE(server->WaitForRequests(1, seconds(60)));
    cancel = true;
  });
  auto r = (*client)->Post(*post);
  canceller.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCancelled) << r.status().ToString();
  EXPECT_TRUE(server->WaitForHangsEnded(1, seconds(60)));
}

TEST(ModelClient, PassedDeadlineSendsNothing) {
  auto server = StartServer();
  Outcome out =
      Client(Settings(*server, "openai"))->Send("", {}, {}, steady_clock::now() - milliseconds(1));
  EXPECT_EQ(out.failure, Failure::kTimeout);
  EXPECT_EQ(out.attempts, 0);
  EXPECT_TRUE(server->requests().empty());
}

TEST(ModelClient, HttpsWithTheServersCaFile) {
  auto server = StartServer(/*tls=*/true);
  ASSERT_FALSE(server->ca_file().empty());
  EXPECT_EQ(server->anthropic_base_url().rfind("https://127.0.0.1:", 0), 0u);
  server->Push({{"text", "secure"}});
  Outcome out = SendHello(*Client(Settings(*server, "anthropic")));
  ASSERT_TRUE(out.ok()) << out.message;
  EXPECT_EQ(out.reply.text, "secure");
}

TEST(ModelClient, HttpsWithoutTrustingTheCertificateIsTransport) {
  auto server = StartServer(/*tls=*/true);
  ModelSettings m = Settings(*server, "openai");
  m.ca_file.clear();
  m.max_attempts = 1;
  Outcome out = SendHello(*Client(m));
  EXPECT_EQ(out.failure, Failure::kTransport) << out.message;
  EXPECT_TRUE(server->requests().empty());
}

TEST(ModelClient, ConnectionRefusedIsTransportAfterRetries) {
  uint16_t port;
  {
    auto l = ListenTcpLoopback(0);
    ASSERT_TRUE(l.ok());
    port = l->port;
  }  // closed: nothing listens there now
  ModelSettings m;
  m.provider = "openai";
  m.base_url = "http://127.0.0.1:" + std::to_string(port) + "/v1";
  m.model = "fake-model";
  m.api_key = Key();
  m.max_attempts = 2;
  ::testing::internal::CaptureStderr();
  Outcome out = SendHello(*Client(m));
  (void)::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.failure, Failure::kTransport);
  EXPECT_EQ(out.attempts, 2);
  EXPECT_EQ(out.http_status, 0);
  EXPECT_NE(out.message.find("transport"), std::string::npos) << out.message;
}

TEST(ModelClient, GarbageTwoHundredIsProtocol) {
  auto server = StartServer();
  server->Push({{"raw_body", "<html>hello</html>"}});
  server->Push({{"raw_body", R"({"unexpected": true})"}});
  auto client = Client(Settings(*server, "anthropic"));
  Outcome out = SendHello(*client);
  EXPECT_EQ(out.failure, Failure::kProtocol);
  EXPECT_EQ(out.attempts, 1);
  EXPECT_NE(out.message.find("<html>"), std::string::npos) << out.message;
  out = SendHello(*client);
  EXPECT_EQ(out.failure, Failure::kProtocol);
  EXPECT_NE(out.message.find("content"), std::string::npos) << out.message;
}

TEST(ModelClient, TheKeyIsInNoMessageAndNoLogLine) {
  auto server = StartServer();
  std::string echoed = std::string("Incorrect API key provided: ") + kKey;
  std::vector<Json> failures = {
      {{"expect_key", "other"}},
      {{"status", 401}, {"error", {{"message", echoed}}}},
      {{"status", 429}, {"retry_after_ms", "1"}, {"error", {{"message", echoed}}}},
      {{"status", 500}, {"retry_after_ms", "1"}, {"error", {{"message", echoed}}}},
      {{"status", 400}, {"error", {{"message", echoed}}}},
      {{"raw_body", echoed}},
      {{"text", "x"}, {"omit_usage", true}},
  };
  ::testing::internal::CaptureStderr();
  std::vector<std::string> messages;
  for (const char* provider : {"anthropic", "openai"}) {
    ModelSettings m = Settings(*server, provider);
    m.max_attempts = 2;
    auto client = Client(m);
    for (const Json& step : failures) {
      server->Push(step);
      server->Push(step);  // a retry, if it is retried
      messages.push_back(SendHello(*client).message);
      while (server->steps_left() > 0) (void)SendHello(*client);
    }
    server->Push({{"text", "OK"}, {"input_tokens", 10}});
    messages.push_back(client->Probe(std::nullopt).message);
    messages.push_back(client->settings().Describe().dump());
  }
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("[api key]"), std::string::npos) << log;
  EXPECT_EQ(log.find(kKey), std::string::npos) << log;
  int failures_named = 0;
  for (const auto& msg : messages) {
    failures_named += msg.find("[api key]") != std::string::npos;
    EXPECT_EQ(msg.find(kKey), std::string::npos) << msg;
  }
  EXPECT_GE(failures_named, 8);  // the echoed key was there, and was replaced
}

TEST(ModelTranscript, EntriesRoundTripThroughJson) {
  std::vector<Entry> entries = ToolTranscript();
  ToolCall bad;
  bad.id = "call-2";
  bad.name = "write";
  bad.input_error = "the tool arguments are not valid JSON";
  bad.raw_arguments = "{oops";
  entries[1].calls.push_back(bad);
  for (const Entry& e : entries) {
    Json j = EntryToJson(e);
    auto back = EntryFromJson(Json::parse(j.dump()));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(EntryToJson(*back), j);
    EXPECT_EQ(back->kind, e.kind);
    EXPECT_EQ(back->text, e.text);
    ASSERT_EQ(back->calls.size(), e.calls.size());
    for (size_t i = 0; i < e.calls.size(); ++i) {
      EXPECT_EQ(back->calls[i].id, e.calls[i].id);
      EXPECT_EQ(back->calls[i].input, e.calls[i].input);
      EXPECT_EQ(back->calls[i].input_error, e.calls[i].input_error);
      EXPECT_EQ(back->calls[i].raw_arguments, e.calls[i].raw_arguments);
    }
    ASSERT_EQ(back->results.size(), e.results.size());
    for (size_t i = 0; i < e.results.size(); ++i) {
      EXPECT_EQ(back->results[i].call_id, e.results[i].call_id);
      EXPECT_EQ(back->results[i].content, e.results[i].content);
      EXPECT_EQ(back->results[i].is_error, e.results[i].is_error);
    }
  }
}

TEST(ModelTranscript, MalformedEntriesAreRefused) {
  EXPECT_FALSE(EntryFromJson(Json::array()).ok());
  EXPECT_FALSE(EntryFromJson({{"kind", "system"}}).ok());
  EXPECT_FALSE(EntryFromJson({{"kind", "user"}, {"text", 3}}).ok());
  EXPECT_FALSE(EntryFromJson({{"kind", "assistant"}, {"calls", {{{"name", "x"}}}}}).ok());
  EXPECT_FALSE(EntryFromJson({{"kind", "tool_results"}}).ok());
  EXPECT_FALSE(
      EntryFromJson({{"kind", "tool_results"}, {"results", {{{"call_id", "a"}, {"is_error", 1}}}}})
          .ok());
}

TEST(ModelSettingsJson, DefaultsAndRefusals) {
  auto s = ModelSettings::FromJson({{"provider", "anthropic"}, {"model", "m"}, {"api_key", kKey}});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->base_url, "https://api.anthropic.com");
  Json d = s->Describe();
  EXPECT_EQ(d["key_set"], true);
  EXPECT_EQ(d.dump().find(kKey), std::string::npos);
  s = ModelSettings::FromJson(
      {{"provider", "openai"}, {"model", "m"}, {"base_url", "http://127.0.0.1:11434/v1/"}});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->base_url, "http://127.0.0.1:11434/v1");
  EXPECT_EQ(s->Describe()["key_set"], false);

  auto refused = [](const Json& j, const std::string& names) {
    auto r = ModelSettings::FromJson(j);
    EXPECT_FALSE(r.ok()) << j.dump();
    EXPECT_NE(r.status().message().find(names), std::string::npos) << r.status().ToString();
    EXPECT_EQ(r.status().message().find("\r"), std::string::npos);
  };
  ModelSettings direct;
  direct.provider = "openai";
  direct.model = "m";
  EXPECT_FALSE(ModelClient::Make(direct).ok());  // no base_url
  direct.base_url = "http://127.0.0.1:1/v1/";
  auto made = ModelClient::Make(direct);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ((*made)->settings().base_url, "http://127.0.0.1:1/v1");
  direct.provider = "gemini";
  EXPECT_FALSE(ModelClient::Make(direct).ok());

  refused({{"provider", "gemini"}, {"model", "m"}}, "provider");
  refused({{"provider", "openai"}}, "model");
  refused({{"provider", "openai"}, {"model", "m"}, {"base_url", "ftp://x"}}, "base_url");
  refused({{"provider", "openai"}, {"model", "m"}, {"api_key", 5}}, "api_key");
  refused({{"provider", "openai"}, {"model", "m"}, {"api_key", "sk-1\r\nX-Evil: 1"}}, "api_key");
}

// Issue 13: the key lives in egress::SecretValue pages for its whole life in the daemon, and
// a copy of the settings shares them rather than copying the value.
static_assert(
    std::is_same_v<decltype(ModelSettings::api_key), std::shared_ptr<const egress::SecretValue>>,
    "the model key is held in SecretValue pages, never in a std::string");

TEST(ModelSettingsJson, TheKeyGoesFromTheRequestIntoPagesExcludedFromCoreDumps) {
  auto s = ModelSettings::FromJson({{"provider", "openai"}, {"model", "m"}, {"api_key", kKey}});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->has_key());
  EXPECT_EQ(s->api_key->view(), kKey);
  auto flags = VmFlagsOf(s->api_key->view().data());
  ASSERT_TRUE(flags.has_value());
  EXPECT_NE(flags->find(" dd"), std::string::npos) << *flags;
  // An empty key is no key: no credential header, key_set false.
  s = ModelSettings::FromJson({{"provider", "openai"}, {"model", "m"}, {"api_key", ""}});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->api_key, nullptr);
  EXPECT_EQ(s->Describe()["key_set"], false);
}

TEST(ModelSettingsJson, CopiesShareTheKeysPagesAndTheLastOneGoingWipesThem) {
  auto s = ModelSettings::FromJson({{"provider", "openai"}, {"model", "m"}, {"api_key", kKey}});
  ASSERT_TRUE(s.ok());
  std::optional<ModelSettings> copy = *s;
  const char* where = s->api_key->view().data();
  EXPECT_EQ(copy->api_key->view().data(), where);  // the same pages, not a second value
  auto client = ModelClient::Make(*copy);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->settings().api_key->view().data(), where);
  auto post = ModelEndpoint(*s);
  ASSERT_TRUE(post.ok());
  EXPECT_EQ(post->credential->view().data(), where);

  s->api_key.reset();
  copy.reset();
  client->reset();
  EXPECT_TRUE(VmFlagsOf(where).has_value());  // the endpoint still holds it
  post->credential.reset();
  // Unmapped (after explicit_bzero): no mapping marked for the key holds the address now.
  auto flags = VmFlagsOf(where);
  EXPECT_TRUE(!flags || flags->find(" dd") == std::string::npos) << *flags;
}

TEST(ModelSettingsJson, WipeKeyClearsTheRequestsCopyAndNothingElse) {
  Json model = {{"provider", "openai"}, {"model", "m"}, {"api_key", kKey}};
  const char* text = model["api_key"].get_ref<const std::string&>().data();
  auto s = ModelSettings::FromJson(model);
  ASSERT_TRUE(s.ok());
  WipeKey(&model);
  EXPECT_EQ(model["api_key"], "");
  EXPECT_EQ(std::string_view(text, sizeof kKey - 1), std::string(sizeof kKey - 1, '\0'));
  EXPECT_EQ(model["model"], "m");
  EXPECT_EQ(s->api_key->view(), kKey);  // the parsed settings keep their own pages
  Json not_an_object = "x";
  WipeKey(&not_an_object);
  EXPECT_EQ(not_an_object, "x");
  Json number = {{"api_key", 5}};
  WipeKey(&number);
  EXPECT_EQ(number["api_key"], 5);
}

TEST(ModelEndpointTest, TheKeyIsACredentialNeverAPlainHeaderAndReachesTheServer) {
  auto server = StartServer();
  for (const char* provider : {"anthropic", "openai"}) {
    ModelSettings m = Settings(*server, provider);
    auto post = ModelEndpoint(m);
    ASSERT_TRUE(post.ok()) << post.status().ToString();
    for (const auto& h : post->headers) EXPECT_EQ(h.find(kKey), std::string::npos) << h;
    EXPECT_EQ(post->credential, m.api_key);
    // What tryboxd does with a body trybox-agent built: the fake answers 401 unless the
    // request carried this key, in the provider's own header.
    server->Push({{"expect_key", kKey}, {"text", "ok"}});
    post->body = Json{{"model", "fake-model"},
                      {"max_tokens", 16},
                      {"messages", {{{"role", "user"}, {"content", "hi"}}}}}
                     .dump();
    post->timeout = seconds(20);
    auto http = HttpClient::Make();
    ASSERT_TRUE(http.ok());
    auto r = (*http)->Post(*post);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 200) << r->body;
  }
  auto reqs = server->requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].headers["x-api-key"], kKey);
  EXPECT_EQ(reqs[0].headers.count("authorization"), 0u);
  EXPECT_EQ(reqs[1].headers["authorization"], std::string("Bearer ") + kKey);
  EXPECT_EQ(reqs[1].headers.count("x-api-key"), 0u);
}

TEST(ModelEndpointTest, ScrubKeyTakesTheKeyOutOfAnyText) {
  auto server = StartServer();
  ModelSettings m = Settings(*server, "openai");
  std::string text =
      std::string("curl: bad header 'authorization: Bearer ") + kKey + "' and " + kKey;
  std::string scrubbed = ScrubKey(text, m);
  EXPECT_EQ(scrubbed.find(kKey), std::string::npos) << scrubbed;
  EXPECT_NE(scrubbed.find("Bearer [api key]' and [api key]"), std::string::npos) << scrubbed;
  m.api_key.reset();
  EXPECT_EQ(ScrubKey("nothing to hide", m), "nothing to hide");
}

TEST(ModelHttp, RetryAfterReadsMillisecondsSecondsAndDates) {
  EXPECT_EQ(RetryAfter({}), std::nullopt);
  EXPECT_EQ(RetryAfter({{"retry-after", "7"}}), milliseconds(7000));
  EXPECT_EQ(RetryAfter({{"retry-after", "7"}, {"retry-after-ms", "250"}}), milliseconds(250));
  EXPECT_EQ(RetryAfter({{"retry-after", "soon"}}), std::nullopt);
  char date[64];
  time_t later = std::time(nullptr) + 20;
  struct tm tm;
  gmtime_r(&later, &tm);
  std::strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  auto d = RetryAfter({{"retry-after", date}});
  ASSERT_TRUE(d.has_value()) << date;
  EXPECT_GE(*d, milliseconds(18000));
  EXPECT_LE(*d, milliseconds(20000));
}

TEST(FakeModelServerTest, AnExhaustedScriptAnswers500) {
  auto server = StartServer();
  ModelSettings m = Settings(*server, "openai");
  m.max_attempts = 1;
  Outcome out = SendHello(*Client(m));
  EXPECT_EQ(out.failure, Failure::kServer);
  EXPECT_NE(out.message.find("fake model: script exhausted"), std::string::npos) << out.message;
}

TEST(FakeModelServerTest, OneClientReusesOneConnection) {
  auto server = StartServer();
  for (int i = 0; i < 3; ++i) server->Push({{"text", "again"}});
  auto client = Client(Settings(*server, "anthropic"));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(SendHello(*client).ok());
  EXPECT_EQ(server->connections(), 1u);
  EXPECT_EQ(server->requests().size(), 3u);
}

}  // namespace
}  // namespace trybox::agent
