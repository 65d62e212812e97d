// SandboxBook: what the HTTP API knows of the VMs it created (docs/protocol/e2b.md): the
// key that owns each, its template, metadata, environment, access token and the time it
// ends. A VM past its end is destroyed by HttpApi's reaper, as E2B does. In memory only: a
// daemon's VMs end with it, and so does this. Thread-safe.
//
// The end is a deadline on the monotonic clock (issue 51.7: a step of the host's wall
// clock must not end a sandbox early or keep it late). E2B's `endAt`, a time of day, is
// derived from it when shown (EndAt).
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "util/mutex.h"

namespace trybox::daemon {

using WallClock = std::chrono::system_clock;
using SteadyClock = std::chrono::steady_clock;

struct SandboxInfo {
  std::string id;     // the VM's id
  std::string owner;  // the API key id that created it
  std::string template_id;
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> env;
  std::string access_token;       // for the in-sandbox API (X-Access-Token)
  WallClock::time_point started;  // for display
  SteadyClock::time_point deadline;
  int memory_mib = 0;
  int cpus = 0;
};

struct SandboxPage {
  std::vector<SandboxInfo> items;
  std::string next_token;  // empty on the last page
  int64_t total = 0;       // matching the filter, before paging
};

class SandboxBook {
 public:
  void Add(SandboxInfo s) EXCLUDES(mu_);
  // Only the owner sees a sandbox: another key's id is "not found".
  std::optional<SandboxInfo> Get(const std::string& owner, const std::string& id) EXCLUDES(mu_);
  // Any owner's (for the in-sandbox API, which checks the access token instead).
  std::optional<SandboxInfo> Find(const std::string& id) EXCLUDES(mu_);
  // The owner's sandboxes whose metadata holds every pair of `filter`, newest first, from
  // after `after` (a next_token), at most `limit`.
  SandboxPage List(const std::string& owner, const std::map<std::string, std::string>& filter,
                   const std::string& after, int64_t limit) EXCLUDES(mu_);
  // Sets the deadline (`extend_only`: only if later). False when the owner has no such
  // sandbox.
  bool SetEnd(const std::string& owner, const std::string& id, SteadyClock::time_point deadline,
              bool extend_only) EXCLUDES(mu_);
  std::optional<SandboxInfo> Remove(const std::string& id) EXCLUDES(mu_);
  // The ids whose deadline is at or before `now`, taken out of the book.
  std::vector<std::string> TakeExpired(SteadyClock::time_point now) EXCLUDES(mu_);
  // The earliest deadline, if any sandbox is booked.
  std::optional<SteadyClock::time_point> NextEnd() EXCLUDES(mu_);
  size_t size() EXCLUDES(mu_);

 private:
  Mutex mu_;
  std::map<std::string, SandboxInfo> by_id_ GUARDED_BY(mu_);
};

// The time of day `deadline` falls at, by the wall clock as it reads now (`wall_now` at
// `steady_now`): what E2B's `endAt` shows.
WallClock::time_point EndAt(SteadyClock::time_point deadline, WallClock::time_point wall_now,
                            SteadyClock::time_point steady_now);

// "2026-12-02T07:31:05.123Z"
std::string Rfc3339(WallClock::time_point t);
// "a=1&b=x%20y" (E2B's metadata query, each key and value URL-encoded, and by E2B's
// JavaScript SDK encoded twice) into pairs; nullopt for text that is not such pairs.
std::optional<std::map<std::string, std::string>> ParseMetadataQuery(const std::string& q);

}  // namespace trybox::daemon
