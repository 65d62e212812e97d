#include "api/connection_guard.h"

#include "util/log.h"

namespace trybox::api {

ConnectionGuard::ConnectionGuard(const Limits& limits, std::function<void(int fd)> cut)
    : limits_(limits), cut_(std::move(cut)) {
  watcher_ = std::thread([this] { Watch(); });
}

ConnectionGuard::~ConnectionGuard() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  watcher_.join();
}

ConnectionGuard::Id ConnectionGuard::Opened(int fd, const std::string& peer) {
  MutexLock lock(mu_);
  const Id id = next_id_++;
  conns_[id] = Conn{fd, peer, false, false, Clock::now()};
  // Loops: a request's end (Unproven) may have taken a count past its cap since.
  while (CountUnproven(&peer) > limits_.max_unproven_per_peer &&
         CutOldest(&peer, id, "its peer holds too many connections without credentials")) {
  }
  while (CountUnproven(nullptr) > limits_.max_unproven &&
         CutOldest(nullptr, id, "too many connections without credentials")) {
  }
  size_t open = 0;
  for (const auto& [other, c] : conns_) open += !c.cut;
  // Past the cap an unproven connection goes, the newest only when every other one serves a
  // proven request. The cap is kept here, not by the library: it counts the connections cut
  // but not yet closed, and would refuse a caller with a key because of them.
  if (open > limits_.max_total && !CutOldest(nullptr, id, "the server is at its connection cap")) {
    Cut(conns_[id], "the server is at its connection cap");
  }
  changed_.SignalAll();
  return id;
}

void ConnectionGuard::Proven(Id id) {
  MutexLock lock(mu_);
  auto it = conns_.find(id);
  if (it != conns_.end() && !it->second.cut) it->second.proven = true;
}

void ConnectionGuard::Unproven(Id id) {
  MutexLock lock(mu_);
  auto it = conns_.find(id);
  if (it == conns_.end() || it->second.cut) return;
  it->second.proven = false;
  it->second.since = Clock::now();
  changed_.SignalAll();
}

void ConnectionGuard::Closed(Id id) {
  MutexLock lock(mu_);
  conns_.erase(id);
}

size_t ConnectionGuard::unproven() {
  MutexLock lock(mu_);
  return CountUnproven(nullptr);
}

size_t ConnectionGuard::open() {
  MutexLock lock(mu_);
  size_t n = 0;
  for (const auto& [id, c] : conns_) n += !c.cut;
  return n;
}

size_t ConnectionGuard::CountUnproven(const std::string* peer) {
  size_t n = 0;
  for (const auto& [id, c] : conns_) {
    n += !c.cut && !c.proven && (peer == nullptr || c.peer == *peer);
  }
  return n;
}

bool ConnectionGuard::CutOldest(const std::string* peer, Id spare, const char* why) {
  auto oldest = conns_.end();
  for (auto it = conns_.begin(); it != conns_.end(); ++it) {
    const Conn& c = it->second;
    if (it->first == spare || c.cut || c.proven || (peer != nullptr && c.peer != *peer)) continue;
    if (oldest == conns_.end() || c.since < oldest->second.since) oldest = it;
  }
  if (oldest == conns_.end()) return false;
  Cut(oldest->second, why);
  return true;
}

void ConnectionGuard::Cut(Conn& c, const char* why) {
  c.cut = true;
  cut_(c.fd);
  LogInfo("http", "closed a connection of " + c.peer + " that showed no credentials: " + why);
}

void ConnectionGuard::Watch() {
  MutexLock lock(mu_);
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = Clock::time_point::max();
    for (auto& [id, c] : conns_) {
      if (c.cut || c.proven) continue;
      const Clock::time_point deadline = c.since + limits_.head_timeout;
      if (deadline <= now) {
        // Routine for a kept-alive connection its client forgot: not worth a log line.
        c.cut = true;
        cut_(c.fd);
        LogDebug("http", "closed a connection of " + c.peer + ": no request came in time");
      } else if (deadline < next) {
        next = deadline;
      }
    }
    if (next == Clock::time_point::max()) {
      changed_.Wait(mu_);
    } else {
      (void)changed_.WaitUntil(mu_, next);
    }
  }
}

}  // namespace trybox::api
