// ConnectionGuard: HttpServer's rules for connections whose caller has not shown who it is,
// so that such clients (a slowloris, a flood of half-sent heads) cannot take the connections
// that a caller with a key needs (docs/protocol/http.md, "Callers without credentials").
//
// A connection is *unproven* from its accept until a request on it shows a key, a sandbox's
// access token or a dashboard session (Proven), and again from that request's end
// (Unproven), while it waits for its next head. An unproven connection
//   - is cut when it stays unproven for `head_timeout` (a head sent a byte at a time, an
//     idle keep-alive connection, a request without credentials read or answered slowly);
//   - is cut, the oldest first, to make room: when a peer has more than
//     `max_unproven_per_peer` unproven connections (its own oldest go), when there are more
//     than `max_unproven` in all, and when more than `max_total` are open (the new one
//     itself when it is the only unproven one). A connection serving a proven request is
//     never cut.
// The cap `max_total` is the guard's: the library's own must be higher (HttpServer makes it
// twice as high), since the library counts connections cut but not yet closed.
// To cut is to shutdown(2) the socket through `cut`; the library's own thread for the
// connection then sees the end and closes it (and Closed follows).
//
// Thread-safe. `cut` is called with the guard's lock held, and never for a connection after
// its Closed: the library closes a socket only after telling the guard.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "util/mutex.h"

namespace trybox::api {

class ConnectionGuard {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;

  struct Limits {
    size_t max_total = 64;  // connections open at once, not counting those cut
    size_t max_unproven = 48;
    size_t max_unproven_per_peer = 32;
    Clock::duration head_timeout = std::chrono::seconds(10);
  };

  // Starts the thread that cuts connections past their deadline.
  ConnectionGuard(const Limits& limits, std::function<void(int fd)> cut);
  // Stops that thread; cuts nothing more.
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  // A connection was accepted on socket `fd` from `peer` (PeerKey): unproven from now. May
  // cut older unproven connections to make room (above).
  Id Opened(int fd, const std::string& peer) EXCLUDES(mu_);
  // A request whose caller was proven is served on it: nothing cuts it until Unproven.
  void Proven(Id id) EXCLUDES(mu_);
  // Its request ended: unproven again, its deadline counted from now.
  void Unproven(Id id) EXCLUDES(mu_);
  // The connection is closed: forgotten.
  void Closed(Id id) EXCLUDES(mu_);

  // Connections not yet cut that are unproven, and all of them (for tests).
  size_t unproven() EXCLUDES(mu_);
  size_t open() EXCLUDES(mu_);

 private:
  struct Conn {
    int fd = -1;
    std::string peer;
    bool proven = false;
    bool cut = false;         // shut down; waiting for Closed
    Clock::time_point since;  // unproven since
  };
  // Cuts the unproven connection unproven longest, of `peer` when not null, other than
  // `spare`; false when there is none.
  bool CutOldest(const std::string* peer, Id spare, const char* why) REQUIRES(mu_);
  void Cut(Conn& c, const char* why) REQUIRES(mu_);
  size_t CountUnproven(const std::string* peer) REQUIRES(mu_);
  void Watch() EXCLUDES(mu_);

  const Limits limits_;
  const std::function<void(int)> cut_;
  Mutex mu_;
  CondVar changed_;
  bool stopping_ GUARDED_BY(mu_) = false;
  Id next_id_ GUARDED_BY(mu_) = 1;
  std::map<Id, Conn> conns_ GUARDED_BY(mu_);
  std::thread watcher_;
};

}  // namespace trybox::api
