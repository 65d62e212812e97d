// Helpers shared by the relay tests (intercept_test.cc, intercept_h2_test.cc): blocking reads
// of raw HTTP/1.1 bytes from a test socket that fail the test instead of hanging it, and
// secret declarations.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "egress/http_rules.h"
#include "egress/intercept.h"
#include "egress/secrets.h"
#include "util/fd.h"

namespace trybox::egress {

// A relay that hangs fails the test after this long instead of hanging it.
inline constexpr int kStuckMs = 10000;

inline std::string ReadSomeBytes(int fd, size_t max) {
  pollfd p{fd, POLLIN, 0};
  int n;
  do {
    n = ::poll(&p, 1, kStuckMs);
  } while (n < 0 && errno == EINTR);
  if (n == 0) {
    ADD_FAILURE() << "no bytes within " << kStuckMs << " ms";
    return "";
  }
  std::string buf(max, '\0');
  auto got = ReadSome(fd, buf.data(), buf.size());
  buf.resize(got.ok() ? *got : 0);
  return buf;
}

// Up to the blank line, one byte at a time so nothing after it is consumed.
inline std::string ReadHead(int fd) {
  std::string out;
  while (out.find("\r\n\r\n") == std::string::npos) {
    std::string b = ReadSomeBytes(fd, 1);
    if (b.empty()) break;
    out += b;
  }
  return out;
}

inline std::string ReadN(int fd, size_t n) {
  std::string out;
  while (out.size() < n) {
    std::string b = ReadSomeBytes(fd, n - out.size());
    if (b.empty()) break;
    out += b;
  }
  return out;
}

inline std::string ReadUntilEof(int fd) {
  std::string out;
  for (;;) {
    std::string b = ReadSomeBytes(fd, 65536);
    if (b.empty()) return out;
    out += b;
  }
}

// A head, then as many body bytes as its Content-Length says.
inline std::string ReadMessage(int fd) {
  std::string head = ReadHead(fd);
  size_t at = head.find("Content-Length: ");
  if (at == std::string::npos) return head;
  size_t n = std::stoul(head.substr(at + 16, head.find("\r\n", at) - at - 16));
  return head + ReadN(fd, n);
}

inline std::string Hex(size_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%zx", n);
  return buf;
}

// The payload of a chunked body (chunk extensions and trailers dropped); "" and a test
// failure when it is not one.
inline std::string Dechunk(std::string_view body) {
  std::string out;
  for (;;) {
    size_t eol = body.find("\r\n");
    if (eol == std::string_view::npos) {
      ADD_FAILURE() << "not a chunked body";
      return "";
    }
    size_t n = std::stoul(std::string(body.substr(0, eol)), nullptr, 16);
    body.remove_prefix(eol + 2);
    if (n == 0) return out;
    out.append(body.substr(0, n));
    body.remove_prefix(std::min(body.size(), n + 2));
  }
}

inline void Write(int fd, std::string_view data) { ASSERT_TRUE(WriteFull(fd, data).ok()); }

inline SecretInput Declare(std::string name, std::string value, std::vector<std::string> hosts,
                           bool body = false, bool keep_cookies = false, bool target = false) {
  SecretInput in;
  in.target = target;
  in.name = std::move(name);
  in.value = std::move(value);
  in.hosts = std::move(hosts);
  in.body = body;
  in.keep_cookies = keep_cookies;
  return in;
}

// No field of the result may carry a secret's value.
inline void ExpectNoValue(const InterceptResult& r, const std::string& value) {
  EXPECT_EQ(r.refused_reason.find(value), std::string::npos);
  EXPECT_EQ(r.error.find(value), std::string::npos);
  for (const auto& [name, n] : r.substitutions) EXPECT_EQ(name.find(value), std::string::npos);
}

// The secrets and HTTP rules a relay test runs with; a malformed declaration fails the test.
inline void MakeSecretsAndRules(std::vector<SecretInput> inputs,
                                const std::vector<std::string>& rules,
                                std::shared_ptr<const SecretSet>* secrets, HttpRules* made_rules) {
  auto made = HttpRules::Make(rules);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  *made_rules = std::move(*made);
  auto set = SecretSet::Make(std::move(inputs));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  *secrets = *set;
}

}  // namespace trybox::egress
