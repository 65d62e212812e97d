// A client for the QEMU Machine Protocol on a unix socket: one JSON object per line,
// a greeting, then command/reply pairs with asynchronous events interleaved (skipped).
// Used to save and restore templates (docs/templates.md). Not thread-safe: one caller.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "util/fd.h"
#include "util/status.h"

namespace trybox::vmm {

class Qmp {
 public:
  // Connects (retrying while QEMU has not created the socket yet), reads the greeting and
  // leaves capabilities negotiation mode. kDeadlineExceeded if QEMU never answers.
  static Result<Qmp> Connect(const std::string& path,
                             std::chrono::steady_clock::time_point deadline);

  // Runs one command and returns its "return" value. A QMP error reply becomes a kInternal
  // error quoting QEMU's class and description; a closed socket becomes kUnavailable.
  // If `fd` >= 0 it travels with the command (SCM_RIGHTS), as `getfd` needs.
  Result<nlohmann::json> Execute(const std::string& command,
                                 const nlohmann::json& arguments = nullptr, int fd = -1);

 private:
  explicit Qmp(UniqueFd fd) : fd_(std::move(fd)) {}
  Result<nlohmann::json> ReadMessage();

  UniqueFd fd_;
  std::string buffer_;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace trybox::vmm
