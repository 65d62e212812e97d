// Internal to src/agent: the two wire formats behind ModelClient (docs/protocol/model.md).
// A Wire only translates: the neutral transcript to a request body, a 2xx body to a Reply,
// an error body to the provider's text. Sending, retrying and the truncation guard are the
// client's (model.cc). Stateless after construction; safe to share between threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/model.h"

namespace trybox::agent {

struct ProviderError {
  std::string text;               // "type: message" as the provider wrote it, capped
  bool context_overflow = false;  // the provider said the prompt exceeds its window
};

class Wire {
 public:
  virtual ~Wire() = default;
  virtual std::string Url() const = 0;
  // The headers besides the credential.
  virtual std::vector<std::string> Headers() const = 0;
  // What precedes the key in its header line: "x-api-key: ", "authorization: Bearer ".
  virtual std::string CredentialHead() const = 0;
  virtual Json Request(const std::string& system, const std::vector<Entry>& transcript,
                       const std::vector<ToolSpec>& tools, int max_tokens) const = 0;
  // A 2xx body. INVALID_ARGUMENT naming the missing or malformed field. Reply::usage is
  // all zero when the provider did not report usage (OpenAI-compatible servers may not).
  virtual Result<Reply> ParseReply(const Json& body) const = 0;
  // A non-2xx body, JSON or not.
  virtual ProviderError ParseError(const std::string& body) const = 0;
};

std::unique_ptr<Wire> MakeAnthropicWire(const ModelSettings& settings);
std::unique_ptr<Wire> MakeOpenAiWire(const ModelSettings& settings);

// Helpers the wires share.
// The member `name` of `j` if `j` is an object that has it, else nullptr (never throws).
const Json* Member(const Json& j, const char* name);
// The string member `name`, or "" when absent or not a string.
std::string StringMember(const Json& j, const char* name);
// Non-printable bytes replaced by '?', cut to `max` bytes: for quoting a body in an error.
std::string Printable(std::string_view s, size_t max = 300);
// Whether an error text says the prompt is longer than the model's context window, in any
// of the phrasings the providers and local servers use.
bool MentionsContextOverflow(std::string_view text);

}  // namespace trybox::agent
