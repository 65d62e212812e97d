#include "egress/audit_limit.h"

namespace trybox::egress {
namespace {

bool Limited(const Decision& d) { return d.verdict == "refused" || d.verdict == "failed"; }

}  // namespace

RateLimitedAudit::RateLimitedAudit(std::unique_ptr<AuditSink> inner, Options options, Clock clock)
    : inner_(std::move(inner)), options_(options), clock_(std::move(clock)) {}

int64_t RateLimitedAudit::Decided(const Decision& d) {
  if (!Limited(d)) return inner_->Decided(d);
  std::vector<Decision> ended;
  bool record = false;
  {
    MutexLock lock(mu_);
    auto now = clock_();
    auto it = windows_.find(d.vm_id);
    if (it != windows_.end() && now - it->second.start >= options_.window) {
      ended = Summaries(d.vm_id, it->second);
      windows_.erase(it);
      it = windows_.end();
    }
    if (it == windows_.end()) it = windows_.emplace(d.vm_id, Window{now}).first;
    Window& w = it->second;
    if (w.recorded < options_.per_window) {
      ++w.recorded;
      record = true;
    } else {
      Counted& c = w.counted[d.verdict];
      if (c.n++ == 0) c.first_at = d.started_at;
      c.last_at = d.started_at;
      std::string host =
          (d.host.empty() ? std::string("(no request)") : d.host) + ":" + std::to_string(d.port);
      auto h = c.hosts.find(host);
      if (h != c.hosts.end()) {
        ++h->second;
      } else if (c.hosts.size() < options_.max_hosts_named) {
        c.hosts.emplace(host, 1);
      } else {
        // Not told apart any further: counting distinct names would grow without bound.
        ++c.other_hosts;
      }
    }
  }
  Emit(ended);
  return record ? inner_->Decided(d) : kNotRecorded;
}

void RateLimitedAudit::Closed(int64_t id, const Decision& d) {
  if (id == kNotRecorded) return;
  inner_->Closed(id, d);
}

std::vector<Decision> RateLimitedAudit::Summaries(const std::string& vm_id, const Window& w) const {
  std::vector<Decision> out;
  for (const auto& [verdict, c] : w.counted) {
    Decision s;
    s.vm_id = vm_id;
    s.verdict = verdict;
    s.started_at = c.first_at;
    s.duration_ms = (c.last_at - c.first_at) * 1000;
    std::string hosts;
    for (const auto& [host, n] : c.hosts) {
      hosts += (hosts.empty() ? "" : ", ") + host + " " + std::to_string(n);
    }
    if (c.other_hosts) hosts += ", other hosts " + std::to_string(c.other_hosts);
    s.reason = std::to_string(c.n) + " more " + verdict + " connections from this VM in the same " +
               std::to_string(options_.window.count()) +
               " s window were not recorded one by one: " + hosts;
    out.push_back(std::move(s));
  }
  return out;
}

void RateLimitedAudit::Emit(const std::vector<Decision>& summaries) {
  for (const auto& s : summaries) inner_->Closed(inner_->Decided(s), s);
}

void RateLimitedAudit::FlushExpired() {
  std::vector<Decision> ended;
  {
    MutexLock lock(mu_);
    auto now = clock_();
    for (auto it = windows_.begin(); it != windows_.end();) {
      if (now - it->second.start < options_.window) {
        ++it;
        continue;
      }
      auto s = Summaries(it->first, it->second);
      ended.insert(ended.end(), s.begin(), s.end());
      it = windows_.erase(it);
    }
  }
  Emit(ended);
}

void RateLimitedAudit::FlushVm(const std::string& vm_id) {
  std::vector<Decision> ended;
  {
    MutexLock lock(mu_);
    auto it = windows_.find(vm_id);
    if (it == windows_.end()) return;
    ended = Summaries(vm_id, it->second);
    windows_.erase(it);
  }
  Emit(ended);
}

void RateLimitedAudit::Flush() {
  std::vector<Decision> ended;
  {
    MutexLock lock(mu_);
    for (const auto& [vm, w] : windows_) {
      auto s = Summaries(vm, w);
      ended.insert(ended.end(), s.begin(), s.end());
    }
    windows_.clear();
  }
  Emit(ended);
}

}  // namespace trybox::egress
