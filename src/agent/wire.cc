#include "agent/wire.h"

#include <algorithm>
#include <cctype>

#include "util/ascii.h"

namespace trybox::agent {

const Json* Member(const Json& j, const char* name) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(name);
  return it == j.end() ? nullptr : &*it;
}

std::string StringMember(const Json& j, const char* name) {
  const Json* m = Member(j, name);
  return m != nullptr && m->is_string() ? m->get<std::string>() : std::string();
}

std::string Printable(std::string_view s, size_t max) {
  std::string out;
  for (char c : s.substr(0, max)) {
    auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) || u >= 0x80 ? c : '?';
  }
  if (s.size() > max) out += "...";
  return out;
}

bool MentionsContextOverflow(std::string_view text) {
  const std::string t = AsciiLower(text);
  auto has = [&t](const char* s) { return t.find(s) != std::string::npos; };
  // Anthropic: "prompt is too long: 210000 tokens > 200000 maximum". OpenAI:
  // "context_length_exceeded" / "This model's maximum context length is ...". llama.cpp:
  // "the request exceeds the available context size".
  return has("prompt is too long") || has("context_length_exceeded") ||
         (has("context") && (has("exceed") || has("too long") || has("maximum context")));
}

}  // namespace trybox::agent
