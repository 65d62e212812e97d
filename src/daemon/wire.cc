#include "daemon/wire.h"

#include "util/names.h"

namespace trybox::daemon {

Json ErrorReply(const Status& st, const std::string& kind) {
  Json error = {{"code", CodeName(st.code())}, {"message", st.message()}};
  if (!kind.empty()) error["kind"] = kind;
  return {{"ok", false}, {"error", error}};
}

std::optional<int64_t> IntIn(const Json& v, int64_t lo, int64_t hi) {
  int64_t n;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    n = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    n = v.get<int64_t>();
  } else {
    return std::nullopt;
  }
  if (n < lo || n > hi) return std::nullopt;
  return n;
}

Fields::Fields(const Json& object, std::string what) : object_(object), what_(std::move(what)) {}

Status Fields::CheckObject() const {
  if (object_.is_object()) return Status::Ok();
  return InvalidArgument(what_.empty()
                             ? std::string("the request must be a JSON object")
                             : "'" + what_.substr(0, what_.size() - 1) + "' must be an object");
}

bool Fields::Has(const char* key) const {
  return object_.is_object() && object_.contains(key) && !object_[key].is_null();
}

const Json& Fields::Raw(const char* key) const {
  static const Json kNull;
  if (!Has(key)) return kNull;
  return object_[key];
}

Result<std::string> Fields::String(const char* key) const {
  if (!Has(key)) return InvalidArgument("missing field " + Name(key));
  const Json& v = object_[key];
  if (!v.is_string()) return InvalidArgument(Name(key) + " must be a string");
  return v.get<std::string>();
}

Result<std::string> Fields::String(const char* key, const std::string& fallback) const {
  if (!Has(key)) return fallback;
  return String(key);
}

Result<int64_t> Fields::Int(const char* key, int64_t lo, int64_t hi) const {
  if (!Has(key)) return InvalidArgument("missing field " + Name(key));
  const Json& v = object_[key];
  if (auto n = IntIn(v, lo, hi)) return *n;
  std::string got = v.is_number() ? v.dump() : std::string(v.type_name());
  return InvalidArgument(Name(key) + " must be an integer from " + std::to_string(lo) + " to " +
                         std::to_string(hi) + ", got " + got.substr(0, 40));
}

Result<int64_t> Fields::Int(const char* key, int64_t lo, int64_t hi, int64_t fallback) const {
  if (!Has(key)) return fallback;
  return Int(key, lo, hi);
}

Result<bool> Fields::Bool(const char* key, bool fallback) const {
  if (!Has(key)) return fallback;
  const Json& v = object_[key];
  if (!v.is_boolean()) return InvalidArgument(Name(key) + " must be true or false");
  return v.get<bool>();
}

Result<std::vector<std::string>> Fields::StringList(const char* key) const {
  std::vector<std::string> out;
  if (!Has(key)) return out;
  const Json& v = object_[key];
  if (!v.is_array()) return InvalidArgument(Name(key) + " must be an array of strings");
  for (const auto& e : v) {
    if (!e.is_string()) return InvalidArgument(Name(key) + " must be an array of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

Result<std::map<std::string, std::string>> Fields::StringMap(const char* key) const {
  std::map<std::string, std::string> out;
  if (!Has(key)) return out;
  const Json& v = object_[key];
  if (!v.is_object()) return InvalidArgument(Name(key) + " must be an object of strings");
  for (const auto& [k, e] : v.items()) {
    if (!e.is_string()) {
      return InvalidArgument(Name(key) + " must be an object of strings (" +
                             QuoteForMessage(k, 64) + " is not)");
    }
    out[k] = e.get<std::string>();
  }
  return out;
}

void AddPrivilegeFields(Json& j, const std::optional<bool>& privileged) {
  j["privileged"] = privileged ? Json(*privileged) : Json(nullptr);
  j["trust"] = privileged == false ? "init" : "guest_word";
}

}  // namespace trybox::daemon
