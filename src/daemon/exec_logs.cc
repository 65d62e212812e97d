#include "daemon/exec_logs.h"

#include <endian.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "util/log.h"
#include "util/names.h"

namespace trybox::daemon {
namespace {

// docs/store.md, "Exec logs": magic, total, head, tail (u64 little-endian), then the bytes.
constexpr char kMagic[8] = {'T', 'B', 'X', 'L', 'O', 'G', '1', '\n'};
constexpr int64_t kHeaderBytes = 32;
constexpr int64_t kTotalAt = 8;
// Sanity bound for a header read back from disk.
constexpr int64_t kMaxPart = int64_t{1} << 40;

Status PutAt(int fd, std::string_view data, int64_t at) {
  while (!data.empty()) {
    ssize_t n = ::pwrite(fd, data.data(), data.size(), at);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write the exec log");
    }
    data.remove_prefix(static_cast<size_t>(n));
    at += n;
  }
  return Status::Ok();
}

Status GetAt(int fd, char* out, size_t len, int64_t at) {
  while (len > 0) {
    ssize_t n = ::pread(fd, out, len, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read the exec log");
    }
    if (n == 0) return Internal("the exec log is shorter than its header says");
    out += n;
    len -= static_cast<size_t>(n);
    at += n;
  }
  return Status::Ok();
}

std::string U64(int64_t v) {
  uint64_t le = htole64(static_cast<uint64_t>(v));
  return std::string(reinterpret_cast<const char*>(&le), 8);
}

int64_t FromU64(const char* p) {
  uint64_t le;
  std::memcpy(&le, p, 8);
  return static_cast<int64_t>(le64toh(le));
}

const char* kChannelSuffix[2] = {".out", ".err"};

}  // namespace

void ExecLog::Write(File& f, std::string_view data) {
  const int64_t end = f.total + static_cast<int64_t>(data.size());
  int64_t p = f.total;
  auto put = [&](std::string_view part, int64_t at) {
    if (!f.fd.valid()) return;
    Status st = PutAt(f.fd.get(), part, at);
    if (!st.ok()) {
      // ENOSPC and the like: the exec goes on; its log says why it stopped being kept.
      f.error = "the output could not be kept: " + st.message();
      LogError("exec-logs", f.error);
      f.fd.Reset();
    }
  };
  if (p < f.head) {
    size_t n = static_cast<size_t>(std::min<int64_t>(f.head - p, data.size()));
    put(data.substr(0, n), kHeaderBytes + p);
    p += static_cast<int64_t>(n);
    data.remove_prefix(n);
  }
  if (!data.empty() && f.tail > 0) {
    // Only the last `tail` bytes of a long chunk can survive in the ring.
    if (static_cast<int64_t>(data.size()) > f.tail) {
      data.remove_prefix(data.size() - static_cast<size_t>(f.tail));
      p = end - f.tail;
    }
    while (!data.empty()) {
      int64_t pos = (p - f.head) % f.tail;
      size_t n = static_cast<size_t>(std::min<int64_t>(f.tail - pos, data.size()));
      put(data.substr(0, n), kHeaderBytes + f.head + pos);
      p += static_cast<int64_t>(n);
      data.remove_prefix(n);
    }
  }
  f.total = end;
  put(U64(f.total), kTotalAt);
}

void ExecLog::Append(uint8_t channel, std::string_view data) {
  if (data.empty()) return;
  {
    MutexLock l(mu_);
    Write(files_[channel == channel::kChanErr ? kStderr : kStdout], data);
  }
  cv_.SignalAll();
}

void ExecLog::Finish() {
  {
    MutexLock l(mu_);
    finished_ = true;
  }
  cv_.SignalAll();
}

void ExecLog::Wake() {
  { MutexLock l(mu_); }  // a Wait is either before its check of `stop` or asleep
  cv_.SignalAll();
}

void ExecLog::Wait(Channel ch, int64_t offset, const std::atomic<bool>* stop) {
  MutexLock l(mu_);
  while (!finished_ && files_[ch].total <= offset && !(stop && *stop)) cv_.Wait(mu_);
}

void ExecLog::WaitAny(int64_t out_offset, int64_t err_offset, const std::atomic<bool>* stop) {
  MutexLock l(mu_);
  while (!finished_ && files_[kStdout].total <= out_offset && files_[kStderr].total <= err_offset &&
         !(stop && *stop)) {
    cv_.Wait(mu_);
  }
}

bool ExecLog::WaitAnyUntil(int64_t out_offset, int64_t err_offset,
                           std::chrono::steady_clock::time_point deadline) {
  MutexLock l(mu_);
  while (!finished_ && files_[kStdout].total <= out_offset && files_[kStderr].total <= err_offset) {
    if (!cv_.WaitUntil(mu_, deadline)) return false;
  }
  return true;
}

int64_t ExecLog::total(Channel ch) const {
  MutexLock l(mu_);
  return files_[ch].total;
}

bool ExecLog::finished() const {
  MutexLock l(mu_);
  return finished_;
}

Result<ExecLog::Slice> ExecLog::Read(Channel ch, int64_t offset, size_t max) {
  MutexLock l(mu_);
  const File& f = files_[ch];
  if (!f.error.empty()) return FailedPrecondition(f.error);
  if (offset > f.total) {
    return InvalidArgument("offset " + std::to_string(offset) + " is past the end of the output (" +
                           std::to_string(f.total) + " bytes so far)");
  }
  Slice s;
  s.total = f.total;
  s.finished = finished_;
  const int64_t want = static_cast<int64_t>(max);
  if (offset < std::min(f.total, f.head)) {
    int64_t n = std::min(std::min(f.total, f.head) - offset, want);
    s.data.resize(static_cast<size_t>(n));
    RETURN_IF_ERROR(GetAt(f.fd.get(), s.data.data(), s.data.size(), kHeaderBytes + offset));
  } else if (f.total > f.head + f.tail && offset < f.total - f.tail) {
    s.skipped_to = f.total - f.tail;
  } else if (offset < f.total) {
    int64_t n = std::min(f.total - offset, want);
    s.data.resize(static_cast<size_t>(n));
    for (int64_t done = 0; done < n;) {
      int64_t pos = (offset + done - f.head) % f.tail;
      int64_t part = std::min(f.tail - pos, n - done);
      RETURN_IF_ERROR(GetAt(f.fd.get(), s.data.data() + done, static_cast<size_t>(part),
                            kHeaderBytes + f.head + pos));
      done += part;
    }
  }
  return s;
}

std::string ExecLogs::PathOf(const std::string& vm, int64_t exec_id, ExecLog::Channel ch) const {
  return dir_ + "/" + vm + "/" + std::to_string(exec_id) + kChannelSuffix[ch];
}

std::shared_ptr<ExecLog> ExecLogs::Start(const std::string& vm, int64_t exec_id) {
  (void)TrimVm(vm);
  auto log = std::make_shared<ExecLog>();
  log->vm_ = vm;
  {
    // Live before its files exist, so that no TrimVm takes them for a finished exec's.
    MutexLock l(mu_);
    live_[exec_id] = log;
  }
  {
    MutexLock l(log->mu_);
    Status dir = cap_ > 0 ? MakeDirs(dir_ + "/" + vm, 0700) : Status::Ok();
    for (ExecLog::Channel ch : {ExecLog::kStdout, ExecLog::kStderr}) {
      ExecLog::File& f = log->files_[ch];
      if (cap_ == 0) {
        f.error = "exec output is not kept: the daemon's exec log cap is 0";
        continue;
      }
      f.head = cap_ / 2;
      f.tail = cap_ - f.head;
      Result<UniqueFd> fd =
          dir.ok() ? OpenFile(PathOf(vm, exec_id, ch), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)
                   : Result<UniqueFd>(dir);
      Status st =
          fd.ok() ? PutAt(fd->get(), std::string(kMagic, 8) + U64(0) + U64(f.head) + U64(f.tail), 0)
                  : fd.status();
      if (!st.ok()) {
        f.error = "the output could not be kept: " + st.message();
        LogError("exec-logs", "exec " + std::to_string(exec_id) + ": " + f.error);
        continue;
      }
      f.fd = std::move(fd).value();
    }
  }
  return log;
}

void ExecLogs::Finish(int64_t exec_id) {
  std::shared_ptr<ExecLog> log;
  {
    MutexLock l(mu_);
    auto it = live_.find(exec_id);
    if (it == live_.end()) return;
    log = std::move(it->second);
    live_.erase(it);
  }
  log->Finish();
  if (!log->vm_.empty()) (void)TrimVm(log->vm_);
}

namespace {

constexpr const char* kTrimmedSuffix = ".trimmed";

// The exec ids with a file in a VM's log directory, and the bytes each takes.
std::map<int64_t, int64_t> LogBytesPerExec(const std::string& dir) {
  std::map<int64_t, int64_t> out;
  auto names = ListDir(dir);
  if (!names.ok()) return out;
  for (const std::string& n : *names) {
    size_t dot = n.find('.');
    if (dot == 0 || dot == std::string::npos) continue;
    const std::string id = n.substr(0, dot);
    if (id.size() > 18 || !std::all_of(id.begin(), id.end(), ::isdigit)) continue;
    struct stat st;
    if (::lstat((dir + "/" + n).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    out[std::stoll(id)] += static_cast<int64_t>(st.st_blocks) * 512;
  }
  return out;
}

std::string TrimmedReason(int64_t exec_id, int64_t vm_cap) {
  const std::string cap = vm_cap >= (1 << 20) ? std::to_string(vm_cap >> 20) + " MiB"
                                              : std::to_string(vm_cap) + " bytes";
  return "the output of exec " + std::to_string(exec_id) +
         " was trimmed: its VM's exec logs passed their cap of " + cap +
         " together, and the oldest finished execs' logs go first (tryboxd --exec-log-vm-cap)";
}

}  // namespace

int64_t ExecLogs::VmBytes(const std::string& vm) const {
  if (!ValidateName("VM id", vm).ok()) return 0;
  int64_t total = 0;
  for (const auto& [id, bytes] : LogBytesPerExec(dir_ + "/" + vm)) total += bytes;
  return total;
}

std::vector<int64_t> ExecLogs::TrimVm(const std::string& vm) {
  std::vector<int64_t> trimmed;
  if (vm_cap_ <= 0 || !ValidateName("VM id", vm).ok()) return trimmed;
  MutexLock t(trim_mu_);
  const std::string dir = dir_ + "/" + vm;
  std::map<int64_t, int64_t> per_exec = LogBytesPerExec(dir);
  int64_t total = 0;
  for (const auto& [id, bytes] : per_exec) total += bytes;
  for (const auto& [id, bytes] : per_exec) {  // oldest (lowest id) first
    if (total <= vm_cap_) break;
    {
      MutexLock l(mu_);
      if (live_.count(id)) continue;  // a running exec's log is bounded by the stream cap
    }
    const std::string marker = dir + "/" + std::to_string(id) + kTrimmedSuffix;
    struct stat st;
    if (::stat(marker.c_str(), &st) == 0) continue;  // already trimmed: only its marker
    // An empty marker: no blocks, so a VM of many execs never fills its cap with notes.
    if (!WriteFileAtomic(marker, "", 0600).ok()) break;  // a full disk: next time
    for (ExecLog::Channel ch : {ExecLog::kStdout, ExecLog::kStderr}) {
      (void)::unlink(PathOf(vm, id, ch).c_str());
    }
    const std::string why = TrimmedReason(id, vm_cap_);
    LogInfo("exec-logs", "VM " + vm + ": " + why);
    total -= bytes;
    trimmed.push_back(id);
  }
  return trimmed;
}

Result<std::shared_ptr<ExecLog>> ExecLogs::Open(const std::string& vm, int64_t exec_id) {
  {
    MutexLock l(mu_);
    auto it = live_.find(exec_id);
    if (it != live_.end()) return it->second;
  }
  RETURN_IF_ERROR(ValidateName("VM id", vm));
  auto log = std::make_shared<ExecLog>();
  MutexLock l(log->mu_);
  log->finished_ = true;
  struct stat marker;
  if (::stat((dir_ + "/" + vm + "/" + std::to_string(exec_id) + kTrimmedSuffix).c_str(), &marker) ==
      0) {
    for (ExecLog::File& f : log->files_) f.error = TrimmedReason(exec_id, vm_cap_);
    return log;
  }
  int missing = 0;
  for (ExecLog::Channel ch : {ExecLog::kStdout, ExecLog::kStderr}) {
    ExecLog::File& f = log->files_[ch];
    auto fd = OpenFile(PathOf(vm, exec_id, ch), O_RDONLY | O_CLOEXEC);
    if (!fd.ok()) {
      ++missing;
      f.error = "the output of exec " + std::to_string(exec_id) + " was not kept";
      continue;
    }
    char header[kHeaderBytes];
    Status st = GetAt(fd->get(), header, sizeof header, 0);
    if (st.ok()) {
      f.total = FromU64(header + kTotalAt);
      f.head = FromU64(header + 16);
      f.tail = FromU64(header + 24);
      if (std::memcmp(header, kMagic, 8) != 0 || f.total < 0 || f.head < 0 || f.tail < 0 ||
          f.head > kMaxPart || f.tail > kMaxPart) {
        st = Internal("not an exec log (bad header)");
      }
    }
    if (!st.ok()) {
      f.error = PathOf(vm, exec_id, ch) + ": " + st.message();
      continue;
    }
    f.fd = std::move(fd).value();
  }
  if (missing == 2) return NotFound("exec " + std::to_string(exec_id) + " has no kept output");
  return log;
}

Status ExecLogs::RemoveVm(const std::string& vm) {
  RETURN_IF_ERROR(ValidateName("VM id", vm));
  return RemoveTree(dir_ + "/" + vm);
}

}  // namespace trybox::daemon
