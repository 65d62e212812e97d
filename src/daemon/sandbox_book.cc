#include "daemon/sandbox_book.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

namespace trybox::daemon {

void SandboxBook::Add(SandboxInfo s) {
  MutexLock lock(mu_);
  by_id_[s.id] = std::move(s);
}

std::optional<SandboxInfo> SandboxBook::Get(const std::string& owner, const std::string& id) {
  MutexLock lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.owner != owner) return std::nullopt;
  return it->second;
}

std::optional<SandboxInfo> SandboxBook::Find(const std::string& id) {
  MutexLock lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second;
}

SandboxPage SandboxBook::List(const std::string& owner,
                              const std::map<std::string, std::string>& filter,
                              const std::string& after, int64_t limit) {
  std::vector<SandboxInfo> matching;
  {
    MutexLock lock(mu_);
    for (const auto& [id, s] : by_id_) {
      if (s.owner != owner) continue;
      bool ok = true;
      for (const auto& [k, v] : filter) {
        auto m = s.metadata.find(k);
        if (m == s.metadata.end() || m->second != v) {
          ok = false;
          break;
        }
      }
      if (ok) matching.push_back(s);
    }
  }
  // Newest first; the id breaks ties, so the order is total and a token names a place in it.
  std::sort(matching.begin(), matching.end(), [](const SandboxInfo& a, const SandboxInfo& b) {
    return a.started != b.started ? a.started > b.started : a.id < b.id;
  });
  SandboxPage page;
  page.total = static_cast<int64_t>(matching.size());
  size_t start = 0;
  if (!after.empty()) {
    auto it = std::find_if(matching.begin(), matching.end(),
                           [&](const SandboxInfo& s) { return s.id == after; });
    // A token whose sandbox has gone since: start over from the newest rather than fail, as
    // the page it named no longer exists.
    start = it == matching.end() ? 0 : static_cast<size_t>(it - matching.begin()) + 1;
  }
  for (size_t i = start; i < matching.size() && static_cast<int64_t>(page.items.size()) < limit;
       ++i) {
    page.items.push_back(matching[i]);
  }
  if (start + page.items.size() < matching.size() && !page.items.empty()) {
    page.next_token = page.items.back().id;
  }
  return page;
}

bool SandboxBook::SetEnd(const std::string& owner, const std::string& id,
                         SteadyClock::time_point deadline, bool extend_only) {
  MutexLock lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.owner != owner) return false;
  if (!extend_only || deadline > it->second.deadline) it->second.deadline = deadline;
  return true;
}

std::optional<SandboxInfo> SandboxBook::Remove(const std::string& id) {
  MutexLock lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  SandboxInfo s = std::move(it->second);
  by_id_.erase(it);
  return s;
}

std::vector<std::string> SandboxBook::TakeExpired(SteadyClock::time_point now) {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  for (auto it = by_id_.begin(); it != by_id_.end();) {
    if (it->second.deadline <= now) {
      out.push_back(it->first);
      it = by_id_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::optional<SteadyClock::time_point> SandboxBook::NextEnd() {
  MutexLock lock(mu_);
  std::optional<SteadyClock::time_point> next;
  for (const auto& [id, s] : by_id_) {
    if (!next || s.deadline < *next) next = s.deadline;
  }
  return next;
}

WallClock::time_point EndAt(SteadyClock::time_point deadline, WallClock::time_point wall_now,
                            SteadyClock::time_point steady_now) {
  return wall_now + std::chrono::duration_cast<WallClock::duration>(deadline - steady_now);
}

size_t SandboxBook::size() {
  MutexLock lock(mu_);
  return by_id_.size();
}

std::string Rfc3339(WallClock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch());
  const std::time_t secs = static_cast<std::time_t>(ms.count() / 1000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms.count() % 1000));
  return buf;
}

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> PercentDecode(const std::string& s, bool plus_is_space) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size()) return std::nullopt;
      const int hi = HexValue(s[i + 1]), lo = HexValue(s[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (s[i] == '+' && plus_is_space) {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

std::optional<std::map<std::string, std::string>> ParseMetadataQuery(const std::string& q) {
  std::map<std::string, std::string> out;
  size_t start = 0;
  while (start < q.size()) {
    size_t amp = q.find('&', start);
    if (amp == std::string::npos) amp = q.size();
    const std::string pair = q.substr(start, amp - start);
    start = amp + 1;
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0) return std::nullopt;
    auto k = PercentDecode(pair.substr(0, eq), true);
    auto v = PercentDecode(pair.substr(eq + 1), true);
    if (!k || !v) return std::nullopt;
    // E2B's JavaScript SDK encodes each key and value once more before it joins them
    // (encodeURIComponent, then URLSearchParams); a client that encodes once sends text that
    // this second decoding leaves as it is, or cannot decode (a bare '%'), kept as it is.
    out[PercentDecode(*k, false).value_or(*k)] = PercentDecode(*v, false).value_or(*v);
  }
  return out;
}

}  // namespace trybox::daemon
