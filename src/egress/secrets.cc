#include "egress/secrets.h"

#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

namespace trybox::egress {
namespace {

size_t PageSize() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }

bool IsName(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  auto head = [](char c) { return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); };
  auto tail = [&](char c) { return head(c) || (c >= '0' && c <= '9'); };
  return head(s[0]) && std::all_of(s.begin() + 1, s.end(), tail);
}

Status RandomFill(unsigned char* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t got = ::getrandom(out + done, n - done, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("getrandom");
    }
    done += static_cast<size_t>(got);
  }
  return Status::Ok();
}

}  // namespace

Result<SecretValue> SecretValue::Copy(std::string_view value) { return Join({}, value); }

Result<SecretValue> SecretValue::Join(std::string_view head, std::string_view value) {
  SecretValue v;
  const size_t size = head.size() + value.size();
  size_t page = PageSize();
  // One byte more than the text, so that a NUL always follows it (c_str()).
  v.mapped_ = (size + 1 + page - 1) / page * page;
  void* p = ::mmap(nullptr, v.mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return ErrnoError("mmap for a secret");
  v.data_ = static_cast<char*>(p);
  // Out of core dumps always; out of swap where the limit allows (an unprivileged daemon's
  // RLIMIT_MEMLOCK may not, and a secret is still better held than refused).
  (void)::madvise(p, v.mapped_, MADV_DONTDUMP);
  (void)::mlock(p, v.mapped_);
  if (!head.empty()) std::memcpy(v.data_, head.data(), head.size());
  if (!value.empty()) std::memcpy(v.data_ + head.size(), value.data(), value.size());
  v.size_ = size;
  return v;
}

SecretValue::SecretValue(SecretValue&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, 0)) {}

SecretValue& SecretValue::operator=(SecretValue&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

SecretValue::~SecretValue() { Release(); }

void SecretValue::Release() {
  if (data_ == nullptr) return;
  ::explicit_bzero(data_, mapped_);
  (void)::munlock(data_, mapped_);
  ::munmap(data_, mapped_);
  data_ = nullptr;
  size_ = mapped_ = 0;
}

Result<std::string> MakePlaceholder(std::string_view value) {
  static constexpr std::string_view kLowerHex = "0123456789abcdef";
  static constexpr std::string_view kUpperHex = "0123456789ABCDEF";
  static constexpr std::string_view kAlnum =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  auto only = [&](std::string_view set) {
    return std::all_of(value.begin(), value.end(),
                       [&](char c) { return set.find(c) != std::string_view::npos; });
  };
  std::string_view set = only(kLowerHex) ? kLowerHex : only(kUpperHex) ? kUpperHex : kAlnum;
  size_t n = std::max(value.size(), kMinPlaceholder);
  std::string out(n, '\0');
  // Rejection sampling: every character of the set equally likely.
  const unsigned limit = 256 - 256 % set.size();
  size_t i = 0;
  unsigned char buf[64];
  while (i < n) {
    RETURN_IF_ERROR(RandomFill(buf, sizeof buf));
    for (unsigned char b : buf) {
      if (b >= limit || i == n) continue;
      out[i++] = set[b % set.size()];
    }
  }
  return out;
}

bool Secret::BoundTo(const std::string& canonical_host) const {
  return std::any_of(hosts.begin(), hosts.end(),
                     [&](const AllowEntry& e) { return e.MatchesHost(canonical_host); });
}

namespace {

// One declaration as SecretSet::Make reads it, wherever its value is held.
struct Declared {
  const std::string& name;
  std::string_view value;
  const std::vector<std::string>& hosts;
  bool body;
  bool keep_cookies;
  bool target;
};

Status MakeSet(const std::vector<Declared>& inputs, std::vector<Secret>* out) {
  if (inputs.size() > kMaxSecrets) {
    return InvalidArgument("too many secrets: " + std::to_string(inputs.size()) + " (at most " +
                           std::to_string(kMaxSecrets) + ")");
  }
  std::set<std::string> names;
  std::set<std::string> placeholders;
  for (const auto& in : inputs) {
    if (!IsName(in.name)) {
      return InvalidArgument("secret name '" + in.name.substr(0, 64) +
                             "' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)");
    }
    const std::string what = "secret " + in.name;
    if (!names.insert(in.name).second) return InvalidArgument(what + " is declared twice");
    if (in.value.empty()) return InvalidArgument(what + " has an empty value");
    if (in.value.size() > kMaxSecretValue) {
      return InvalidArgument(what + " is longer than " + std::to_string(kMaxSecretValue) +
                             " bytes");
    }
    if (in.value.find_first_of(std::string_view("\0\r\n", 3)) != std::string::npos) {
      return InvalidArgument(what + " contains a NUL, CR or LF byte");
    }
    if (in.hosts.empty()) return InvalidArgument(what + " is bound to no host");
    Secret s;
    s.name = in.name;
    for (const auto& h : in.hosts) {
      // A port would suggest a binding narrower than the one enforced (the host alone).
      if (h.find(':') != std::string::npos) {
        return InvalidArgument(what + ": host '" + h.substr(0, 255) +
                               "' has a port; a secret is bound to host names only");
      }
      auto e = ParseAllowEntry(h);
      if (!e.ok()) return e.status().Annotate(what);
      s.hosts.push_back(std::move(*e));
    }
    ASSIGN_OR_RETURN(s.value, SecretValue::Copy(in.value));
    do {
      ASSIGN_OR_RETURN(s.placeholder, MakePlaceholder(s.value.view()));
    } while (!placeholders.insert(s.placeholder).second ||
             s.value.view().find(s.placeholder) != std::string_view::npos);
    s.body = in.body;
    s.keep_cookies = in.keep_cookies;
    s.target = in.target;
    out->push_back(std::move(s));
  }
  // A placeholder that contains another's would let one substitution expose the other.
  for (const auto& a : *out) {
    for (const auto& b : *out) {
      if (&a != &b && a.placeholder.find(b.placeholder) != std::string::npos) {
        return Internal("placeholders overlap; declare the secrets again");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

void WipeSecretInputs(std::vector<SecretInput>* inputs) {
  for (auto& in : *inputs) {
    // The whole buffer: a short value sits in the string's own bytes, and may have been
    // longer once.
    ::explicit_bzero(in.value.data(), in.value.capacity());
    in.value.clear();
  }
}

Result<std::shared_ptr<const HeldSecrets>> HeldSecrets::Hold(std::vector<SecretInput>* inputs) {
  auto held = std::make_shared<HeldSecrets>();
  Status st = Status::Ok();
  for (auto& in : *inputs) {
    auto value = SecretValue::Copy(in.value);
    if (!value.ok()) {
      st = value.status().Annotate("hold secret " + in.name.substr(0, 64));
      break;
    }
    held->entries_.push_back(
        {in.name, std::move(*value), in.hosts, in.body, in.keep_cookies, in.target});
  }
  WipeSecretInputs(inputs);
  if (!st.ok()) return st;
  return std::shared_ptr<const HeldSecrets>(std::move(held));
}

Result<std::shared_ptr<const SecretSet>> SecretSet::Make(std::vector<SecretInput> inputs) {
  std::vector<Declared> declared;
  declared.reserve(inputs.size());
  for (const auto& in : inputs) {
    declared.push_back({in.name, in.value, in.hosts, in.body, in.keep_cookies, in.target});
  }
  auto set = std::make_shared<SecretSet>();
  Status made = MakeSet(declared, &set->secrets_);
  WipeSecretInputs(&inputs);
  if (!made.ok()) return made;
  return std::shared_ptr<const SecretSet>(std::move(set));
}

Result<std::shared_ptr<const SecretSet>> SecretSet::Make(const HeldSecrets& held) {
  std::vector<Declared> declared;
  declared.reserve(held.size());
  for (const auto& e : held.entries()) {
    declared.push_back({e.name, e.value.view(), e.hosts, e.body, e.keep_cookies, e.target});
  }
  auto set = std::make_shared<SecretSet>();
  RETURN_IF_ERROR(MakeSet(declared, &set->secrets_));
  return std::shared_ptr<const SecretSet>(std::move(set));
}

bool SecretSet::BindsHost(const std::string& canonical_host) const {
  return std::any_of(secrets_.begin(), secrets_.end(),
                     [&](const Secret& s) { return s.BoundTo(canonical_host); });
}

std::map<std::string, std::string> SecretSet::GuestEnv() const {
  std::map<std::string, std::string> env;
  for (const auto& s : secrets_) env[s.name] = s.placeholder;
  return env;
}

const Secret* SecretSet::ForeignPlaceholder(std::string_view text,
                                            const std::string& canonical_host) const {
  for (const auto& s : secrets_) {
    if (!s.BoundTo(canonical_host) && text.find(s.placeholder) != std::string_view::npos) {
      return &s;
    }
  }
  return nullptr;
}

}  // namespace trybox::egress
