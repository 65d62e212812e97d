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
inline constexpr int64_t kMaxTermDimension = 65535;  // a struct winsize field
inline constexpr int kMaxSignal = 64;                // SIGRTMAX on Linux

// A terminal's size in character cells, each 1 to kMaxTermDimension.
struct TermSize {
  uint16_t rows = 24;
  uint16_t cols = 80;
};

struct ExecRequest {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::optional<std::string> cwd;  // absent: the account's home directory
  uint64_t timeout_ms = 0;         // 0: no timeout; at most kMaxTimeoutMs
  bool stdin_from_stream = false;  // "stdin"; false: the command's stdin is /dev/null
  std::string user = "root";       // an account of the guest's /etc/passwd
  bool privileged = false;         // root only: keep every capability
  // "tty": run on a pseudo-terminal of this size (stdout and stderr merged on channel 1,
  // input from channel 0 whatever "stdin" says).
  std::optional<TermSize> tty;
};

// An EVENT the host sends on an exec stream (docs/protocol/guest.md, "exec").
struct ExecControl {
  enum class Kind { kResize, kSignal, kUnknown };
  Kind kind = Kind::kUnknown;  // kUnknown: a type this guest does not know (ignored)
  TermSize size;               // kResize
  int signal = 0;              // kSignal: 1 to kMaxSignal
};

// "port": connect to 127.0.0.1:port in the guest and relay bytes.
struct PortRequest {
  uint16_t port = 0;  // 1 to 65535
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
  // "channel_max_bytes": N (never with "disk"): content larger than N is not sent; the get
  // ENDs with "too_large" before its meta EVENT, and the host takes the disk instead.
  std::optional<uint64_t> channel_max_bytes;
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

// "clock": the host's CLOCK_REALTIME for a guest's wall clock, sent when a spare clone that
// got its identity earlier is handed out.
struct ClockRequest {
  int64_t time_ns = 0;  // > 0
};

// The request's "op", or kInvalidArgument if missing or not a string.
Result<std::string> RequestOp(const Json& request);

Result<ExecRequest> ParseExecRequest(const Json& request);
Result<PutRequest> ParsePutRequest(const Json& request);
Result<GetRequest> ParseGetRequest(const Json& request);
Result<IdentityRequest> ParseIdentityRequest(const Json& request);
Result<ClockRequest> ParseClockRequest(const Json& request);
Result<PortRequest> ParsePortRequest(const Json& request);
// A known event type with a missing, ill-typed or out-of-range field is an error naming it;
// an unknown type is kUnknown.
Result<ExecControl> ParseExecControl(const Json& event);
// {"rows": R, "cols": C}; `what` names the object in errors ("tty", "resize").
Result<TermSize> ParseTermSize(const Json& value, const char* what);

}  // namespace trybox::guest
