#include "guest/requests.h"

#include "guest/cmdline.h"
#include "util/names.h"

namespace trybox::guest {
namespace {

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

// An absolute path without NUL bytes.
Result<std::string> PathField(const Json& request, const char* field) {
  auto it = request.find(field);
  if (it == request.end()) return InvalidArgument(std::string("missing \"") + field + "\"");
  if (!it->is_string()) return InvalidArgument(std::string("\"") + field + "\" must be a string");
  std::string path = it->get<std::string>();
  if (path.empty() || path[0] != '/') {
    return InvalidArgument(std::string("\"") + field + "\" must be an absolute path, got " +
                           QuoteForMessage(path));
  }
  if (HasNul(path)) return InvalidArgument(std::string("\"") + field + "\" contains a NUL byte");
  return path;
}

Status OptionalBool(const Json& request, const char* field, bool* out) {
  auto it = request.find(field);
  if (it == request.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return InvalidArgument(std::string("\"") + field + "\" must be a boolean");
  *out = it->get<bool>();
  return Status::Ok();
}

Result<std::string> StringField(const Json& request, const char* field) {
  auto it = request.find(field);
  if (it == request.end()) return InvalidArgument(std::string("missing \"") + field + "\"");
  if (!it->is_string()) return InvalidArgument(std::string("\"") + field + "\" must be a string");
  return it->get<std::string>();
}

// A JSON integer within [min, max]. Never a float, whatever its value: 1.0, 4294967.297 and
// 1e20 are refused, so no value is silently truncated on its way to an integer.
Result<int64_t> IntegerField(const Json& value, const char* field, int64_t min, int64_t max,
                             const char* range) {
  bool ok = false;
  int64_t v = 0;
  if (value.is_number_unsigned()) {
    uint64_t u = value.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(max) && (min <= 0 || u >= static_cast<uint64_t>(min));
    v = static_cast<int64_t>(u);
  } else if (value.is_number_integer()) {
    v = value.get<int64_t>();
    ok = v >= min && v <= max;
  }
  if (!ok) return InvalidArgument(std::string("\"") + field + "\" must be an integer " + range);
  return v;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Result<std::string> RequestOp(const Json& request) {
  auto it = request.find("op");
  if (it == request.end()) return InvalidArgument("missing \"op\"");
  if (!it->is_string()) return InvalidArgument("\"op\" must be a string");
  return it->get<std::string>();
}

Result<ExecRequest> ParseExecRequest(const Json& request) {
  ExecRequest out;
  auto argv = request.find("argv");
  if (argv == request.end()) return InvalidArgument("missing \"argv\"");
  if (!argv->is_array() || argv->empty()) {
    return InvalidArgument("\"argv\" must be a non-empty array of strings");
  }
  for (const auto& a : *argv) {
    if (!a.is_string()) return InvalidArgument("\"argv\" must be a non-empty array of strings");
    out.argv.push_back(a.get<std::string>());
    if (HasNul(out.argv.back())) return InvalidArgument("\"argv\" contains a NUL byte");
  }
  if (out.argv[0].empty()) return InvalidArgument("argv[0] is empty");

  auto env = request.find("env");
  if (env != request.end() && !env->is_null()) {
    if (!env->is_object()) return InvalidArgument("\"env\" must be an object of strings");
    for (const auto& [k, v] : env->items()) {
      if (!v.is_string()) {
        return InvalidArgument("env " + QuoteForMessage(k) + " must be a string");
      }
      if (k.empty() || k.find('=') != std::string::npos || HasNul(k)) {
        return InvalidArgument("env name " + QuoteForMessage(k) +
                               " must be non-empty, without '=' or NUL");
      }
      std::string value = v.get<std::string>();
      if (HasNul(value))
        return InvalidArgument("env " + QuoteForMessage(k) + " contains a NUL byte");
      out.env[k] = std::move(value);
    }
  }

  if (request.contains("cwd") && !request["cwd"].is_null()) {
    ASSIGN_OR_RETURN(out.cwd, PathField(request, "cwd"));
  }

  auto timeout = request.find("timeout_ms");
  if (timeout != request.end() && !timeout->is_null()) {
    ASSIGN_OR_RETURN(int64_t ms,
                     IntegerField(*timeout, "timeout_ms", 0, kMaxTimeoutMs, "from 0 to 2^40"));
    out.timeout_ms = static_cast<uint64_t>(ms);
  }
  RETURN_IF_ERROR(OptionalBool(request, "stdin", &out.stdin_from_stream));

  auto user = request.find("user");
  if (user != request.end() && !user->is_null()) {
    if (!user->is_string()) return InvalidArgument("\"user\" must be a string");
    out.user = user->get<std::string>();
    if (out.user.empty() || out.user.size() > kMaxUserName ||
        out.user.find_first_of(std::string(":\n\0", 3)) != std::string::npos) {
      return InvalidArgument(
          "\"user\" must be an account name of 1 to 256 bytes without ':', "
          "newline or NUL, got " +
          QuoteForMessage(out.user));
    }
  }
  RETURN_IF_ERROR(OptionalBool(request, "privileged", &out.privileged));
  auto tty = request.find("tty");
  if (tty != request.end() && !tty->is_null()) {
    ASSIGN_OR_RETURN(out.tty, ParseTermSize(*tty, "tty"));
  }
  if (out.privileged && out.user != "root") {
    return InvalidArgument("\"privileged\" is for root only, not for user " +
                           QuoteForMessage(out.user));
  }
  return out;
}

namespace {

// "disk": {KEY: bytes} -> the byte count; absent or null -> nullopt.
Result<std::optional<uint64_t>> DiskField(const Json& request, const char* key) {
  auto disk = request.find("disk");
  if (disk == request.end() || disk->is_null()) return std::optional<uint64_t>();
  if (!disk->is_object() || !disk->contains(key)) {
    return InvalidArgument(std::string("\"disk\" must be an object with \"") + key + "\"");
  }
  ASSIGN_OR_RETURN(int64_t n,
                   IntegerField((*disk)[key], key, 0, int64_t{1} << 50, "from 0 to 2^50 (bytes)"));
  return std::optional<uint64_t>(static_cast<uint64_t>(n));
}

}  // namespace
Result<TermSize> ParseTermSize(const Json& value, const char* what) {
  if (!value.is_object()) {
    return InvalidArgument(std::string("\"") + what + "\" must be an object {\"rows\", \"cols\"}");
  }
  TermSize size;
  for (const char* field : {"rows", "cols"}) {
    auto it = value.find(field);
    const std::string name = std::string(what) + "." + field;
    if (it == value.end()) return InvalidArgument("missing \"" + name + "\"");
    ASSIGN_OR_RETURN(int64_t v,
                     IntegerField(*it, name.c_str(), 1, kMaxTermDimension, "from 1 to 65535"));
    (field[0] == 'r' ? size.rows : size.cols) = static_cast<uint16_t>(v);
  }
  return size;
}

Result<ExecControl> ParseExecControl(const Json& event) {
  ExecControl out;
  if (!event.is_object()) return InvalidArgument("an exec event must be an object");
  ASSIGN_OR_RETURN(std::string type, StringField(event, "type"));
  if (type == "resize") {
    out.kind = ExecControl::Kind::kResize;
    ASSIGN_OR_RETURN(out.size, ParseTermSize(event, "resize"));
  } else if (type == "signal") {
    out.kind = ExecControl::Kind::kSignal;
    auto sig = event.find("signal");
    if (sig == event.end()) return InvalidArgument("missing \"signal\"");
    ASSIGN_OR_RETURN(int64_t n, IntegerField(*sig, "signal", 1, kMaxSignal, "from 1 to 64"));
    out.signal = static_cast<int>(n);
  }
  return out;
}

Result<PortRequest> ParsePortRequest(const Json& request) {
  auto port = request.find("port");
  if (port == request.end()) return InvalidArgument("missing \"port\"");
  ASSIGN_OR_RETURN(int64_t p, IntegerField(*port, "port", 1, 65535, "from 1 to 65535"));
  return PortRequest{static_cast<uint16_t>(p)};
}

Result<PutRequest> ParsePutRequest(const Json& request) {
  PutRequest out;
  ASSIGN_OR_RETURN(out.path, PathField(request, "path"));
  auto kind = request.find("kind");
  if (kind != request.end() && !kind->is_null()) {
    if (*kind == "file") {
      out.kind = PutKind::kFile;
    } else if (*kind == "tar") {
      out.kind = PutKind::kTar;
    } else {
      return InvalidArgument("\"kind\" must be \"file\" or \"tar\"");
    }
  }
  if (out.kind == PutKind::kFile) {
    std::string base = out.path.substr(out.path.rfind('/') + 1);
    if (base.empty() || base == "." || base == "..") {
      return InvalidArgument("put of a file needs a path that names a file, got " +
                             QuoteForMessage(out.path));
    }
  }
  auto mode = request.find("mode");
  if (mode != request.end() && !mode->is_null()) {
    ASSIGN_OR_RETURN(int64_t m, IntegerField(*mode, "mode", 0, kMaxMode, "from 0 to 0177777"));
    out.mode = static_cast<uint32_t>(m & 07777);
  }
  auto mtime = request.find("mtime_ns");
  if (mtime != request.end() && !mtime->is_null()) {
    ASSIGN_OR_RETURN(out.mtime_ns, IntegerField(*mtime, "mtime_ns", INT64_MIN, INT64_MAX,
                                                "of 64 bits (nanoseconds since the epoch)"));
  }
  RETURN_IF_ERROR(OptionalBool(request, "mkdirs", &out.mkdirs));
  ASSIGN_OR_RETURN(out.disk_bytes, DiskField(request, "bytes"));
  return out;
}

Result<GetRequest> ParseGetRequest(const Json& request) {
  GetRequest out;
  ASSIGN_OR_RETURN(out.path, PathField(request, "path"));
  if (request.contains("exclude")) {
    const Json& ex = request["exclude"];
    if (!ex.is_array()) return InvalidArgument("'exclude' must be an array of strings");
    for (const auto& p : ex) {
      if (!p.is_string()) return InvalidArgument("'exclude' must be an array of strings");
      std::string s = p.get<std::string>();
      if (s.empty() || s[0] == '-' || s.find('\0') != std::string::npos) {
        return InvalidArgument("'exclude' patterns must be non-empty and not start with '-'");
      }
      out.exclude.push_back(std::move(s));
    }
  }
  ASSIGN_OR_RETURN(out.disk_max_bytes, DiskField(request, "max_bytes"));
  if (auto cap = request.find("channel_max_bytes"); cap != request.end() && !cap->is_null()) {
    if (out.disk_max_bytes) {
      return InvalidArgument("\"channel_max_bytes\" and \"disk\" cannot go together");
    }
    ASSIGN_OR_RETURN(int64_t n, IntegerField(*cap, "channel_max_bytes", 0, int64_t{1} << 50,
                                             "from 0 to 2^50 (bytes)"));
    out.channel_max_bytes = static_cast<uint64_t>(n);
  }
  return out;
}

namespace {

// "time_ns": the host's CLOCK_REALTIME in nanoseconds.
Result<int64_t> TimeField(const Json& request) {
  auto time = request.find("time_ns");
  if (time == request.end()) return InvalidArgument("missing \"time_ns\"");
  return IntegerField(*time, "time_ns", 1, INT64_MAX, "from 1 to 2^63 - 1");
}

}  // namespace

Result<IdentityRequest> ParseIdentityRequest(const Json& request) {
  IdentityRequest out;
  ASSIGN_OR_RETURN(out.vm_id, StringField(request, "vm_id"));
  RETURN_IF_ERROR(ValidateName("vm_id", out.vm_id));
  ASSIGN_OR_RETURN(out.hostname, StringField(request, "hostname"));
  if (!ValidHostname(out.hostname)) {
    return InvalidArgument("\"hostname\" is not a valid hostname: " +
                           QuoteForMessage(out.hostname));
  }
  ASSIGN_OR_RETURN(std::string machine_id, StringField(request, "machine_id"));
  auto normal = NormalizeMachineId(machine_id);
  if (!normal) return InvalidArgument("\"machine_id\" must be 32 hex digits, not all zero");
  out.machine_id = *normal;
  ASSIGN_OR_RETURN(std::string seed, StringField(request, "seed"));
  if (seed.size() % 2 != 0 || seed.size() < 64 || seed.size() > 1024) {
    return InvalidArgument("\"seed\" must be 32 to 512 bytes as hex");
  }
  for (size_t i = 0; i < seed.size(); i += 2) {
    int hi = HexDigit(seed[i]), lo = HexDigit(seed[i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("\"seed\" is not hex");
    out.seed.push_back(static_cast<uint8_t>(hi * 16 + lo));
  }
  ASSIGN_OR_RETURN(out.time_ns, TimeField(request));
  return out;
}

Result<ClockRequest> ParseClockRequest(const Json& request) {
  ClockRequest out;
  ASSIGN_OR_RETURN(out.time_ns, TimeField(request));
  return out;
}

}  // namespace trybox::guest
