// A blocking HTTP/2 client (nghttp2's client session, the library curl uses) over a
// ByteStream, for the tests and benches of the proxy's HTTP/2 relay (egress/intercept_h2.h).
// Submit queues requests; Wait pumps the connection until a stream is closed. Not thread-safe:
// one thread drives it.
#pragma once

#include <nghttp2/nghttp2.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "egress/byte_stream.h"
#include "util/status.h"

namespace trybox::h2test {

using Fields = std::vector<std::pair<std::string, std::string>>;

struct H2Response {
  int status = 0;
  std::vector<int> interim;  // 1xx statuses, in order
  Fields headers;            // the final response's, pseudo-headers left out
  std::string body;
  bool closed = false;
  uint32_t error_code = 0;  // RST_STREAM's, or 0

  // The first field named `name` (lower case), or "".
  std::string Header(const std::string& name) const;
};

class H2Client {
 public:
  // Borrows `stream`, which must outlive the client; queues the preface and SETTINGS.
  explicit H2Client(egress::ByteStream& stream,
                    std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  ~H2Client();
  H2Client(const H2Client&) = delete;
  H2Client& operator=(const H2Client&) = delete;

  // Queues a request and sends what it can; the stream id, or an error. `body`: nullopt ends
  // the stream with the HEADERS.
  Result<int32_t> Submit(const std::string& method, const std::string& path, Fields fields = {},
                         std::optional<std::string> body = std::nullopt,
                         const std::string& authority = "api.test",
                         const std::string& scheme = "https");
  Status Reset(int32_t id);
  // Pumps until stream `id` is closed. Errors: the connection ended or failed first, or
  // nothing arrived for the timeout.
  Result<H2Response> Wait(int32_t id);
  // Pumps until stream `id` has at least `n` body bytes or is closed.
  Status WaitForBody(int32_t id, size_t n);
  // One read from the connection, fed to the session; false at the connection's end.
  Result<bool> PumpOnce();
  // Bytes straight onto the connection, to break the protocol.
  Status SendRaw(std::string_view b);
  bool goaway() const { return goaway_; }

 private:
  Status Flush();
  static H2Client& Of(void* p) { return *static_cast<H2Client*>(p); }
  static int OnHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* u);
  static int OnData(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len,
                    void* u);
  static int OnClose(nghttp2_session*, int32_t id, uint32_t error_code, void* u);
  static int OnFrame(nghttp2_session*, const nghttp2_frame* frame, void* u);
  static ssize_t ReadBody(nghttp2_session*, int32_t id, uint8_t* buf, size_t length,
                          uint32_t* flags, nghttp2_data_source*, void* u);

  egress::ByteStream& stream_;
  const std::chrono::milliseconds timeout_;
  nghttp2_session* session_ = nullptr;
  std::map<int32_t, H2Response> responses_;
  std::map<int32_t, std::string> bodies_;
  bool goaway_ = false;
};

}  // namespace trybox::h2test
