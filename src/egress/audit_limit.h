// A rate limit on what refused connections cost the audit and the log.
//
// A guest can open refused connections as fast as the proxy answers them (one made 3,000
// audit rows in 18 s). RateLimitedAudit wraps the daemon's sink: per VM and per window, the
// first `per_window` refused or failed verdicts reach the inner sink one by one; beyond
// that they are only counted, and once the window is over one summary Decision per verdict
// says how many were not recorded and to which hosts ("1234 more refused connections from
// this VM in the same 60 s window were not recorded one by one: evil.test:443 1200, ...").
// The proxy still refuses every connection; only the record is compressed. Allowed
// connections always pass through. Docs: docs/protocol/egress.md ("Audit").
//
// A window's summary is written at the VM's first refusal after the window, or by
// FlushExpired (call it now and then), FlushVm (when the VM goes) or Flush (at shutdown).
// The inner sink is called without the lock held. Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "egress/proxy.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace trybox::egress {

class RateLimitedAudit : public AuditSink {
 public:
  struct Options {
    int per_window = 20;              // refused (or failed) verdicts recorded one by one
    std::chrono::seconds window{60};  // per VM, from its first such verdict
    size_t max_hosts_named = 8;       // in a summary; the rest are "other hosts"
  };
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  // Decided returns this for a verdict that was counted, not recorded; Closed then ignores it.
  static constexpr int64_t kNotRecorded = -2;

  RateLimitedAudit(std::unique_ptr<AuditSink> inner, Options options,
                   Clock clock = std::chrono::steady_clock::now);

  int64_t Decided(const Decision& d) override;
  void Closed(int64_t id, const Decision& d) override;

  // Writes the summaries of every window that has ended, and forgets those windows.
  void FlushExpired();
  // Writes what is counted for `vm_id` now, and forgets the VM.
  void FlushVm(const std::string& vm_id);
  // Writes every VM's counts now (at shutdown).
  void Flush();

 private:
  struct Counted {
    uint64_t n = 0;
    std::map<std::string, uint64_t> hosts;  // "host:port" -> count, at most max_hosts_named
    uint64_t other_hosts = 0;               // connections to hosts beyond those
    double first_at = 0, last_at = 0;       // epoch seconds of the first and last counted
  };
  struct Window {
    std::chrono::steady_clock::time_point start;
    int recorded = 0;
    std::map<std::string, Counted> counted;  // by verdict
  };

  // The summaries of `w` (none if nothing was counted).
  std::vector<Decision> Summaries(const std::string& vm_id, const Window& w) const;
  void Emit(const std::vector<Decision>& summaries);

  const std::unique_ptr<AuditSink> inner_;
  const Options options_;
  const Clock clock_;
  Mutex mu_;
  std::map<std::string, Window> windows_ GUARDED_BY(mu_);  // by VM
};

}  // namespace trybox::egress
