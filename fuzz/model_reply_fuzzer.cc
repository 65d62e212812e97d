// libFuzzer target for the model clients' parsers of provider bytes: a 2xx body and an
// error body in both wire formats, and a stored transcript entry. Invariants checked: no
// crash, no exception, and an entry that parses writes back to JSON that parses the same.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "agent/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using trybox::agent::Json;
  static const trybox::agent::ModelSettings settings = [] {
    trybox::agent::ModelSettings s;
    s.base_url = "http://127.0.0.1:1";
    s.model = "fuzz";
    return s;
  }();
  static const auto anthropic = trybox::agent::MakeAnthropicWire(settings);
  static const auto openai = trybox::agent::MakeOpenAiWire(settings);
  std::string in(reinterpret_cast<const char*>(data), size);
  Json j = Json::parse(in, nullptr, false);
  for (const auto* wire : {anthropic.get(), openai.get()}) {
    (void)wire->ParseError(in);
    if (!j.is_discarded()) (void)wire->ParseReply(j);
  }
  if (!j.is_discarded()) {
    auto e = trybox::agent::EntryFromJson(j);
    if (e.ok()) {
      Json out = trybox::agent::EntryToJson(*e);
      auto again = trybox::agent::EntryFromJson(Json::parse(out.dump()));
      if (!again.ok() || trybox::agent::EntryToJson(*again) != out) std::abort();
    }
  }
  return 0;
}
