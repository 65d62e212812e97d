#include "workspace/manifest.h"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include "util/file_type.h"
#include "util/sha256.h"
#include "util/utf8.h"
#include "workspace/git_path.h"

namespace trybox::workspace {
namespace {

// Threads that read and hash a manifest's files at once (at most one per core).
constexpr long kMaxDigestThreads = 4;

// Reads one lstat'ed path into `e`, its git blob id too unless `blob_ids` is kNone.
Status FillEntry(const std::string& full, const struct stat& st, GitObjectHash blob_ids, Entry* e) {
  e->mode = st.st_mode & 07777;
  if (S_ISLNK(st.st_mode)) {
    std::string buf(static_cast<size_t>(st.st_size) + 1, '\0');
    ssize_t n = ::readlink(full.c_str(), buf.data(), buf.size());
    if (n < 0) return ErrnoError("readlink " + JsonSafe(full));
    buf.resize(static_cast<size_t>(n));
    e->symlink = true;
    e->target = buf;
    e->size = buf.size();
    e->sha256 = Sha256Hex(buf);
    if (blob_ids != GitObjectHash::kNone) e->blob = GitBlobId(buf, blob_ids);
    return Status::Ok();
  }
  e->size = static_cast<uint64_t>(st.st_size);
  ASSIGN_OR_RETURN(FileDigests d, DigestFile(full, blob_ids, e->size));
  e->sha256 = std::move(d.sha256);
  e->blob = std::move(d.git_blob);
  return Status::Ok();
}

}  // namespace

const char* Entry::GitMode() const {
  if (symlink) return "120000";
  return (mode & 0100) ? "100755" : "100644";
}

Result<Manifest> ManifestFromList(const std::string& root, const std::vector<std::string>& paths,
                                  const ExcludeList& excludes, std::vector<Skipped>* skipped,
                                  GitObjectHash blob_ids,
                                  const std::function<Status(const Manifest&)>& listed) {
  // First which paths go in (lstat, in order), then their digests, which is where the time
  // goes: read and hashed on every core, each file by one thread.
  struct Todo {
    std::string full;
    struct stat st;
    Entry e;
    Status status = Status::Ok();
  };
  std::vector<Todo> todo;
  for (const auto& p : paths) {
    std::string full = root + "/" + p;
    struct stat st;
    if (::lstat(full.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) {
        if (!excludes.Excluded(p, false)) skipped->push_back({p, "deleted in the working tree"});
        continue;
      }
      return ErrnoError("lstat " + JsonSafe(full));
    }
    if (excludes.Excluded(p, S_ISDIR(st.st_mode))) continue;
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
      skipped->push_back(
          {p, S_ISDIR(st.st_mode) ? "a directory (a submodule?)" : DescribeFileType(st.st_mode)});
      continue;
    }
    PathRefusal refusal = UnstorablePath(p, S_ISLNK(st.st_mode));
    if (!refusal.ok()) {
      skipped->push_back({p, refusal.reason});
      continue;
    }
    Todo t{std::move(full), st, Entry(), Status::Ok()};
    t.e.path = p;
    t.e.mode = st.st_mode & 07777;
    t.e.size = static_cast<uint64_t>(st.st_size);
    todo.push_back(std::move(t));
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  // What is known before any file is read, for `listed` (a symlink's target is read here:
  // it is part of what a symlink is).
  Status listed_status = Status::Ok();
  std::thread beside;
  if (listed) {
    Manifest sized;
    for (Todo& t : todo) {
      if (S_ISLNK(t.st.st_mode)) {
        t.status = FillEntry(t.full, t.st, blob_ids, &t.e);
        if (!t.status.ok()) return t.status;
      }
      sized[t.e.path] = t.e;
    }
    beside = std::thread([&, sized = std::move(sized)] {
      listed_status = listed(sized);
      if (!listed_status.ok()) failed = true;
    });
  }
  auto work = [&] {
    for (size_t i = next++; i < todo.size() && !failed; i = next++) {
      Todo& t = todo[i];
      if (t.e.symlink) continue;  // done above
      t.status = FillEntry(t.full, t.st, blob_ids, &t.e);
      if (!t.status.ok()) failed = true;
    }
  };
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  const size_t threads =
      std::min<size_t>(std::clamp<long>(cores, 1, kMaxDigestThreads), (todo.size() + 63) / 64);
  std::vector<std::thread> helpers;
  for (size_t i = 1; i < threads; ++i) helpers.emplace_back(work);
  work();
  for (auto& h : helpers) h.join();
  if (beside.joinable()) beside.join();
  RETURN_IF_ERROR(listed_status);
  Manifest m;
  for (auto& t : todo) {
    if (!t.status.ok()) return t.status;
    // A failed read stops the others: what they left unread is not in the manifest.
    if (failed) continue;
    m[t.e.path] = std::move(t.e);
  }
  return m;
}

Result<Manifest> ManifestFromTree(const std::string& root, const ExcludeList& excludes,
                                  std::vector<Skipped>* skipped) {
  // nftw takes no user pointer; the walk is short and single-threaded per call, so a
  // thread_local context carries the state.
  struct Walk {
    const std::string* root;
    const ExcludeList* excludes;
    Manifest* m;
    std::vector<Skipped>* skipped;
    Status st;
  };
  thread_local Walk* walk = nullptr;
  Manifest m;
  Walk w{&root, &excludes, &m, skipped, Status::Ok()};
  walk = &w;
  auto visit = [](const char* fpath, const struct stat* sb, int type, struct FTW* ftw) -> int {
    std::string full = fpath;
    if (ftw->level == 0) return FTW_CONTINUE;
    std::string rel = full.substr(walk->root->size() + 1);
    auto refused = [&](bool dir) {
      PathRefusal r = UnstorablePath(rel, !dir && S_ISLNK(sb->st_mode));
      if (!r.ok() && walk->skipped) {
        walk->skipped->push_back({rel, dir ? r.reason + " (and everything below it)" : r.reason});
      }
      return !r.ok();
    };
    if (type == FTW_D || type == FTW_DNR) {
      if (walk->excludes->Excluded(rel, true)) return FTW_SKIP_SUBTREE;
      if (refused(true)) return FTW_SKIP_SUBTREE;
      if (type == FTW_DNR) {
        walk->st = PermissionDenied("cannot read directory " + JsonSafe(full));
        return FTW_STOP;
      }
      return FTW_CONTINUE;
    }
    if (type == FTW_NS) {
      walk->st = ErrnoError("stat " + JsonSafe(full));
      return FTW_STOP;
    }
    if (!S_ISREG(sb->st_mode) && !S_ISLNK(sb->st_mode)) return FTW_CONTINUE;
    if (walk->excludes->Excluded(rel, false)) return FTW_CONTINUE;
    if (refused(false)) return FTW_CONTINUE;
    Entry e;
    e.path = rel;
    walk->st = FillEntry(full, *sb, GitObjectHash::kNone, &e);
    if (!walk->st.ok()) return FTW_STOP;
    (*walk->m)[rel] = std::move(e);
    return FTW_CONTINUE;
  };
  int rc = ::nftw(root.c_str(), visit, 64, FTW_PHYS | FTW_ACTIONRETVAL);
  walk = nullptr;
  if (!w.st.ok()) return w.st;
  if (rc == -1) return ErrnoError("walk " + JsonSafe(root));
  return m;
}

uint64_t TotalBytes(const Manifest& m) {
  uint64_t n = 0;
  for (const auto& [p, e] : m) n += e.size;
  return n;
}

Json SkippedToJson(const std::vector<Skipped>& skipped) {
  Json a = Json::array();
  for (const auto& s : skipped) {
    Json j = Json::object();
    SetBytesField(j, "path", s.path);
    j["reason"] = JsonSafe(s.reason);
    a.push_back(std::move(j));
  }
  return a;
}

Json ManifestToJson(const Manifest& m) {
  Json a = Json::array();
  for (const auto& [p, e] : m) {
    Json j = Json::object();
    SetBytesField(j, "path", p);
    j["type"] = e.symlink ? "symlink" : "file";
    j["mode"] = e.mode;
    j["size"] = e.size;
    j["sha256"] = e.sha256;
    if (e.symlink) SetBytesField(j, "target", e.target);
    if (!e.blob.empty()) j["blob"] = e.blob;
    a.push_back(std::move(j));
  }
  return a;
}

Result<Manifest> ManifestFromJson(const Json& j) {
  if (!j.is_array()) return InvalidArgument("a manifest must be a JSON array");
  Manifest m;
  try {
    for (const auto& x : j) {
      Entry e;
      ASSIGN_OR_RETURN(e.path, GetBytesField(x, "path"));
      e.symlink = x.at("type").get<std::string>() == "symlink";
      e.mode = x.at("mode").get<uint32_t>();
      e.size = x.at("size").get<uint64_t>();
      e.sha256 = x.at("sha256").get<std::string>();
      if (e.symlink) {
        ASSIGN_OR_RETURN(e.target, GetBytesField(x, "target"));
      }
      e.blob = x.value("blob", "");
      std::string path = e.path;
      m[path] = std::move(e);
    }
  } catch (const std::exception& ex) {
    return InvalidArgument(std::string("malformed manifest: ") + ex.what());
  }
  return m;
}

const char* KindName(Change::Kind k) {
  switch (k) {
    case Change::Kind::kAdded:
      return "added";
    case Change::Kind::kModified:
      return "modified";
    case Change::Kind::kDeleted:
      return "deleted";
    case Change::Kind::kModeChanged:
      return "mode_changed";
    case Change::Kind::kRenamed:
      return "renamed";
  }
  return "unknown";
}

Result<Change::Kind> KindFromName(const std::string& name) {
  for (auto k : {Change::Kind::kAdded, Change::Kind::kModified, Change::Kind::kDeleted,
                 Change::Kind::kModeChanged, Change::Kind::kRenamed}) {
    if (name == KindName(k)) return k;
  }
  return InvalidArgument("unknown change kind " + name);
}

std::vector<Change> Diff(const Manifest& before, const Manifest& after) {
  std::vector<Change> out;
  std::vector<const Entry*> added, deleted;
  for (const auto& [p, a] : after) {
    auto it = before.find(p);
    if (it == before.end()) {
      added.push_back(&a);
      continue;
    }
    const Entry& b = it->second;
    Change c{Change::Kind::kModified, p, "", b.size, a.size, b.mode, a.mode};
    if (b.symlink != a.symlink || b.sha256 != a.sha256) {
      out.push_back(c);
    } else if (b.mode != a.mode) {
      c.kind = Change::Kind::kModeChanged;
      out.push_back(c);
    }
  }
  for (const auto& [p, b] : before) {
    if (!after.count(p)) deleted.push_back(&b);
  }
  // Renames: pair each deleted entry with the first unpaired added one of equal content.
  // The added entries of each content, in path order, are a queue.
  std::map<std::pair<bool, std::string>, std::deque<size_t>> by_content;
  for (size_t i = 0; i < added.size(); ++i) {
    by_content[{added[i]->symlink, added[i]->sha256}].push_back(i);
  }
  std::vector<bool> used(added.size(), false);
  for (const Entry* d : deleted) {
    auto it = by_content.find({d->symlink, d->sha256});
    if (it == by_content.end() || it->second.empty()) {
      out.push_back({Change::Kind::kDeleted, d->path, "", d->size, 0, d->mode, 0});
      continue;
    }
    size_t i = it->second.front();
    it->second.pop_front();
    used[i] = true;
    const Entry* a = added[i];
    out.push_back({Change::Kind::kRenamed, a->path, d->path, d->size, a->size, d->mode, a->mode});
  }
  for (size_t i = 0; i < added.size(); ++i) {
    if (!used[i]) {
      out.push_back(
          {Change::Kind::kAdded, added[i]->path, "", 0, added[i]->size, 0, added[i]->mode});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Change& a, const Change& b) { return a.path < b.path; });
  return out;
}

Json ChangesToJson(const std::vector<Change>& changes) {
  Json a = Json::array();
  for (const auto& c : changes) {
    Json j = {{"change", KindName(c.kind)}};
    SetBytesField(j, "path", c.path);
    if (c.kind == Change::Kind::kRenamed) SetBytesField(j, "from", c.old_path);
    if (c.kind != Change::Kind::kAdded) {
      j["old_size"] = c.old_size;
      j["old_mode"] = c.old_mode;
    }
    if (c.kind != Change::Kind::kDeleted) {
      j["new_size"] = c.new_size;
      j["new_mode"] = c.new_mode;
    }
    a.push_back(std::move(j));
  }
  return a;
}

}  // namespace trybox::workspace
