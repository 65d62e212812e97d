// What the secrets end-to-end suites share (secrets_e2e_test.cc on debian-12,
// secrets_dev_e2e_test.cc on debian-12-dev): HTTPS origins on the host's loopback with
// certificates from a test CA, the daemon configuration that lets a guest reach them by name
// without leaving loopback, and the proof that a secret's value is nowhere in a guest.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "egress/tls.h"
#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/status.h"
#include "util/tcp.h"

namespace trybox::e2e {

// An HTTPS origin for one name: records each request head it receives and answers "ok" with
// a Set-Cookie, one request per connection.
// With a git root, requests under /git/ are served by `git http-backend` (smart HTTP, a CGI
// run per request with the request's body) and need `git_auth` as their Authorization.
// Thread-safe; the destructor stops accepting and joins every connection's thread.
class TlsOrigin {
 public:
  TlsOrigin(egress::CertAuthority& ca, const std::string& name, std::string git_root = "",
            std::string git_auth = "");
  ~TlsOrigin();
  TlsOrigin(const TlsOrigin&) = delete;
  TlsOrigin& operator=(const TlsOrigin&) = delete;

  uint16_t port() const { return l_.port; }
  // The request heads received so far (request line and headers, without the blank line).
  std::vector<std::string> heads();
  // The body of each request that had a Content-Length (other than git's), in order.
  std::vector<std::string> bodies();

  // The value of a request header in `head` (the first of the name, compared without
  // case); "" when absent.
  static std::string Header(const std::string& head, const std::string& name);

 private:
  void Serve(UniqueFd fd);
  std::string Git(egress::TlsStream& tls, std::string buffered);

  const std::string git_root_;
  const std::string git_auth_;
  std::vector<std::string> bodies_;  // guarded by mu_
  std::shared_ptr<SSL_CTX> ctx_;
  TcpListener l_;
  std::thread accept_;
  std::mutex mu_;
  std::vector<std::thread> conns_;
  std::vector<std::string> heads_;
};

// Stops the harness's daemon, writes egress.json so that each name resolves to 127.0.0.1 and
// its port there is reachable (internal_allow), with `ca` as the only CA trusted for
// upstreams, and starts the daemon again.
Status ServeOriginsByName(Harness& h, const egress::CertAuthority& ca,
                          const std::vector<std::pair<std::string, uint16_t>>& origins);

// Occurrences of `needle` in the file at `path`, read in overlapping blocks; -1 if the file
// cannot be read.
int64_t CountInFile(const std::string& path, const std::string& needle);

// `script` run by bash in VM `id`.
CliResult ShIn(Harness& h, const std::string& id, const std::string& script);
// https://HOST:PORT/PATH for origin `o` under the name `host`.
std::string OriginUrl(const TlsOrigin& o, const std::string& host, const std::string& path);
// The placeholder the guest of VM `id` sees in variable `name`.
std::string GuestPlaceholder(Harness& h, const std::string& id, const std::string& name);

// Whether a request head an origin recorded has the field `name` (in any case: HTTP/2
// lower-cases names, and the relay passes them on so) with exactly `value`.
bool HasField(const std::string& head, const std::string& name, const std::string& value);

// The memory proof, for VM `id` of `h`: a QMP dump of the guest's whole memory (expected
// larger than `min_dump_bytes`) holds none of `forms` and at least one `placeholder` (the
// control that shows the search would have found it); every file of the VM's directory holds
// no `forms[0]` (the value itself) and, taken together, the placeholder; the daemon's log and
// store (which must exist: CountInFile gives -1 otherwise) hold no `forms[0]`. Reports
// through gtest assertions.
void ExpectValueNowhereButPlaceholderFound(const Harness& h, const std::string& id,
                                           const std::vector<std::string>& forms,
                                           const std::string& placeholder, int64_t min_dump_bytes);

}  // namespace trybox::e2e
