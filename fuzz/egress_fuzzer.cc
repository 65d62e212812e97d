// libFuzzer target for the egress proxy's parsers of untrusted bytes: the request head, the
// proxy target and hostnames (from guests), and the response head an intercepted upstream
// sends (intercept.h). Invariants checked: no crash, and anything accepted as a
// hostname is canonical (accepting it again gives the same name).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "egress/allowlist.h"
#include "egress/hostname.h"
#include "egress/http.h"
#include "egress/intercept.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto head = trybox::egress::ParseRequestHead(in, 4096);
  if (head.ok() && head->has_value()) {
    auto target = trybox::egress::ParseProxyTarget(**head);
    if (target.ok() && !target->tunnel) (void)trybox::egress::OriginRequest(**head, *target);
  }
  auto name = trybox::egress::CanonicalHostname(in);
  if (name.ok()) {
    auto again = trybox::egress::CanonicalHostname(*name);
    if (!again.ok() || *again != *name) std::abort();
  }
  (void)trybox::egress::ParseAllowEntry(in);
  auto response = trybox::egress::ParseResponseHead(in, 4096);
  if (response.ok() && response->has_value() && (*response)->size > in.size()) std::abort();
  return 0;
}
