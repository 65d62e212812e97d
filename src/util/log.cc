#include "util/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <ctime>

namespace trybox {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }

void Log(LogLevel level, const std::string& component, const std::string& message) {
  if (static_cast<int>(level) < g_level) return;
  struct timeval tv;
  ::gettimeofday(&tv, nullptr);
  struct tm tm;
  ::gmtime_r(&tv.tv_sec, &tm);
  char ts[64];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  static const char kLetters[] = "DIWE";
  std::string line = std::string(ts) + "." + std::to_string(tv.tv_usec / 100000) +
                     std::to_string(tv.tv_usec / 10000 % 10) +
                     std::to_string(tv.tv_usec / 1000 % 10) + "Z " +
                     kLetters[static_cast<int>(level)] + " " + component + ": " + message + "\n";
  (void)!::write(2, line.data(), line.size());
}

}  // namespace trybox
