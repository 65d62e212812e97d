// A minimal HTTP/1.1 origin on the host's loopback for egress tests and benchmarks. One
// request per connection:
//   POST /echo      answers with the request body (optionally after a barrier: see below)
//   GET  /hold      answers only after Release()
//   GET  /bytes/N   answers with N bytes of a fixed pattern
//   anything else   answers "hello"
// Counts connections; remembers the sha256 of the last echoed body.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "util/tcp.h"

namespace trybox::e2e {

class HttpUpstream {
 public:
  HttpUpstream();
  ~HttpUpstream();

  uint16_t port() const { return l_.port; }
  int accepts() const { return accepts_; }
  int held();
  void Release();
  // Holds /hold requests again, counting from zero (a test that holds after another did).
  void Rearm();
  std::string last_body_sha();
  // POST /echo waits until `n` echo requests are in flight at once (or `timeout` passes), so
  // a client's connections are shown to be open concurrently. Returns how many were seen
  // together at most.
  void SetEchoBarrier(int n, std::chrono::milliseconds timeout);
  int max_concurrent_echo();
  // The pattern /bytes/N serves: byte i is (i * 131 + 7) & 0xff.
  static std::string Pattern(size_t n);

 private:
  void Serve(int fd);

  TcpListener l_;
  std::thread accept_;
  std::atomic<int> accepts_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> conns_;
  int held_ = 0;
  bool released_ = false;
  std::string last_body_sha_;
  int barrier_ = 0;
  std::chrono::milliseconds barrier_timeout_{0};
  int echo_in_flight_ = 0;
  int echo_max_ = 0;
};

}  // namespace trybox::e2e
