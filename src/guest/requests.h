// The requests trybox-init serves, parsed and validated from their OPEN payloads. Pure:
// no I/O. Fields and defaults: docs/protocol/guest.md. A request with a missing or
// ill-typed field is rejected (kInvalidArgument naming the field); unknown fields are
// ignored so that a newer host can talk to an older guest.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace trybox::guest {

using Json = nlohmann::json;

inline constexpr uint64_t kMaxTimeoutMs = 1ull << 40;  // about 35 years
inline constexpr uint32_t kMaxMode = 0177777;          // an st_mode: type and permission bits
inline constexpr size_t kMaxUserName = 256;

struct ExecRequest {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::optional<std::string> cwd;  // absent: the account's home directory
  uint64_t timeout_ms = 0;         // 0: no timeout; at most kMaxTimeoutMs
  bool stdin_from_stream = false;  // "stdin"; false: the command's stdin is /dev/null
  std::string user = "root";       // an account of the guest's /etc/passwd
  bool privileged = false;         // root only: keep every capability
};

enum class PutKind { kFile, kTar };

struct PutRequest {
  std::string path;
  PutKind kind = PutKind::kFile;
  uint32_t mode = 0644;  // permission bits only ("mode" up to kMaxMode, masked with 07777)
  std::optional<int64_t> mtime_ns;
  bool mkdirs = false;
  // "disk": {"bytes": N}: the content is the first N bytes of the transfer disk, not the
  // channel (which then carries only the EOF).
  std::optional<uint64_t> disk_bytes;
};

struct GetRequest {
  std::string path;
  // Directories only: GNU tar --exclude patterns (never starting with '-', no NUL).
  std::vector<std::string> exclude;
  // "disk": {"max_bytes": L}: the content goes to the transfer disk (at most L bytes), not
  // the channel; the END says how many bytes it holds.
  std::optional<uint64_t> disk_max_bytes;
};

// "identity": what a clone restored from a template must be told before it serves
// anything else. The seed is hex on the wire.
struct IdentityRequest {
  std::string vm_id;
  std::string hostname;
  std::string machine_id;
  std::vector<uint8_t> seed;  // 32..512 bytes
  int64_t time_ns = 0;        // > 0
};

// The request's "op", or kInvalidArgument if missing or not a string.
Result<std::string> RequestOp(const Json& request);

Result<ExecRequest> ParseExecRequest(const Json& request);
Result<PutRequest> ParsePutRequest(const Json& request);
Result<GetRequest> ParseGetRequest(const Json& request);
Result<IdentityRequest> ParseIdentityRequest(const Json& request);

}  // namespace trybox::guest
