#include "util/log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <ctime>
#include <mutex>

#include "util/utf8.h"

namespace trybox {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

// The file the log owns, when SetLogFile gave it one.
struct LogFile {
  std::mutex mu;
  int fd = -1;
  std::string path;
  uint64_t max_bytes = 0;
  bool take_stdio = false;
};

LogFile& File() {
  static LogFile* f = new LogFile;  // never destroyed: threads may log during exit
  return *f;
}

int OpenLog(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
}

void TakeStdio(int fd) {
  ::dup2(fd, 1);
  ::dup2(fd, 2);
}

// Starts a new file; the current one becomes path.1. Caller holds f.mu. If no new file can
// be had, the current one is emptied instead: the cap holds either way.
void Rotate(LogFile& f) {
  std::string old = f.path + ".1";
  int fd = ::rename(f.path.c_str(), old.c_str()) == 0 ? OpenLog(f.path) : -1;
  if (fd < 0) {
    std::string why = std::strerror(errno);
    (void)::ftruncate(f.fd, 0);
    std::string note = "log: cannot rotate " + f.path + " (" + why + "); emptied it instead\n";
    (void)!::write(f.fd, note.data(), note.size());
    return;
  }
  if (f.take_stdio) TakeStdio(fd);
  ::close(f.fd);
  f.fd = fd;
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }

Status SetLogFile(const std::string& path, uint64_t max_bytes, bool take_stdio) {
  LogFile& f = File();
  std::lock_guard<std::mutex> lock(f.mu);
  int fd = -1;
  if (!path.empty()) {
    fd = OpenLog(path);
    if (fd < 0) return ErrnoError("open log file " + path);
    if (take_stdio) TakeStdio(fd);
  }
  if (f.fd >= 0) ::close(f.fd);
  f.fd = fd;
  f.path = path;
  f.max_bytes = max_bytes;
  f.take_stdio = take_stdio;
  return Status::Ok();
}

void Log(LogLevel level, const std::string& component, const std::string& message) {
  if (static_cast<int>(level) < g_level) return;
  struct timeval tv;
  ::gettimeofday(&tv, nullptr);
  struct tm tm;
  ::gmtime_r(&tv.tv_sec, &tm);
  char ts[64];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  static const char kLetters[] = "DIWE";
  std::string text = OneLine(message);
  if (text.size() > kMaxLogLine) {
    size_t cut = text.size() - kMaxLogLine;
    text = text.substr(0, kMaxLogLine) + " [... " + std::to_string(cut) + " bytes cut]";
  }
  std::string line =
      std::string(ts) + "." + std::to_string(tv.tv_usec / 100000) +
      std::to_string(tv.tv_usec / 10000 % 10) + std::to_string(tv.tv_usec / 1000 % 10) + "Z " +
      kLetters[static_cast<int>(level)] + " " + OneLine(component) + ": " + text + "\n";
  LogFile& f = File();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.fd < 0) {
    (void)!::write(2, line.data(), line.size());
    return;
  }
  // The file's own size, so that what others wrote through descriptors 1 and 2 counts.
  struct stat st;
  if (f.max_bytes && ::fstat(f.fd, &st) == 0 && st.st_size > 0 &&
      static_cast<uint64_t>(st.st_size) + line.size() > f.max_bytes) {
    Rotate(f);
  }
  (void)!::write(f.fd, line.data(), line.size());
}

}  // namespace trybox
