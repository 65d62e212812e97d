// The store's guard at run time: its mark (what the last daemon committed), the write probe
// new work passes before it starts, and the figures `doctor` shows. docs/store.md.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>

#include "store/schema.h"
#include "store/stmt.h"
#include "store/store.h"
#include "util/fd.h"

namespace trybox::store {
namespace {

constexpr const char* kMarkTables[] = {"execs", "egress", "collects"};
// Fixed width, so that each rewrite is one pwrite over the same bytes.
constexpr int kMarkLineWidth = 21;

std::string Mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string DirOf(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

int64_t FileBytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

}  // namespace

void Store::OpenMarkLocked() {
  info_.path = path_;
  int64_t in_db[kMarkKinds] = {};
  for (int k = 0; k < kMarkKinds; ++k) {
    Stmt s(db_, "SELECT seq FROM sqlite_sequence WHERE name = ?");
    if (!s.prepared().ok()) continue;
    s.Bind(1, std::string(kMarkTables[k]));
    if (s.Step().value_or(false)) in_db[k] = s.Int(0);
  }
  const std::string mark_path = path_ + ".mark";
  // A new store starts a new mark: an old one belonged to the file moved aside.
  if (info_.created) (void)::unlink(mark_path.c_str());
  auto text = ReadFileToString(mark_path);
  std::string behind;
  if (text.ok()) {
    for (int k = 0; k < kMarkKinds; ++k) {
      size_t at = static_cast<size_t>(k) * kMarkLineWidth;
      if (text->size() < at + kMarkLineWidth) break;
      int64_t marked = std::strtoll(text->substr(at, kMarkLineWidth).c_str(), nullptr, 10);
      if (marked > in_db[k]) {
        behind += std::string(behind.empty() ? "" : ", ") + kMarkTables[k] + " up to id " +
                  std::to_string(marked) + " (the store has up to " + std::to_string(in_db[k]) +
                  ")";
      }
    }
  }
  if (!behind.empty()) {
    info_.warning = "the store " + path_ + " is behind its mark: the last daemon committed " +
                    behind +
                    ". Those rows, and whatever was committed with them, are lost: its "
                    "write-ahead log was lost after a crash, or an older copy was put back";
  }
  for (int k = 0; k < kMarkKinds; ++k) mark_[k] = in_db[k];
  mark_fd_ = ::open(mark_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  NoteInsertLocked(kMarkExecs, mark_[kMarkExecs]);
}

void Store::NoteInsertLocked(MarkKind kind, int64_t id) {
  if (id > mark_[kind]) mark_[kind] = id;
  if (mark_fd_ < 0) return;
  char buf[kMarkLineWidth * kMarkKinds + 1];
  for (int k = 0; k < kMarkKinds; ++k) {
    std::snprintf(buf + k * kMarkLineWidth, kMarkLineWidth + 1, "%020" PRId64 "\n", mark_[k]);
  }
  // After the commit, never before: the mark may lag the store (a failed write costs a
  // warning never given), never lead it. No fsync: it is as durable as the WAL it shadows.
  (void)!::pwrite(mark_fd_, buf, kMarkLineWidth * kMarkKinds, 0);
}

StoreInfo Store::info() const {
  MutexLock lock(mu_);
  return info_;
}

StoreSize Store::Size() const {
  StoreSize out;
  out.db_bytes = FileBytes(path_);
  out.wal_bytes = FileBytes(path_ + "-wal");
  struct statvfs fs;
  if (::statvfs(DirOf(path_).c_str(), &fs) == 0) {
    out.free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  }
  return out;
}

Status Store::CheckRoom() const {
  StoreSize size = Size();
  if (size.free_bytes >= 0 && size.free_bytes < kStoreFloorBytes) {
    return ResourceExhausted("store_unavailable: the filesystem of the store " + path_ + " has " +
                             Mib(size.free_bytes) + " free, below the " + Mib(kStoreFloorBytes) +
                             " it needs to record new work, so nothing was started; free "
                             "space there and it works again at once");
  }
  return Status::Ok();
}

Status Store::CheckWritable() {
  RETURN_IF_ERROR(CheckRoom());
  MutexLock lock(mu_);
  Stmt s(db_, "INSERT OR REPLACE INTO meta (key, value) VALUES ('write_probe', ?)");
  Status st = s.prepared();
  if (st.ok()) {
    s.Bind(1, std::to_string(NowSeconds()));
    st = s.Step().status();
  }
  if (st.ok()) return st;
  return Status(st.code() == Code::kResourceExhausted ? st.code() : Code::kUnavailable,
                "store_unavailable: the store " + path_ +
                    " cannot record new work, so nothing was started: " + st.message());
}

}  // namespace trybox::store
