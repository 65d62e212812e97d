// FakeModelServer: a scripted model API for tests and benchmarks, speaking the real wire
// formats (docs/protocol/model.md) over a real loopback socket, in plain HTTP/1.1 or TLS.
//
//   POST /v1/messages          the Anthropic Messages API
//   POST /v1/chat/completions  the OpenAI chat completions API
//
// Each request takes the next step of the script (Push). A step is a JSON object; every
// field is optional:
//   text            the reply's text
//   tool_calls      [{name, input} | {name, raw_arguments}]; ids are generated
//   stop            the stop reason (default: tool_use / tool_calls with calls, else
//                   end_turn / stop)
//   status          an error reply with this HTTP status, body in the provider's format
//   error           {type, message} (Anthropic) or {code, message} (OpenAI) for it
//   retry_after     a Retry-After header value, as a string
//   retry_after_ms  a retry-after-ms header value, as a string
//   raw_body        answer 200 with exactly these bytes instead of a reply
//   input_tokens    the prompt tokens to report (default: request body bytes / 4)
//   omit_usage      true: the reply carries no usage object
//   delay_ms        wait this long before answering
//   expect_key      answer 401 unless the request carried this API key
//   hang            true: never answer; the request is held until its client closes the
//                   connection (counted by hangs_ended()) or the server stops
// With the script empty it answers 500 "fake model: script exhausted", so a test that
// scripts too few steps fails loudly. Connections are kept alive unless the client sends
// "Connection: close". Start() ignores SIGPIPE in the process. Thread-safe: the server runs on its
// own threads; every public method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "util/fd.h"
#include "util/status.h"
#include "util/tcp.h"
#include "util/thread_annotations.h"

namespace trybox::testing {

using Json = nlohmann::json;

class FakeModelServer {
 public:
  struct Options {
    bool tls = false;   // serve HTTPS with a fresh self-signed certificate for 127.0.0.1
    uint16_t port = 0;  // 0: any free port
    // Answer one request at a time, in turn, as Ollama (OLLAMA_NUM_PARALLEL=1) and
    // llama.cpp's server with one slot do: a request waits while another is answered or
    // held, until that one is answered or its client has gone.
    bool one_at_a_time = false;
  };

  struct Recorded {
    std::string method;
    std::string path;
    std::map<std::string, std::string> headers;  // names lower-cased
    Json body;                                   // null if the body was not JSON
    size_t body_bytes = 0;
  };

  static Result<std::unique_ptr<FakeModelServer>> Start(Options options);
  static Result<std::unique_ptr<FakeModelServer>> Start() { return Start(Options{}); }
  // Closes the listener and every connection, and joins the threads.
  ~FakeModelServer();
  FakeModelServer(const FakeModelServer&) = delete;
  FakeModelServer& operator=(const FakeModelServer&) = delete;

  uint16_t port() const { return listener_.port; }
  std::string anthropic_base_url() const;  // http(s)://127.0.0.1:PORT
  std::string openai_base_url() const;     // http(s)://127.0.0.1:PORT/v1
  // The PEM certificate a client must trust in TLS mode; empty otherwise.
  const std::string& ca_file() const { return ca_file_; }

  void Push(Json step);
  size_t steps_left() const;
  std::vector<Recorded> requests() const;
  size_t connections() const;  // accepted so far
  // Held ("hang") requests whose client closed the connection.
  size_t hangs_ended() const;
  // Wait until `requests().size()` / `hangs_ended()` reaches `n`, or `limit` passes (false).
  bool WaitForRequests(size_t n, std::chrono::milliseconds limit) const;
  bool WaitForHangsEnded(size_t n, std::chrono::milliseconds limit) const;

 private:
  class Impl;
  explicit FakeModelServer(Options options);
  void AcceptLoop();
  void ServeConnection(UniqueFd fd);
  // The next step, or nullopt when the script is exhausted.
  std::optional<Json> Pop();
  void Record(Recorded r);
  // Sleeps for `ms` unless the server is stopping.
  void Delay(int64_t ms);
  // Holds a "hang" request until its client closes `fd` (or the server shuts it down).
  void Hang(int fd);

  const Options options_;
  TcpListener listener_;
  std::string ca_file_;
  std::unique_ptr<Impl> impl_;  // TLS context and the temporary directory

  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  mutable std::condition_variable changed_cv_;  // a request recorded, a hang ended
  std::mutex turn_mu_;                          // one_at_a_time: the request being answered
  bool stopping_ GUARDED_BY(mu_) = false;
  std::deque<Json> script_ GUARDED_BY(mu_);
  std::vector<Recorded> requests_ GUARDED_BY(mu_);
  std::vector<int> open_fds_ GUARDED_BY(mu_);  // to shut down at destruction
  std::vector<std::thread> conn_threads_ GUARDED_BY(mu_);
  size_t connections_ GUARDED_BY(mu_) = 0;
  size_t hangs_ended_ GUARDED_BY(mu_) = 0;
  int next_id_ GUARDED_BY(mu_) = 0;
  std::thread accept_thread_;
};

}  // namespace trybox::testing
