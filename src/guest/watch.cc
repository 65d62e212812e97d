#include "guest/watch.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "guest/wakeup.h"
#include "util/fd.h"
#include "util/utf8.h"

namespace trybox::guest {
namespace {

using Json = nlohmann::json;

constexpr uint32_t kMask = IN_CREATE | IN_DELETE | IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO |
                           IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW |
                           IN_EXCL_UNLINK;

Json Fail(const char* error, const std::string& message) {
  return {{"ok", false}, {"error", error}, {"message", message}};
}

const char* ErrnoClass(int err) {
  switch (err) {
    case ENOENT:
      return "not_found";
    case ENOTDIR:
      return "not_a_directory";
    case EACCES:
    case EPERM:
      return "permission_denied";
    case ENOSPC:  // inotify: the user's watch limit
      return "too_many_directories";
    default:
      return "io";
  }
}

// The inotify watches of one request: each watched directory by its descriptor, with its
// path relative to the watched root ("" for the root itself).
class Watches {
 public:
  Watches(int fd, std::string root, bool recursive)
      : fd_(fd), root_(std::move(root)), recursive_(recursive) {}

  // Watches `rel` (and, when recursive, every directory below it, not following symbolic
  // links). An error names the directory that could not be watched.
  Json Add(const std::string& rel) {
    if (rel_by_wd_.size() >= kMaxWatchedDirs) {
      return Fail("too_many_directories",
                  "more than " + std::to_string(kMaxWatchedDirs) + " directories under " + root_);
    }
    const std::string abs = rel.empty() ? root_ : root_ + "/" + rel;
    const int wd = ::inotify_add_watch(fd_, abs.c_str(), kMask);
    if (wd < 0) {
      const int err = errno;
      // A directory that went between its creation event and now is simply not watched.
      if (!rel.empty() && (err == ENOENT || err == ENOTDIR)) return nullptr;
      return Fail(ErrnoClass(err), abs + ": " + std::strerror(err));
    }
    rel_by_wd_[wd] = rel;
    if (rel.empty()) root_wd_ = wd;
    if (!recursive_) return nullptr;
    DIR* d = ::opendir(abs.c_str());
    if (d == nullptr) return nullptr;  // gone, or unreadable: its own events still come
    std::vector<std::string> subdirs;
    while (struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      bool dir = e->d_type == DT_DIR;
      if (e->d_type == DT_UNKNOWN) {
        struct stat st;
        dir =
            ::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
      }
      if (dir) subdirs.push_back(rel.empty() ? name : rel + "/" + name);
    }
    ::closedir(d);
    for (const auto& sub : subdirs) {
      Json failed = Add(sub);
      if (!failed.is_null()) return failed;
    }
    return nullptr;
  }

  // Stops watching `rel` and everything below it (a directory moved away).
  void Drop(const std::string& rel) {
    for (auto it = rel_by_wd_.begin(); it != rel_by_wd_.end();) {
      const std::string& r = it->second;
      if (r == rel || r.rfind(rel + "/", 0) == 0) {
        (void)::inotify_rm_watch(fd_, it->first);
        it = rel_by_wd_.erase(it);
      } else {
        ++it;
      }
    }
  }

  const std::string* RelOf(int wd) const {
    auto it = rel_by_wd_.find(wd);
    return it == rel_by_wd_.end() ? nullptr : &it->second;
  }
  void Forget(int wd) { rel_by_wd_.erase(wd); }
  int root_wd() const { return root_wd_; }
  size_t size() const { return rel_by_wd_.size(); }
  bool recursive() const { return recursive_; }

 private:
  const int fd_;
  const std::string root_;
  const bool recursive_;
  int root_wd_ = -1;
  std::map<int, std::string> rel_by_wd_;
};

const char* OpOf(uint32_t mask) {
  if (mask & (IN_CREATE | IN_MOVED_TO)) return "create";
  if (mask & IN_DELETE) return "remove";
  if (mask & IN_MOVED_FROM) return "rename";
  if (mask & IN_MODIFY) return "write";
  if (mask & IN_ATTRIB) return "chmod";
  return nullptr;
}

Json FsEvent(const char* op, const std::string& name) {
  Json ev = {{"type", "fs"}, {"op", op}};
  if (IsValidUtf8(name)) {
    ev["name"] = name;
  } else {
    ev["name_b64"] = Base64Encode(name);
  }
  return ev;
}

}  // namespace

void ServeWatch(channel::Stream& stream, const Json& request) {
  const Json path_j = request.value("path", Json());
  const Json rec_j = request.value("recursive", Json(false));
  if (!path_j.is_string() || !rec_j.is_boolean()) {
    (void)stream.End(Fail("bad_request", "watch wants a string 'path' and a boolean 'recursive'"));
    return;
  }
  std::string root = path_j.get<std::string>();
  if (root.empty() || root[0] != '/' || root.size() > PATH_MAX ||
      root.find('\0') != std::string::npos) {
    (void)stream.End(Fail("bad_request", "watch wants an absolute path"));
    return;
  }
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  UniqueFd fd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!fd.valid()) {
    (void)stream.End(Fail(ErrnoClass(errno), std::string("inotify: ") + std::strerror(errno)));
    return;
  }
  auto wake = Wakeup::Make();
  if (!wake.ok()) {
    (void)stream.End(Fail("io", wake.status().message()));
    return;
  }
  Watches watches(fd.get(), root, rec_j.get<bool>());
  if (Json failed = watches.Add(""); !failed.is_null()) {
    (void)stream.End(failed);
    return;
  }
  if (!stream.SendEvent({{"type", "started"}, {"dirs", watches.size()}}).ok()) return;

  // The host ends a watch by resetting (or ending) its stream.
  std::atomic<bool> host_done{false};
  std::thread host([&] {
    for (;;) {
      auto m = stream.Next();
      if (!m.ok() || m->kind == channel::Stream::Message::Kind::kReset ||
          m->kind == channel::Stream::Message::Kind::kEnd) {
        break;
      }
    }
    host_done = true;
    wake->Signal();
  });

  Json ending;  // set when the watch ends on its own (the directory went, an error)
  alignas(struct inotify_event) char buf[64 * 1024];
  while (!host_done && ending.is_null()) {
    struct pollfd p[2] = {{fd.get(), POLLIN, 0}, {wake->fd_for_poll(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      ending = Fail("io", std::string("poll: ") + std::strerror(errno));
      break;
    }
    if (p[1].revents != 0) break;
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      ending = Fail("io", std::string("read inotify: ") + std::strerror(errno));
      break;
    }
    for (ssize_t off = 0; off < n && ending.is_null();) {
      const auto* ev = reinterpret_cast<const struct inotify_event*>(buf + off);
      off += static_cast<ssize_t>(sizeof(struct inotify_event) + ev->len);
      if (ev->mask & IN_Q_OVERFLOW) {
        if (!stream.SendEvent({{"type", "overflow"}}).ok()) host_done = true;
        continue;
      }
      if (ev->wd == watches.root_wd() && (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF))) {
        ending = Fail("gone", root + " was removed or moved away");
        break;
      }
      if (ev->mask & IN_IGNORED) {
        watches.Forget(ev->wd);
        continue;
      }
      const std::string* prefix = watches.RelOf(ev->wd);
      const char* op = OpOf(ev->mask);
      if (prefix == nullptr || op == nullptr || ev->len == 0) continue;
      const std::string name(ev->name);
      const std::string rel = prefix->empty() ? name : *prefix + "/" + name;
      if (watches.recursive() && (ev->mask & IN_ISDIR)) {
        if (ev->mask & IN_MOVED_FROM) watches.Drop(rel);
        if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
          if (Json failed = watches.Add(rel); !failed.is_null()) ending = failed;
        }
      }
      if (!stream.SendEvent(FsEvent(op, rel)).ok()) host_done = true;
    }
  }
  if (!ending.is_null()) (void)stream.End(ending);
  stream.Interrupt();
  host.join();
  if (!stream.finished()) (void)stream.End({{"ok", true}});
}

}  // namespace trybox::guest
