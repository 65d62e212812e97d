#include "api/api_keys.h"

#include <cmath>

#include "util/names.h"
#include "util/sha256.h"

namespace trybox::api {

namespace {
constexpr const char kPrefix[] = "e2b_";
constexpr size_t kHexDigits = 40;
}  // namespace

bool LooksLikeApiKey(const std::string& text) {
  if (text.size() != sizeof(kPrefix) - 1 + kHexDigits || text.rfind(kPrefix, 0) != 0) return false;
  for (size_t i = sizeof(kPrefix) - 1; i < text.size(); ++i) {
    const char c = text[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Result<NewKey> MakeApiKey(const std::string& name, const std::string& scope) {
  RETURN_IF_ERROR(ValidateName("API key name", name));
  if (scope != "sandboxes" && scope != "operator") {
    return InvalidArgument("an API key's scope is sandboxes or operator, not " + scope);
  }
  NewKey k;
  k.key = kPrefix + RandomHex(kHexDigits / 2);
  k.record.hash = Sha256Hex(k.key);
  k.record.id = "key-" + RandomHex(4);
  k.record.name = name;
  k.record.scope = scope;
  k.record.created_at = store::NowSeconds();
  return k;
}

Status KeyRing::Load() {
  ASSIGN_OR_RETURN(std::vector<store::ApiKeyRecord> keys, store_.ListApiKeys());
  MutexLock lock(mu_);
  by_hash_.clear();
  for (const auto& k : keys) by_hash_[k.hash] = {k.id, k.name, k.scope == "operator"};
  return Status::Ok();
}

Result<NewKey> KeyRing::Create(const std::string& name, const std::string& scope) {
  ASSIGN_OR_RETURN(NewKey k, MakeApiKey(name, scope));
  RETURN_IF_ERROR(store_.InsertApiKey(k.record));
  MutexLock lock(mu_);
  by_hash_[k.record.hash] = {k.record.id, k.record.name, k.record.scope == "operator"};
  return k;
}

Status KeyRing::Remove(const std::string& name) {
  ASSIGN_OR_RETURN(bool removed, store_.DeleteApiKey(name));
  if (!removed) return NotFound("no API key named " + name);
  MutexLock lock(mu_);
  for (auto it = by_hash_.begin(); it != by_hash_.end();) {
    it = it->second.name == name ? by_hash_.erase(it) : std::next(it);
  }
  return Status::Ok();
}

Result<std::vector<store::ApiKeyRecord>> KeyRing::List() { return store_.ListApiKeys(); }

std::optional<KeyIdentity> KeyRing::Check(const std::string& key) {
  if (!LooksLikeApiKey(key)) return std::nullopt;
  const std::string hash = Sha256Hex(key);
  MutexLock lock(mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  return it->second;
}

std::optional<KeyIdentity> KeyRing::ById(const std::string& id) {
  MutexLock lock(mu_);
  for (const auto& [hash, identity] : by_hash_) {
    if (identity.id == id) return identity;
  }
  return std::nullopt;
}

bool RateLimiter::Allow(const std::string& key_id, int* retry_after_s) {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(mu_);
  auto [it, fresh] = buckets_.try_emplace(key_id);
  Bucket& b = it->second;
  if (fresh) {
    b.tokens = burst_;
  } else {
    const double elapsed = std::chrono::duration<double>(now - b.last).count();
    b.tokens = std::min(burst_, b.tokens + elapsed * rate_);
  }
  b.last = now;
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return true;
  }
  if (retry_after_s != nullptr) {
    *retry_after_s = std::max(1, static_cast<int>(std::ceil((1 - b.tokens) / rate_)));
  }
  return false;
}

}  // namespace trybox::api
