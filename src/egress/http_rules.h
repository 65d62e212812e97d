// HTTP rules: which HTTP requests may go to a host at all (docs/secrets.md, "Request
// rules"). A forge's API can then be open for the listed repositories only:
//
//   allow GET,POST api.github.com/repos/me/proj
//   deny  *        github.com/me/private
//
// A rule is ACTION METHODS HOST[PATH]: ACTION is allow or deny, METHODS `*` or a comma
// list, PATH a prefix that matches whole segments ("/repos/me/proj" matches itself and
// "/repos/me/proj/pulls", never "/repos/me/project"). Once a host has a rule, each request to
// it is decided by the first of its rules that matches the method and the path, and refused
// when none does. The proxy can see requests only inside TLS it terminates, so a VM's rule
// hosts are intercepted as secrets' hosts are, and plain HTTP to them is refused.
//
// Paths are compared as the upstream would read them, and refused where that is not one
// reading: a percent-encoded byte is decoded first (an encoded '/' or '\' is refused), '.'
// and '..' segments and empty segments ("//") are refused, and letters compare without
// regard to case (forges treat owner and repository names that way, so a deny rule cannot be
// passed by spelling a name in capitals). The query string is not part of the path.
//
// Thread-safety: immutable once made; shared by every connection of its VM.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trybox::egress {

inline constexpr size_t kMaxHttpRules = 256;

struct HttpRule {
  bool allow = false;
  std::vector<std::string> methods;  // upper case; empty: any method
  std::string host;                  // canonical
  std::string path;                  // begins with '/', no trailing '/' except "/" itself
  std::string text;                  // as written, for reasons and audit rows
};

// One rule from its text; the error names what is wrong with it.
Result<HttpRule> ParseHttpRule(std::string_view text);

class HttpRules {
 public:
  HttpRules() = default;
  // Rules from their texts, in order; an error names the rule by its index.
  static Result<HttpRules> Make(const std::vector<std::string>& texts);

  bool empty() const { return rules_.empty(); }
  // Whether `host` (canonical) has rules: its tunnels are intercepted.
  bool Covers(const std::string& host) const;
  // "" when a request of `method` for `target` (the request target as sent: origin-form or
  // "*") may go to `host`; else why not, naming the rule that refused it or saying none
  // allowed it. A host without rules: "".
  std::string Check(const std::string& host, std::string_view method,
                    std::string_view target) const;
  const std::vector<HttpRule>& rules() const { return rules_; }

 private:
  std::vector<HttpRule> rules_;
};

}  // namespace trybox::egress
