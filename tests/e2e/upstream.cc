#include "tests/e2e/upstream.h"

#include <sys/socket.h>

#include "util/sha256.h"

namespace trybox::e2e {

HttpUpstream::HttpUpstream() {
  l_ = ListenTcpLoopback(0, 1024).value();
  accept_ = std::thread([this] {
    for (;;) {
      auto c = AcceptTcp(l_.fd.get());
      if (!c.ok()) return;
      ++accepts_;
      std::lock_guard<std::mutex> lock(mu_);
      conns_.emplace_back([this, fd = std::move(*c)] { Serve(fd.get()); });
    }
  });
}

HttpUpstream::~HttpUpstream() {
  Release();
  ::shutdown(l_.fd.get(), SHUT_RDWR);
  accept_.join();
  std::vector<std::thread> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns.swap(conns_);
  }
  for (auto& t : conns) t.join();
}

int HttpUpstream::held() {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

void HttpUpstream::Rearm() {
  std::lock_guard<std::mutex> lock(mu_);
  held_ = 0;
  released_ = false;
}

void HttpUpstream::Release() {
  std::lock_guard<std::mutex> lock(mu_);
  released_ = true;
  cv_.notify_all();
}

std::string HttpUpstream::last_body_sha() {
  std::lock_guard<std::mutex> lock(mu_);
  return last_body_sha_;
}

void HttpUpstream::SetEchoBarrier(int n, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  barrier_ = n;
  barrier_timeout_ = timeout;
}

int HttpUpstream::max_concurrent_echo() {
  std::lock_guard<std::mutex> lock(mu_);
  return echo_max_;
}

std::string HttpUpstream::Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) & 0xff);
  return s;
}

void HttpUpstream::Serve(int fd) {
  std::string head;
  char c;
  while (head.find("\r\n\r\n") == std::string::npos) {
    auto n = ReadSome(fd, &c, 1);
    if (!n.ok() || *n == 0) return;
    head += c;
  }
  size_t len = 0;
  size_t at = head.find("Content-Length: ");
  if (at != std::string::npos) len = std::stoul(head.substr(at + 16));
  std::string body(len, '\0');
  if (len > 0 && !ReadFull(fd, body.data(), len).ok()) return;
  std::string reply = "hello";
  if (head.rfind("POST /echo", 0) == 0) {
    reply = std::move(body);
    std::unique_lock<std::mutex> lock(mu_);
    last_body_sha_ = Sha256Hex(reply);
    echo_max_ = std::max(echo_max_, ++echo_in_flight_);
    cv_.notify_all();
    if (barrier_ > 0) {
      cv_.wait_for(lock, barrier_timeout_, [&] { return echo_max_ >= barrier_; });
    }
    --echo_in_flight_;
  } else if (head.rfind("GET /hold ", 0) == 0) {
    std::unique_lock<std::mutex> lock(mu_);
    ++held_;
    cv_.wait(lock, [&] { return released_; });
  } else if (head.rfind("GET /bytes/", 0) == 0) {
    reply = Pattern(std::stoul(head.substr(11)));
  }
  (void)WriteFull(fd, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(reply.size()) +
                          "\r\nConnection: close\r\n\r\n" + reply);
  ::shutdown(fd, SHUT_WR);
}

}  // namespace trybox::e2e
