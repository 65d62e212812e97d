#include "cli/reply.h"

#include <cmath>

namespace trybox::cli {

using Json = nlohmann::json;

Status MalformedReply(const std::string& field, const std::string& must) {
  return Internal("malformed reply from tryboxd: '" + field + "' " + must);
}

Status StatusFromReset(const Json& body, const std::string& what) {
  auto reason = ReplyView(body).StringOr("reason", "no reason given");
  if (!reason.ok()) return reason.status();
  return Unavailable("tryboxd aborted " + what + ": " + *reason);
}

std::string ReplyView::Name(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

const Json* ReplyView::Find(std::string_view key) const {
  if (!json_->is_object()) return nullptr;
  auto it = json_->find(key);
  return it == json_->end() ? nullptr : &*it;
}

bool ReplyView::Has(std::string_view key) const {
  const Json* j = Find(key);
  return j && !j->is_null();
}

Status ReplyView::NotAnObject() const {
  return MalformedReply(path_.empty() ? "(body)" : path_, "must be an object");
}

Result<std::string> ReplyView::String(std::string_view key) const {
  if (!json_->is_object()) return NotAnObject();
  const Json* j = Find(key);
  if (!j || !j->is_string()) return MalformedReply(Name(key), "must be a string");
  return j->get<std::string>();
}

Result<int64_t> ReplyView::Int(std::string_view key, int64_t min, int64_t max) const {
  if (!json_->is_object()) return NotAnObject();
  const Json* j = Find(key);
  auto range = [&] {
    return MalformedReply(
        Name(key), "must be an integer from " + std::to_string(min) + " to " + std::to_string(max));
  };
  if (!j || !j->is_number_integer()) return range();
  int64_t v;
  if (j->is_number_unsigned()) {
    uint64_t u = j->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return range();
    v = static_cast<int64_t>(u);
  } else {
    v = j->get<int64_t>();
  }
  if (v < min || v > max) return range();
  return v;
}

Result<double> ReplyView::Number(std::string_view key) const {
  if (!json_->is_object()) return NotAnObject();
  const Json* j = Find(key);
  if (!j || !j->is_number()) return MalformedReply(Name(key), "must be a number");
  double v = j->get<double>();
  if (!std::isfinite(v)) return MalformedReply(Name(key), "must be a finite number");
  return v;
}

Result<bool> ReplyView::Bool(std::string_view key) const {
  if (!json_->is_object()) return NotAnObject();
  const Json* j = Find(key);
  if (!j || !j->is_boolean()) return MalformedReply(Name(key), "must be true or false");
  return j->get<bool>();
}

Result<ReplyView> ReplyView::Object(std::string_view key) const {
  if (!json_->is_object()) return NotAnObject();
  const Json* j = Find(key);
  if (!j || !j->is_object()) return MalformedReply(Name(key), "must be an object");
  return ReplyView(*j, Name(key));
}

Result<const Json*> ReplyView::Array(std::string_view key) const {
  if (!json_->is_object()) return NotAnObject();
  const Json* j = Find(key);
  if (!j || !j->is_array()) return MalformedReply(Name(key), "must be an array");
  return j;
}

Result<std::vector<ReplyView>> ReplyView::Objects(std::string_view key) const {
  ASSIGN_OR_RETURN(const Json* a, Array(key));
  std::vector<ReplyView> out;
  out.reserve(a->size());
  for (size_t i = 0; i < a->size(); ++i) {
    std::string name = Name(key) + "[" + std::to_string(i) + "]";
    if (!(*a)[i].is_object()) return MalformedReply(name, "must be an object");
    out.emplace_back((*a)[i], std::move(name));
  }
  return out;
}

Result<std::vector<std::string>> ReplyView::Strings(std::string_view key) const {
  ASSIGN_OR_RETURN(const Json* a, Array(key));
  std::vector<std::string> out;
  out.reserve(a->size());
  for (size_t i = 0; i < a->size(); ++i) {
    if (!(*a)[i].is_string()) {
      return MalformedReply(Name(key) + "[" + std::to_string(i) + "]", "must be a string");
    }
    out.push_back((*a)[i].get<std::string>());
  }
  return out;
}

Result<std::string> ReplyView::StringOr(std::string_view key, std::string fallback) const {
  if (!json_->is_object()) return NotAnObject();
  if (!Has(key)) return fallback;
  return String(key);
}

Result<int64_t> ReplyView::IntOr(std::string_view key, int64_t fallback, int64_t min,
                                 int64_t max) const {
  if (!json_->is_object()) return NotAnObject();
  if (!Has(key)) return fallback;
  return Int(key, min, max);
}

Result<bool> ReplyView::BoolOr(std::string_view key, bool fallback) const {
  if (!json_->is_object()) return NotAnObject();
  if (!Has(key)) return fallback;
  return Bool(key);
}

Result<std::optional<ReplyView>> ReplyView::OptionalObject(std::string_view key) const {
  if (!json_->is_object()) return NotAnObject();
  if (!Has(key)) return std::optional<ReplyView>();
  ASSIGN_OR_RETURN(ReplyView v, Object(key));
  return std::optional<ReplyView>(std::move(v));
}

Result<std::optional<std::string>> ReplyView::OptionalString(std::string_view key) const {
  if (!json_->is_object()) return NotAnObject();
  if (!Has(key)) return std::optional<std::string>();
  ASSIGN_OR_RETURN(std::string s, String(key));
  return std::optional<std::string>(std::move(s));
}

Result<std::vector<ReplyView>> ReplyView::ObjectsOrEmpty(std::string_view key) const {
  if (!json_->is_object()) return NotAnObject();
  if (!Has(key)) return std::vector<ReplyView>();
  return Objects(key);
}

}  // namespace trybox::cli
