// JSON at the daemon's edge: typed reads of untrusted objects (client requests and guest
// results), the one error shape, and result writers shared by the verbs.
//
// Nothing here throws on any input. Every accessor checks presence, type and range, and
// its error names the field ("'memory_mib' must be an integer from 128 to 65536"). Numbers
// are 64-bit; a JSON number with a fraction or an exponent is not an integer. Thread-safe
// (no state).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trybox::daemon {

using Json = nlohmann::json;

// {"ok":false,"error":{"code":"NOT_FOUND","message":...}} (+ "kind" when given: the guest's
// own error name for file verbs).
Json ErrorReply(const Status& st, const std::string& kind = "");

// Reads typed fields out of one JSON object. `what` prefixes field names in errors
// ("limits." gives "'limits.max_turns' must be ...").
class Fields {
 public:
  explicit Fields(const Json& object, std::string what = "");

  // kInvalidArgument unless the value is a JSON object.
  Status CheckObject() const;
  bool Has(const char* key) const;

  Result<std::string> String(const char* key) const;  // required
  Result<std::string> String(const char* key, const std::string& fallback) const;
  // Required when no fallback; in [lo, hi].
  Result<int64_t> Int(const char* key, int64_t lo, int64_t hi) const;
  Result<int64_t> Int(const char* key, int64_t lo, int64_t hi, int64_t fallback) const;
  Result<bool> Bool(const char* key, bool fallback) const;
  // An array of strings; empty when absent.
  Result<std::vector<std::string>> StringList(const char* key) const;
  // An object whose values are all strings; empty when absent.
  Result<std::map<std::string, std::string>> StringMap(const char* key) const;
  // The member as it is (null when absent), for sub-objects parsed elsewhere.
  const Json& Raw(const char* key) const;

 private:
  std::string Name(const char* key) const { return "'" + what_ + key + "'"; }
  const Json& object_;
  std::string what_;
};

// The value of an integer JSON number in [lo, hi], or nullopt (wrong type, fraction, range).
std::optional<int64_t> IntIn(const Json& v, int64_t lo, int64_t hi);

// The fields every listed VM and every exec result carries (docs/security.md, "Which facts
// are trustworthy"): "privileged", whether the VM was created --privileged (null when its
// record predates the store keeping it), and "trust", what its results are worth:
// "init" (trybox-init's report, which no command of an unprivileged VM can reach) or
// "guest_word" (a privileged VM, or one not known not to be: any command in it could have
// written the result).
void AddPrivilegeFields(Json& j, const std::optional<bool>& privileged);

}  // namespace trybox::daemon
