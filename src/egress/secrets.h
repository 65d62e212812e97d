// Secrets that never enter the VM (docs/secrets.md). The guest sees a placeholder in the
// secret's variable; the egress proxy puts the real value in place of the placeholder only
// in requests to the hosts the secret is bound to, and refuses a request that carries a
// placeholder anywhere else.
//
// Ownership: a VM's SecretSet is built once at create and shared (immutable, thread-safe)
// by every connection of that VM. A request's declarations are held as HeldSecrets from the
// moment they are parsed (a vm_agent run keeps them for its verification VM). Real values
// live in SecretValue's own pages in both: locked in memory, excluded from core dumps,
// wiped when the holder goes.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "egress/allowlist.h"
#include "util/status.h"

namespace trybox::egress {

inline constexpr size_t kMaxSecretValue = 8 * 1024;
inline constexpr size_t kMaxSecrets = 64;
inline constexpr size_t kMinPlaceholder = 16;

// A real value in pages of its own (mmap'd, mlock'ed where allowed, MADV_DONTDUMP), wiped
// and unmapped on destruction. Move-only.
class SecretValue {
 public:
  SecretValue() = default;  // empty
  static Result<SecretValue> Copy(std::string_view value);
  // `head` followed by `value` in pages of their own: a header line built around a key
  // without the key passing through ordinary memory.
  static Result<SecretValue> Join(std::string_view head, std::string_view value);
  SecretValue(SecretValue&& o) noexcept;
  SecretValue& operator=(SecretValue&& o) noexcept;
  SecretValue(const SecretValue&) = delete;
  SecretValue& operator=(const SecretValue&) = delete;
  ~SecretValue();

  std::string_view view() const { return {data_, size_}; }
  // NUL-terminated (the pages past the value are zero); "" when empty.
  const char* c_str() const { return data_ != nullptr ? data_ : ""; }
  bool empty() const { return size_ == 0; }

 private:
  void Release();
  char* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
};

// What a caller declares for one secret (the daemon's create request carries these).
struct SecretInput {
  std::string name;                // the guest's variable: [A-Za-z_][A-Za-z0-9_]*
  std::string value;               // the real value: 1..kMaxSecretValue bytes, no NUL/CR/LF
  std::vector<std::string> hosts;  // "api.example.com", "*.example.com"; at least one
  bool body = false;               // substitute in request bodies too
  bool keep_cookies = false;       // pass Set-Cookie from its hosts through to the guest
  bool target = false;             // substitute in the request target (path and query) too
};

// Wipes every input's value (its whole buffer) and empties it.
void WipeSecretInputs(std::vector<SecretInput>* inputs);

// Declared secrets not yet made into a VM's SecretSet: the daemon's create and agent requests
// hold them so from parsing on, and a vm_agent run keeps them for its verification VM.
// Nothing is checked but that the values could be copied; SecretSet::Make checks the rest.
// Immutable once made; shared (std::shared_ptr<const HeldSecrets>) between threads.
class HeldSecrets {
 public:
  struct Entry {
    std::string name;
    SecretValue value;
    std::vector<std::string> hosts;
    bool body = false;
    bool keep_cookies = false;
    bool target = false;
  };
  // Copies each input's value into pages of its own and wipes the inputs' values, whether
  // it succeeds or not.
  static Result<std::shared_ptr<const HeldSecrets>> Hold(std::vector<SecretInput>* inputs);

  const std::vector<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<Entry> entries_;
};

struct Secret {
  std::string name;
  std::string placeholder;  // random; the same length and character class as the value
  SecretValue value;
  std::vector<AllowEntry> hosts;  // only host and wildcard are used; the port is not
  bool body = false;
  bool keep_cookies = false;
  bool target = false;  // put into the request target too, not only into headers

  bool BoundTo(const std::string& canonical_host) const;
};

class SecretSet {
 public:
  // Validates every input (names unique and well-formed, values within limits, hosts
  // parse); the error names the secret, never its value. Placeholders are drawn from the
  // kernel's random source. The inputs' values are wiped whether it succeeds or not.
  static Result<std::shared_ptr<const SecretSet>> Make(std::vector<SecretInput> inputs);
  // The same from held secrets: each value goes from its pages to the set's, never through
  // ordinary memory.
  static Result<std::shared_ptr<const SecretSet>> Make(const HeldSecrets& held);

  const std::vector<Secret>& secrets() const { return secrets_; }
  bool empty() const { return secrets_.empty(); }
  // True if any secret is bound to `canonical_host` (its connections are intercepted).
  bool BindsHost(const std::string& canonical_host) const;
  // NAME -> placeholder, for the guest's environment.
  std::map<std::string, std::string> GuestEnv() const;
  // The first secret whose placeholder occurs in `text` and that is not bound to
  // `canonical_host` (nullptr if none): such text must not be sent there.
  const Secret* ForeignPlaceholder(std::string_view text, const std::string& canonical_host) const;

 private:
  std::vector<Secret> secrets_;
};

// A placeholder for `value`: `value.size()` characters (at least kMinPlaceholder) drawn at
// random from the value's character class: lowercase hex, uppercase hex, or letters and
// digits (every other value). Never derived from the value's content.
Result<std::string> MakePlaceholder(std::string_view value);

}  // namespace trybox::egress
