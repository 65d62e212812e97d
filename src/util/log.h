// Minimal leveled logging: "2026-11-30T05:00:00.123Z I daemon: message", one line per call.
// Control characters and line breaks in a message are shown escaped (OneLine, util/utf8.h),
// so text from a guest can never forge a line of its own. Lines go to stderr, or to a file
// the logger owns (SetLogFile), rotated at a size cap. Thread-safe (one write(2) per line).
// Never pass a secret's value.
#pragma once

#include <cstdint>
#include <string>

#include "util/status.h"

namespace trybox {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

void SetLogLevel(LogLevel level);
void Log(LogLevel level, const std::string& component, const std::string& message);

inline void LogInfo(const std::string& c, const std::string& m) { Log(LogLevel::kInfo, c, m); }
inline void LogWarn(const std::string& c, const std::string& m) { Log(LogLevel::kWarn, c, m); }
inline void LogError(const std::string& c, const std::string& m) { Log(LogLevel::kError, c, m); }
inline void LogDebug(const std::string& c, const std::string& m) { Log(LogLevel::kDebug, c, m); }

// Lines longer than this are cut (the cut is marked).
inline constexpr size_t kMaxLogLine = 64 * 1024;

// From now on lines go to `path` (created 0600 if missing, appended to). Before a line
// would take the file past `max_bytes`, the file is renamed to `path`.1 (replacing the one
// before) and a new `path` is started: the log holds at most about 2 x max_bytes on disk.
// With `take_stdio`, descriptors 1 and 2 are pointed at the current file as well, now and
// after every rotation, so whatever else writes to stdout or stderr (a library, the C++
// runtime, a child that inherits them) lands in the same bounded file instead of keeping
// the first one open and growing. An empty `path` returns to plain stderr.
Status SetLogFile(const std::string& path, uint64_t max_bytes, bool take_stdio = true);

}  // namespace trybox
