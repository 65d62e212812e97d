// The OpenAI-compatible chat completions API as we use it (docs/protocol/model.md). Also
// what Ollama, vLLM and llama.cpp serve under /v1.
#include "agent/wire.h"

namespace trybox::agent {
namespace {

constexpr auto kReplace = Json::error_handler_t::replace;

// The arguments of one tool call: the API sends them as a JSON string that the model wrote
// and that may not parse. Some local servers send an object instead; both are accepted.
void ParseArguments(const Json* args, ToolCall& c) {
  if (args == nullptr) {
    c.input_error = "the tool call has no arguments";
    return;
  }
  if (args->is_object()) {
    c.input = *args;
    c.raw_arguments = args->dump(-1, ' ', false, kReplace);
    return;
  }
  if (!args->is_string()) {
    c.raw_arguments = args->dump(-1, ' ', false, kReplace);
    c.input_error = "the tool arguments are not a JSON string or object";
    return;
  }
  c.raw_arguments = args->get<std::string>();
  Json parsed = Json::parse(c.raw_arguments, nullptr, false);
  if (parsed.is_discarded()) {
    c.input_error = "the tool arguments are not valid JSON";
  } else if (!parsed.is_object()) {
    c.input_error = "the tool arguments are not a JSON object";
  } else {
    c.input = std::move(parsed);
  }
}

class OpenAiWire : public Wire {
 public:
  explicit OpenAiWire(const ModelSettings& s) : s_(s) {}

  std::string Url() const override { return s_.base_url + "/chat/completions"; }

  std::vector<std::string> Headers() const override { return {"content-type: application/json"}; }

  std::string CredentialHead() const override { return "authorization: Bearer "; }

  Json Request(const std::string& system, const std::vector<Entry>& transcript,
               const std::vector<ToolSpec>& tools, int max_tokens) const override {
    Json messages = Json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
    for (const Entry& e : transcript) {
      switch (e.kind) {
        case Entry::Kind::kUser:
          messages.push_back({{"role", "user"}, {"content", e.text}});
          break;
        case Entry::Kind::kAssistant: {
          Json m = {{"role", "assistant"}};
          m["content"] = e.text.empty() && !e.calls.empty() ? Json(nullptr) : Json(e.text);
          if (!e.calls.empty()) {
            Json calls = Json::array();
            for (const ToolCall& c : e.calls) {
              // Echo what the model wrote, even when it did not parse: the error the loop
              // answered with refers to it.
              std::string args = !c.raw_arguments.empty() ? c.raw_arguments
                                 : c.input.is_object()    ? c.input.dump(-1, ' ', false, kReplace)
                                                          : "{}";
              calls.push_back({{"id", c.id},
                               {"type", "function"},
                               {"function", {{"name", c.name}, {"arguments", args}}}});
            }
            m["tool_calls"] = std::move(calls);
          }
          messages.push_back(std::move(m));
          break;
        }
        case Entry::Kind::kToolResults:
          // The format has no error flag on a tool message; the loop's words must say so.
          for (const ToolResult& r : e.results) {
            messages.push_back({{"role", "tool"},
                                {"tool_call_id", r.call_id},
                                {"content", r.is_error ? "error: " + r.content : r.content}});
          }
          break;
      }
    }
    Json req = {{"model", s_.model}, {"max_tokens", max_tokens}, {"messages", messages}};
    if (!tools.empty()) {
      Json t = Json::array();
      for (const ToolSpec& spec : tools) {
        t.push_back({{"type", "function"},
                     {"function",
                      {{"name", spec.name},
                       {"description", spec.description},
                       {"parameters", spec.input_schema}}}});
      }
      req["tools"] = std::move(t);
    }
    return req;
  }

  Result<Reply> ParseReply(const Json& body) const override {
    const Json* choices = Member(body, "choices");
    if (choices == nullptr || !choices->is_array() || choices->empty()) {
      return InvalidArgument("no \"choices\" in the reply");
    }
    const Json& choice = (*choices)[0];
    const Json* message = Member(choice, "message");
    if (message == nullptr || !message->is_object()) {
      return InvalidArgument("no choices[0].message in the reply");
    }
    Reply r;
    r.text = StringMember(*message, "content");  // null with tool calls
    r.stop_reason = StringMember(choice, "finish_reason");
    if (const Json* calls = Member(*message, "tool_calls"); calls != nullptr && !calls->is_null()) {
      if (!calls->is_array()) return InvalidArgument("tool_calls is not an array");
      for (const Json& call : *calls) {
        ToolCall c;
        c.id = StringMember(call, "id");
        // Some local servers leave the id out; the result still needs one to refer to.
        if (c.id.empty()) c.id = "call_" + std::to_string(r.calls.size());
        const Json* fn = Member(call, "function");
        if (fn == nullptr) return InvalidArgument("a tool call without \"function\"");
        c.name = StringMember(*fn, "name");
        if (c.name.empty()) return InvalidArgument("a tool call without a function name");
        ParseArguments(Member(*fn, "arguments"), c);
        r.calls.push_back(std::move(c));
      }
    }
    // Usage is optional on compatible servers: left at zero, which the probe refuses.
    if (const Json* usage = Member(body, "usage"); usage != nullptr) {
      const Json* in = Member(*usage, "prompt_tokens");
      const Json* out = Member(*usage, "completion_tokens");
      if (in != nullptr && in->is_number_integer()) r.usage.input_tokens = in->get<int64_t>();
      if (out != nullptr && out->is_number_integer()) r.usage.output_tokens = out->get<int64_t>();
    }
    return r;
  }

  ProviderError ParseError(const std::string& body) const override {
    ProviderError e;
    Json j = Json::parse(body, nullptr, false);
    const Json* err = Member(j, "error");
    if (err == nullptr) {
      e.text = Printable(body);
    } else if (err->is_string()) {  // Ollama: {"error": "..."}
      e.text = Printable(err->get<std::string>());
      e.context_overflow = MentionsContextOverflow(e.text);
    } else {
      std::string code = StringMember(*err, "code");
      std::string message = StringMember(*err, "message");
      e.text = Printable(code.empty() ? message : code + ": " + message);
      e.context_overflow = code == "context_length_exceeded" || MentionsContextOverflow(message);
    }
    return e;
  }

 private:
  const ModelSettings s_;
};

}  // namespace

std::unique_ptr<Wire> MakeOpenAiWire(const ModelSettings& settings) {
  return std::make_unique<OpenAiWire>(settings);
}

}  // namespace trybox::agent
