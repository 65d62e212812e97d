// The neutral transcript's own JSON (docs/protocol/model.md), stored by the daemon for resume.
#include "agent/model.h"
#include "agent/wire.h"

namespace trybox::agent {

Json EntryToJson(const Entry& e) {
  switch (e.kind) {
    case Entry::Kind::kUser:
      return {{"kind", "user"}, {"text", e.text}};
    case Entry::Kind::kAssistant: {
      Json calls = Json::array();
      for (const ToolCall& c : e.calls) {
        Json jc = {{"id", c.id}, {"name", c.name}, {"input", c.input}};
        if (!c.input_error.empty()) jc["input_error"] = c.input_error;
        if (!c.raw_arguments.empty()) jc["raw_arguments"] = c.raw_arguments;
        calls.push_back(std::move(jc));
      }
      return {{"kind", "assistant"}, {"text", e.text}, {"calls", std::move(calls)}};
    }
    case Entry::Kind::kToolResults: {
      Json results = Json::array();
      for (const ToolResult& r : e.results) {
        results.push_back({{"call_id", r.call_id},
                           {"name", r.name},
                           {"content", r.content},
                           {"is_error", r.is_error}});
      }
      return {{"kind", "tool_results"}, {"results", std::move(results)}};
    }
  }
  return Json();
}

namespace {

Status EntryString(const Json& j, const char* name, std::string* out) {
  const Json* m = Member(j, name);
  if (m == nullptr) return Status::Ok();
  if (!m->is_string()) return InvalidArgument(std::string("entry.") + name + " is not a string");
  *out = m->get<std::string>();
  return Status::Ok();
}

}  // namespace

Result<Entry> EntryFromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("entry is not an object");
  std::string kind = StringMember(j, "kind");
  Entry e;
  if (kind == "user") {
    e.kind = Entry::Kind::kUser;
    RETURN_IF_ERROR(EntryString(j, "text", &e.text));
  } else if (kind == "assistant") {
    e.kind = Entry::Kind::kAssistant;
    RETURN_IF_ERROR(EntryString(j, "text", &e.text));
    const Json* calls = Member(j, "calls");
    if (calls != nullptr && !calls->is_array())
      return InvalidArgument("entry.calls is not an array");
    for (const Json& jc : calls != nullptr ? *calls : Json::array()) {
      ToolCall c;
      RETURN_IF_ERROR(EntryString(jc, "id", &c.id));
      RETURN_IF_ERROR(EntryString(jc, "name", &c.name));
      RETURN_IF_ERROR(EntryString(jc, "input_error", &c.input_error));
      RETURN_IF_ERROR(EntryString(jc, "raw_arguments", &c.raw_arguments));
      if (c.id.empty() || c.name.empty())
        return InvalidArgument("entry call without an id or name");
      if (const Json* in = Member(jc, "input")) c.input = *in;
      e.calls.push_back(std::move(c));
    }
  } else if (kind == "tool_results") {
    e.kind = Entry::Kind::kToolResults;
    const Json* results = Member(j, "results");
    if (results == nullptr || !results->is_array()) {
      return InvalidArgument("entry.results is not an array");
    }
    for (const Json& jr : *results) {
      ToolResult r;
      RETURN_IF_ERROR(EntryString(jr, "call_id", &r.call_id));
      RETURN_IF_ERROR(EntryString(jr, "name", &r.name));
      RETURN_IF_ERROR(EntryString(jr, "content", &r.content));
      if (r.call_id.empty()) return InvalidArgument("entry result without a call_id");
      if (const Json* err = Member(jr, "is_error")) {
        if (!err->is_boolean()) return InvalidArgument("entry.results[].is_error is not a bool");
        r.is_error = err->get<bool>();
      }
      e.results.push_back(std::move(r));
    }
  } else {
    return InvalidArgument("entry.kind '" + Printable(kind, 40) +
                           "' is not user, assistant or tool_results");
  }
  return e;
}

}  // namespace trybox::agent
