// Model clients: the sub-agent's one way to a model (docs/agent.md, docs/protocol/model.md).
//
// Two wire formats over HTTPS through libcurl: the Anthropic Messages API (POST
// {base}/v1/messages) and the OpenAI-compatible chat completions API (POST
// {base}/chat/completions, where the base includes /v1 as OPENAI_BASE_URL does), which also
// covers Ollama, vLLM and llama.cpp servers. The loop speaks a provider-neutral transcript;
// each client translates it to its wire format and back.
//
// The API key lives only in ModelSettings, in pages of its own (egress::SecretValue: out of
// core dumps, wiped when the last holder lets go), shared by every copy of the settings. It
// is copied to ordinary memory only by libcurl, which keeps a request's header line while
// sending it (http.cc). It never appears in a Status message, a log line, a ToString or a
// recorded request.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "egress/secrets.h"
#include "util/status.h"

namespace trybox::agent {

using Json = nlohmann::json;

struct ModelSettings {
  std::string provider;  // "anthropic" or "openai"
  std::string base_url;  // https://api.anthropic.com, or https://api.openai.com/v1
  // Null for a local server that needs no key (no credential header then). Copies of the
  // settings share the pages; the value is wiped when the last copy goes.
  std::shared_ptr<const egress::SecretValue> api_key;
  std::string model;
  std::string ca_file;  // extra CA bundle for a self-hosted endpoint; empty: the system's
  int max_output_tokens = 4096;
  std::chrono::milliseconds request_timeout{300000};
  int max_attempts = 5;  // per Send, counting retries of 429 / 5xx / transport failures

  // From the "model" object of a daemon request ({provider, base_url, api_key, model,
  // ca_file}); INVALID_ARGUMENT naming the field if one is missing or malformed (an unknown
  // provider, a base_url that is not http(s)://). Defaults base_url per provider when empty.
  // The key goes from the JSON string straight into its own pages; WipeKey then clears the
  // string.
  static Result<ModelSettings> FromJson(const Json& j);
  // The same object without the key: {"provider","base_url","model","key_set":bool}.
  Json Describe() const;
  bool has_key() const { return api_key != nullptr && !api_key->empty(); }
};

// A key in pages of its own, to be shared by the settings that hold it.
Result<std::shared_ptr<const egress::SecretValue>> MakeModelKey(std::string_view value);

// Overwrites the "api_key" string of a request's "model" object in place (what FromJson
// read), so that the request's copy does not outlive the parse. Anything else is left alone.
void WipeKey(Json* model);

// `text` with every occurrence of the settings' key replaced by "[api key]": a provider, or a
// transport's error text, may quote it back.
std::string ScrubKey(std::string text, const ModelSettings& settings);

struct ToolSpec {
  std::string name;
  std::string description;
  Json input_schema;  // a JSON Schema object
};

struct ToolCall {
  std::string id;  // the provider's id, echoed back in the result
  std::string name;
  Json input;  // the parsed arguments (an object) when they parsed
  // Non-empty when the arguments were not a JSON object (OpenAI sends them as a string that
  // may not parse): the loop answers the model with an error instead of running the tool.
  std::string input_error;
  std::string raw_arguments;  // as received, for the record
};

struct ToolResult {
  std::string call_id;
  std::string name;
  std::string content;  // already capped by the loop
  bool is_error = false;
};

// One entry of the provider-neutral transcript.
struct Entry {
  enum class Kind { kUser, kAssistant, kToolResults };
  Kind kind = Kind::kUser;
  std::string text;                 // kUser, kAssistant (may be empty with calls)
  std::vector<ToolCall> calls;      // kAssistant
  std::vector<ToolResult> results;  // kToolResults, in call order
};
Json EntryToJson(const Entry& e);
Result<Entry> EntryFromJson(const Json& j);

struct Usage {
  int64_t input_tokens = 0;  // all prompt tokens the provider counted, cached ones included
  int64_t output_tokens = 0;
};

struct Reply {
  std::string text;
  std::vector<ToolCall> calls;
  std::string stop_reason;  // the provider's own: end_turn / tool_use / max_tokens / stop ...
  Usage usage;
};

// Each way a Send can fail keeps its own name.
enum class Failure {
  kNone,
  kTransport,         // connect, TLS, reset: curl's own error text
  kTimeout,           // the request ran past request_timeout or the caller's deadline
  kAuth,              // 401 / 403
  kRateLimited,       // 429 still after the last attempt
  kServer,            // 5xx still after the last attempt
  kBadRequest,        // other 4xx
  kContextOverflow,   // the provider refused: the prompt is longer than its window
  kContextTruncated,  // the provider counted far fewer input tokens than were sent
  kProtocol,          // a 2xx body that is not the wire format
};
const char* FailureName(Failure f);  // "transport", "timeout", "auth", "rate_limited", ...

struct Outcome {
  Failure failure = Failure::kNone;
  std::string message;  // names the provider, the status and the provider's error text
  int http_status = 0;
  int attempts = 0;
  int64_t request_bytes = 0;  // the size of the last request body sent
  Reply reply;                // valid when failure == kNone
  bool ok() const { return failure == Failure::kNone; }
};

class HttpTransport;
struct HttpPost;

class ModelClient {
 public:
  virtual ~ModelClient() = default;
  static Result<std::unique_ptr<ModelClient>> Make(const ModelSettings& settings);
  // Sends through `transport` instead of libcurl (trybox-agent: through tryboxd, which
  // adds the credential on the wire; the settings then carry no key).
  static Result<std::unique_ptr<ModelClient>> Make(const ModelSettings& settings,
                                                   std::unique_ptr<HttpTransport> transport);

  // One model turn. Retries 429 and 5xx after Retry-After (or retry-after-ms, or backoff),
  // never past `deadline`. Checks the reply's input token count against what was sent
  // (kContextTruncated). Thread-compatible: one Send at a time per client.
  virtual Outcome Send(const std::string& system, const std::vector<Entry>& transcript,
                       const std::vector<ToolSpec>& tools,
                       std::optional<std::chrono::steady_clock::time_point> deadline) = 0;

  // The start-up probe: one request with a prompt of known size (about 64 KiB of text)
  // whose reported input tokens must match it. kContextTruncated if the provider counted
  // far fewer, naming both numbers.
  virtual Outcome Probe(std::optional<std::chrono::steady_clock::time_point> deadline) = 0;

  virtual const ModelSettings& settings() const = 0;
};

// The provider's endpoint for `settings`: its URL, and its headers (the key among them:
// never log them). What tryboxd uses to send a request trybox-agent built.
Result<HttpPost> ModelEndpoint(const ModelSettings& settings);

}  // namespace trybox::agent
