// The Anthropic Messages API as we use it (docs/protocol/model.md).
#include "agent/wire.h"

namespace trybox::agent {
namespace {

class AnthropicWire : public Wire {
 public:
  explicit AnthropicWire(const ModelSettings& s) : s_(s) {}

  std::string Url() const override { return s_.base_url + "/v1/messages"; }

  std::vector<std::string> Headers() const override {
    return {"content-type: application/json", "anthropic-version: 2023-06-01"};
  }

  std::string CredentialHead() const override { return "x-api-key: "; }

  Json Request(const std::string& system, const std::vector<Entry>& transcript,
               const std::vector<ToolSpec>& tools, int max_tokens) const override {
    Json messages = Json::array();
    // Consecutive entries of one role (tool results, then the user's next words) become
    // one message: the API wants user and assistant turns to alternate.
    auto append = [&messages](const char* role, Json blocks) {
      if (blocks.empty()) return;
      if (!messages.empty() && messages.back()["role"] == role) {
        for (auto& b : blocks) messages.back()["content"].push_back(std::move(b));
      } else {
        messages.push_back({{"role", role}, {"content", std::move(blocks)}});
      }
    };
    for (const Entry& e : transcript) {
      Json blocks = Json::array();
      switch (e.kind) {
        case Entry::Kind::kUser:
          blocks.push_back({{"type", "text"}, {"text", e.text}});
          append("user", std::move(blocks));
          break;
        case Entry::Kind::kAssistant:
          // The API refuses empty text blocks.
          if (!e.text.empty()) blocks.push_back({{"type", "text"}, {"text", e.text}});
          for (const ToolCall& c : e.calls) {
            blocks.push_back({{"type", "tool_use"},
                              {"id", c.id},
                              {"name", c.name},
                              {"input", c.input.is_object() ? c.input : Json::object()}});
          }
          append("assistant", std::move(blocks));
          break;
        case Entry::Kind::kToolResults:
          for (const ToolResult& r : e.results) {
            blocks.push_back({{"type", "tool_result"},
                              {"tool_use_id", r.call_id},
                              {"content", r.content},
                              {"is_error", r.is_error}});
          }
          append("user", std::move(blocks));
          break;
      }
    }
    Json req = {{"model", s_.model}, {"max_tokens", max_tokens}, {"messages", messages}};
    if (!system.empty()) req["system"] = system;
    if (!tools.empty()) {
      Json t = Json::array();
      for (const ToolSpec& spec : tools) {
        t.push_back({{"name", spec.name},
                     {"description", spec.description},
                     {"input_schema", spec.input_schema}});
      }
      req["tools"] = std::move(t);
    }
    return req;
  }

  Result<Reply> ParseReply(const Json& body) const override {
    const Json* content = Member(body, "content");
    if (content == nullptr || !content->is_array()) {
      return InvalidArgument("no \"content\" array in the reply");
    }
    Reply r;
    for (const Json& block : *content) {
      std::string type = StringMember(block, "type");
      if (type == "text") {
        if (!r.text.empty()) r.text += "\n";
        r.text += StringMember(block, "text");
      } else if (type == "tool_use") {
        ToolCall c;
        c.id = StringMember(block, "id");
        c.name = StringMember(block, "name");
        if (c.id.empty() || c.name.empty()) {
          return InvalidArgument("a tool_use block without an id or a name");
        }
        const Json* input = Member(block, "input");
        if (input != nullptr)
          c.raw_arguments = input->dump(-1, ' ', false, Json::error_handler_t::replace);
        if (input != nullptr && input->is_object()) {
          c.input = *input;
        } else {
          c.input_error = "the tool input is not a JSON object";
        }
        r.calls.push_back(std::move(c));
      }
      // Other block types (thinking, ...) carry nothing the loop uses.
    }
    r.stop_reason = StringMember(body, "stop_reason");
    // Missing usage is a protocol error here: the Messages API always reports it, and the
    // truncation guard cannot work without it.
    const Json* usage = Member(body, "usage");
    const Json* input = usage != nullptr ? Member(*usage, "input_tokens") : nullptr;
    if (input == nullptr || !input->is_number_integer()) {
      return InvalidArgument("no usage.input_tokens in the reply");
    }
    r.usage.input_tokens = input->get<int64_t>();
    for (const char* cached : {"cache_creation_input_tokens", "cache_read_input_tokens"}) {
      const Json* n = Member(*usage, cached);
      if (n != nullptr && n->is_number_integer()) r.usage.input_tokens += n->get<int64_t>();
    }
    const Json* output = Member(*usage, "output_tokens");
    if (output != nullptr && output->is_number_integer()) {
      r.usage.output_tokens = output->get<int64_t>();
    }
    if (r.usage.input_tokens <= 0) return InvalidArgument("usage.input_tokens is zero");
    return r;
  }

  ProviderError ParseError(const std::string& body) const override {
    ProviderError e;
    Json j = Json::parse(body, nullptr, false);
    const Json* err = Member(j, "error");
    if (err == nullptr) {
      e.text = Printable(body);
    } else {
      std::string type = StringMember(*err, "type");
      std::string message = StringMember(*err, "message");
      e.text = Printable(type.empty() ? message : type + ": " + message);
      e.context_overflow = MentionsContextOverflow(message);
    }
    return e;
  }

 private:
  const ModelSettings s_;
};

}  // namespace

std::unique_ptr<Wire> MakeAnthropicWire(const ModelSettings& settings) {
  return std::make_unique<AnthropicWire>(settings);
}

}  // namespace trybox::agent
