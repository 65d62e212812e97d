// Reading fields of JSON that may be malformed (it came from a guest, a peer, or a file
// written by another version) without throwing: a missing key or one of another type gives
// the fallback. For input that must be rejected instead, use a strict parser
// (daemon/wire.h, guest/requests.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace trybox {

inline std::string StrOr(const nlohmann::json& j, const char* key, std::string fallback = "") {
  if (j.is_object() && j.contains(key) && j[key].is_string()) return j[key].get<std::string>();
  return fallback;
}

inline bool BoolOr(const nlohmann::json& j, const char* key, bool fallback = false) {
  if (j.is_object() && j.contains(key) && j[key].is_boolean()) return j[key].get<bool>();
  return fallback;
}

// Integers only (a number with a fraction gives the fallback), within int64_t.
inline int64_t IntOr(const nlohmann::json& j, const char* key, int64_t fallback = 0) {
  if (!j.is_object() || !j.contains(key)) return fallback;
  const nlohmann::json& v = j[key];
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    return u > static_cast<uint64_t>(INT64_MAX) ? fallback : static_cast<int64_t>(u);
  }
  return v.is_number_integer() ? v.get<int64_t>() : fallback;
}

inline double NumOr(const nlohmann::json& j, const char* key, double fallback = 0) {
  if (j.is_object() && j.contains(key) && j[key].is_number()) return j[key].get<double>();
  return fallback;
}

}  // namespace trybox
