#include "util/utf8.h"

#include <array>
#include <cstdint>
#include <cstdio>

namespace trybox {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 if there is none.
size_t ValidSequenceAt(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t v;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    v = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    v = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    v = c & 0x07;
  } else {
    return 0;  // a continuation byte, an overlong lead (C0, C1) or F5..FF
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(i + k) & 0x3F);
  }
  if ((n == 3 && v < 0x800) || (n == 4 && v < 0x10000) || (v >= 0xD800 && v <= 0xDFFF) ||
      v > 0x10FFFF) {
    return 0;
  }
  return n;
}

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = ValidSequenceAt(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string JsonSafe(std::string_view s) {
  if (IsValidUtf8(s)) return std::string(s);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 16);
  for (size_t i = 0; i < s.size();) {
    size_t n = ValidSequenceAt(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    unsigned char c = static_cast<unsigned char>(s[i++]);
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 0xF];
  }
  return out;
}

void SetBytesField(nlohmann::json& obj, const std::string& key, std::string_view bytes) {
  if (IsValidUtf8(bytes)) {
    obj[key] = std::string(bytes);
    if (obj.is_object()) obj.erase(key + "_b64");
    return;
  }
  obj[key] = JsonSafe(bytes);
  obj[key + "_b64"] = Base64Encode(bytes);
}

Result<std::string> GetBytesField(const nlohmann::json& obj, const std::string& key) {
  if (!obj.is_object()) return InvalidArgument("'" + key + "': not in an object");
  auto b64 = obj.find(key + "_b64");
  if (b64 != obj.end()) {
    if (!b64->is_string()) return InvalidArgument("'" + key + "_b64' must be a string");
    auto bytes = Base64Decode(b64->get_ref<const std::string&>());
    if (!bytes.ok()) return bytes.status().Annotate("'" + key + "_b64'");
    return bytes;
  }
  auto it = obj.find(key);
  if (it == obj.end()) return InvalidArgument("missing field '" + key + "'");
  if (!it->is_string()) return InvalidArgument("'" + key + "' must be a string");
  return it->get<std::string>();
}

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  auto byte = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(in[k])); };
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    for (int shift : {18, 12, 6, 0}) out += kAlphabet[(v >> shift) & 0x3F];
  }
  size_t rest = in.size() - i;
  if (rest == 1) {
    uint32_t v = byte(i) << 16;
    out += kAlphabet[(v >> 18) & 0x3F];
    out += kAlphabet[(v >> 12) & 0x3F];
    out += "==";
  } else if (rest == 2) {
    uint32_t v = byte(i) << 16 | byte(i + 1) << 8;
    out += kAlphabet[(v >> 18) & 0x3F];
    out += kAlphabet[(v >> 12) & 0x3F];
    out += kAlphabet[(v >> 6) & 0x3F];
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view in) {
  static const std::array<int8_t, 256> kValue = [] {
    std::array<int8_t, 256> t;
    t.fill(-1);
    for (int k = 0; k < 64; ++k)
      t[static_cast<unsigned char>(kAlphabet[k])] = static_cast<int8_t>(k);
    return t;
  }();
  if (in.size() % 4 != 0) return InvalidArgument("base64 length is not a multiple of 4");
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    bool last = i + 4 == in.size();
    size_t pad = 0;
    if (last) pad = (in[i + 3] == '=') + (in[i + 2] == '=' && in[i + 3] == '=');
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      int8_t d = k < 4 - pad ? kValue[static_cast<unsigned char>(in[i + k])] : 0;
      if (d < 0) return InvalidArgument("not base64");
      v = v << 6 | static_cast<uint32_t>(d);
    }
    out += static_cast<char>(v >> 16);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(v & 0xFF);
    // Bits below the last byte must be zero, so each byte string has exactly one encoding.
    if ((pad == 1 && (v & 0xFF) != 0) || (pad == 2 && (v & 0xFFFF) != 0)) {
      return InvalidArgument("not canonical base64");
    }
  }
  return out;
}

std::string HexEncode(std::string_view bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

size_t WholeUtf8Prefix(std::string_view s) {
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? s.size() - back : s.size();
  }
  return s.size();
}

std::optional<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}

std::string OneLine(std::string_view s) {
  std::string clean = JsonSafe(s);
  std::string out;
  out.reserve(clean.size());
  for (size_t i = 0; i < clean.size();) {
    size_t n = ValidSequenceAt(clean, i);
    uint32_t cp = static_cast<unsigned char>(clean[i]);
    if (n == 2) cp = (cp & 0x1Fu) << 6 | (clean[i + 1] & 0x3Fu);
    if (n == 3) cp = (cp & 0x0Fu) << 12 | (clean[i + 1] & 0x3Fu) << 6 | (clean[i + 2] & 0x3Fu);
    bool unsafe = (cp < 0x20 && cp != '\t') || (cp >= 0x7F && cp <= 0x9F) || cp == 0x2028 ||
                  cp == 0x2029 || (cp >= 0x202A && cp <= 0x202E) ||
                  (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200E || cp == 0x200F || cp == 0x061C;
    if (unsafe) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\u{%04X}", cp);
      out += buf;
    } else {
      out.append(clean, i, n);
    }
    i += n;
  }
  return out;
}

std::string SafeDump(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace trybox
