// Minimal leveled logging to stderr: "2026-11-30T05:00:00.123Z I daemon: message".
// Thread-safe (one write(2) per line). Never pass a secret's value.
#pragma once

#include <string>

namespace trybox {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

void SetLogLevel(LogLevel level);
void Log(LogLevel level, const std::string& component, const std::string& message);

inline void LogInfo(const std::string& c, const std::string& m) { Log(LogLevel::kInfo, c, m); }
inline void LogWarn(const std::string& c, const std::string& m) { Log(LogLevel::kWarn, c, m); }
inline void LogError(const std::string& c, const std::string& m) { Log(LogLevel::kError, c, m); }
inline void LogDebug(const std::string& c, const std::string& m) { Log(LogLevel::kDebug, c, m); }

}  // namespace trybox
