// The HTTP API's keys (docs/protocol/http.md, "Keys"): made by `trybox api-key create`,
// shown once, kept only as their SHA-256 in the store, checked on every request; and a
// per-key rate limit.
//
// A key is "e2b_" and 40 lowercase hex digits (160 random bits): the shape E2B's SDKs check
// before they send one, so an unmodified SDK takes a trybox key as it is.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "store/store.h"
#include "util/mutex.h"
#include "util/status.h"

namespace trybox::api {

struct KeyIdentity {
  std::string id;  // public: names the key in logs, listings and ownership
  std::string name;
  bool operator_scope = false;  // scope "operator" (store::ApiKeyRecord::scope)
};

struct NewKey {
  std::string key;  // shown once, never stored
  store::ApiKeyRecord record;
};

// A fresh key named `name` (a name as names.h checks it).
// `scope`: "sandboxes" or "operator".
Result<NewKey> MakeApiKey(const std::string& name, const std::string& scope = "sandboxes");
// Whether `text` has a key's shape (a cheap check before any lookup).
bool LooksLikeApiKey(const std::string& text);

// The keys in force, loaded from the store and kept in step with it. Thread-safe.
class KeyRing {
 public:
  explicit KeyRing(store::Store& store) : store_(store) {}
  Status Load() EXCLUDES(mu_);
  // Creates and records a key; ALREADY_EXISTS for a name in use.
  Result<NewKey> Create(const std::string& name, const std::string& scope = "sandboxes")
      EXCLUDES(mu_);
  // NOT_FOUND when no key has that name.
  Status Remove(const std::string& name) EXCLUDES(mu_);
  Result<std::vector<store::ApiKeyRecord>> List();
  // The key's identity, or nothing for a key that is unknown, revoked or malformed.
  std::optional<KeyIdentity> Check(const std::string& key) EXCLUDES(mu_);
  // The identity of the key with public id `id`, or nothing once it is removed (a dashboard
  // session names its key by id: docs/dashboard.md).
  std::optional<KeyIdentity> ById(const std::string& id) EXCLUDES(mu_);

 private:
  store::Store& store_;
  Mutex mu_;
  std::map<std::string, KeyIdentity> by_hash_ GUARDED_BY(mu_);
};

// A token bucket per key: `per_second` requests on average, bursts of `burst`.
class RateLimiter {
 public:
  RateLimiter(double per_second, double burst) : rate_(per_second), burst_(burst) {}
  // Whether one more request from `key_id` may go now; if not, `retry_after_s` says when.
  bool Allow(const std::string& key_id, int* retry_after_s) EXCLUDES(mu_);

 private:
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point last;
  };
  const double rate_;
  const double burst_;
  Mutex mu_;
  std::map<std::string, Bucket> buckets_ GUARDED_BY(mu_);
};

}  // namespace trybox::api
