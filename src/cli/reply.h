// Typed reads of tryboxd's replies (END, EVENT and RESET bodies) on the client side.
//
// The daemon at the other end is ours (client.h checks its uid) but may be older, newer or
// wrong: a field of the wrong type, or a required field missing, is an error value naming the
// field ("malformed reply from tryboxd: 'vm.id' must be a string"), never an exception, and
// the CLI exits 125 with it. Fields are named by their dotted path from the body
// ("collect.changes[3].path").
//
// A ReplyView does not own the JSON it looks at: the body must outlive it and every view
// taken from it. Copyable and cheap; not for use across threads while the body changes.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trybox::cli {

// "malformed reply from tryboxd: 'FIELD' MUST" (kInternal).
Status MalformedReply(const std::string& field, const std::string& must);

// The error for a RESET from tryboxd: kUnavailable "tryboxd aborted WHAT: REASON" (or a
// malformed-reply error if its reason is not a string).
Status StatusFromReset(const nlohmann::json& body, const std::string& what);

class ReplyView {
 public:
  // `path` names `json` in messages ("" for a whole body).
  explicit ReplyView(const nlohmann::json& json, std::string path = "")
      : json_(&json), path_(std::move(path)) {}

  const nlohmann::json& json() const { return *json_; }
  const std::string& path() const { return path_; }
  // The dotted name of `key` below this view.
  std::string Name(std::string_view key) const;
  // Present and not null.
  bool Has(std::string_view key) const;

  // Required fields: missing, null or another type is an error.
  Result<std::string> String(std::string_view key) const;
  Result<int64_t> Int(std::string_view key, int64_t min = std::numeric_limits<int64_t>::min(),
                      int64_t max = std::numeric_limits<int64_t>::max()) const;
  Result<double> Number(std::string_view key) const;  // an integer or a finite float
  Result<bool> Bool(std::string_view key) const;
  Result<ReplyView> Object(std::string_view key) const;
  // An array whose elements are all objects.
  Result<std::vector<ReplyView>> Objects(std::string_view key) const;
  // An array (of anything), as JSON.
  Result<const nlohmann::json*> Array(std::string_view key) const;
  // An array whose elements are all strings.
  Result<std::vector<std::string>> Strings(std::string_view key) const;

  // Optional fields: missing or null gives the fallback; another type is still an error.
  Result<std::string> StringOr(std::string_view key, std::string fallback) const;
  Result<int64_t> IntOr(std::string_view key, int64_t fallback,
                        int64_t min = std::numeric_limits<int64_t>::min(),
                        int64_t max = std::numeric_limits<int64_t>::max()) const;
  Result<bool> BoolOr(std::string_view key, bool fallback) const;
  Result<std::optional<ReplyView>> OptionalObject(std::string_view key) const;
  Result<std::optional<std::string>> OptionalString(std::string_view key) const;
  Result<std::vector<ReplyView>> ObjectsOrEmpty(std::string_view key) const;

 private:
  // The field, or null if this view is not an object or lacks it.
  const nlohmann::json* Find(std::string_view key) const;
  Status NotAnObject() const;

  const nlohmann::json* json_;
  std::string path_;
};

}  // namespace trybox::cli
