// The pieces of an image build that touch the host (build.h): apt sources, the scratch disk,
// the images directory's lock, install and leftovers. BuildImage itself, which brings the
// kernel and initramfs code (and libarchive) with it, is in base_image.cc, so that what
// links only these stays light (the CLI: docs/performance.md, "The CLI's start").
#include "image/build.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>

#include "util/ascii.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/process.h"

namespace trybox::image {
namespace {

constexpr uint64_t kScratchSize = uint64_t{8} << 30;
// The scratch file system's identity: the same for every image (it is empty, and each VM
// writes its own copy). 2025-01-01T00:00:00Z for its times.
constexpr const char* kScratchUuid = "7472796b-6f78-4000-8000-736372617463";
constexpr const char* kScratchHashSeed = "7472796b-6f78-4000-8000-686173687365";
constexpr time_t kScratchTime = 1735689600;

bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
std::string Pid() { return std::to_string(::getpid()); }

// True if any deb822 stanza is enabled, has type "deb" and lists `suite`.
bool Deb822ServesSuite(const std::string& content, const std::string& suite) {
  std::istringstream in(content + "\n\n");
  std::map<std::string, std::string> fields;
  std::string last;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty() && line[0] == '#') continue;
    if (line.find_first_not_of(" \t") == std::string::npos) {
      if (Words(fields["enabled"]) != std::vector<std::string>{"no"} &&
          Contains(Words(fields["types"]), "deb") && Contains(Words(fields["suites"]), suite)) {
        return true;
      }
      fields.clear();
      last.clear();
    } else if (line[0] == ' ' || line[0] == '\t') {
      if (!last.empty()) fields[last] += " " + line;
    } else if (size_t colon = line.find(':'); colon != std::string::npos) {
      last = AsciiLower(line.substr(0, colon));
      fields[last] = line.substr(colon + 1);
    }
  }
  return false;
}

// True if a "deb [options] URI SUITE COMPONENTS..." line names `suite`.
bool OneLineServesSuite(const std::string& content, const std::string& suite) {
  std::istringstream in(content);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> t = Words(line.substr(0, line.find('#')));
    if (t.empty() || t[0] != "deb") continue;
    size_t i = 1;
    if (i < t.size() && t[i].starts_with("[")) {
      while (i < t.size() && !t[i].ends_with("]")) ++i;
      ++i;
    }
    if (i + 1 < t.size() && t[i + 1] == suite) return true;
  }
  return false;
}

std::optional<pid_t> ParsePid(const std::string& s) {
  if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), ::isdigit)) return {};
  pid_t pid = std::stoi(s);
  if (pid <= 0) return {};
  return pid;
}

// The pid encoded in a build leftover's name: ".build-NAME-PID", ".old-NAME-PID" or
// "STEP-PID-RANDOM" (a TempDir under cache_dir/tmp).
std::optional<pid_t> LeftoverPid(const std::string& name) {
  if (name.starts_with(".build-") || name.starts_with(".old-")) {
    return ParsePid(name.substr(name.rfind('-') + 1));
  }
  for (const char* step : {"kernel-", "rootfs-", "scratch-"}) {
    if (!name.starts_with(step)) continue;
    std::string rest = name.substr(std::strlen(step));
    return ParsePid(rest.substr(0, rest.find('-')));
  }
  return {};
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string UnescapeMountPath(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool HasMountsUnder(const std::string& path) {
  char real[PATH_MAX];
  if (::realpath(path.c_str(), real) == nullptr) return false;
  std::string root = real;
  Result<std::string> info = ReadFileToString("/proc/self/mountinfo");
  if (!info.ok()) return true;  // cannot tell: do not recurse
  std::istringstream in(*info);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f = Words(line);
    if (f.size() < 5) continue;
    std::string mp = UnescapeMountPath(f[4]);
    if (mp == root || mp.starts_with(root + "/")) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> Words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

Status SyncDir(const std::string& dir, bool whole_fs) {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(dir, O_RDONLY | O_DIRECTORY));
  if ((whole_fs ? ::syncfs(fd.get()) : ::fsync(fd.get())) != 0) return ErrnoError("sync " + dir);
  return Status::Ok();
}

Status MakeScratchImage(const std::string& tmp_dir, const std::string& out) {
  const std::string raw = tmp_dir + "/scratch.raw";
  {
    ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(raw, O_WRONLY | O_CREAT | O_EXCL, 0644));
    if (::ftruncate(fd.get(), static_cast<off_t>(kScratchSize)) != 0) {
      return ErrnoError("truncate " + raw);
    }
    RETURN_IF_ERROR(fd.Close());
  }
  // Byte for byte the same every time (a fixed UUID, directory hash seed and time), so a
  // rebuild that changes nothing else keeps the manifest, and the images derived from it and
  // the templates stay current. With mke2fs's random ones, every `image build debian-12`
  // made debian-12-dev stale (rebuilt: 8 min under TCG) and every template cold.
  RETURN_IF_ERROR(RunChecked({"env", "E2FSPROGS_FAKE_TIME=" + std::to_string(kScratchTime),
                              "mkfs.ext4", "-q", "-F", "-L", "trybox-scratch", "-U", kScratchUuid,
                              "-E", std::string("hash_seed=") + kScratchHashSeed, raw}));
  return RunChecked({"qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, out});
}

std::string NowUtc() {
  time_t now = ::time(nullptr);
  struct tm tm;
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Result<UniqueFd> LockImagesRoot(const std::string& images_root) {
  std::string path = images_root + "/.lock";
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDWR | O_CREAT, 0644));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return FailedPrecondition("another image build is running in " + images_root);
    }
    return ErrnoError("flock " + path);
  }
  return fd;
}

Status InstallImageDir(const std::string& images_root, const std::string& name,
                       const std::string& build_dir, RemoveOnExit& cleanup) {
  const std::string final_dir = images_root + "/" + name;
  // One atomic swap: a concurrent boot sees the old image or the new one, never neither.
  // build_dir then holds the old image, which `cleanup` removes.
  if (::renameat2(AT_FDCWD, build_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    return SyncDir(images_root, false);
  }
  if (errno == ENOENT) {
    if (::rename(build_dir.c_str(), final_dir.c_str()) != 0) {
      return ErrnoError("rename " + build_dir + " -> " + final_dir);
    }
    cleanup.Release();
    return SyncDir(images_root, false);
  }
  if (errno != EINVAL && errno != ENOSYS) {
    return ErrnoError("swap " + build_dir + " with " + final_dir);
  }
  // The filesystem cannot exchange: move the old image aside first.
  const std::string old_dir = images_root + "/.old-" + name + "-" + Pid();
  if (::rename(final_dir.c_str(), old_dir.c_str()) != 0) {
    return ErrnoError("rename " + final_dir + " -> " + old_dir);
  }
  if (::rename(build_dir.c_str(), final_dir.c_str()) != 0) {
    Status st = ErrnoError("rename " + build_dir + " -> " + final_dir);
    (void)::rename(old_dir.c_str(), final_dir.c_str());
    return st;
  }
  cleanup.Release();
  (void)RemoveTree(old_dir);
  return SyncDir(images_root, false);
}

Result<AptSources> FindAptSources(const std::string& apt_dir, const std::string& suite) {
  std::vector<std::string> names;
  const std::string list_dir = apt_dir + "/sources.list.d";
  if (DIR* d = ::opendir(list_dir.c_str())) {
    while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::vector<std::pair<std::string, bool>> candidates;  // (path, deb822)
  for (const std::string& n : names) {
    // Anything else ("x.sources.disabled-by-farm", editor backups) is ignored, as apt does.
    if (n.ends_with(".sources")) candidates.emplace_back(list_dir + "/" + n, true);
    if (n.ends_with(".list")) candidates.emplace_back(list_dir + "/" + n, false);
  }
  candidates.emplace_back(apt_dir + "/sources.list", false);
  for (const auto& [path, deb822] : candidates) {
    Result<std::string> content = ReadFileToString(path);
    if (!content.ok()) {
      if (content.status().code() == Code::kNotFound) continue;
      return content.status();
    }
    if (deb822 ? Deb822ServesSuite(*content, suite) : OneLineServesSuite(*content, suite)) {
      return AptSources{path, std::move(content).value()};
    }
  }
  return NotFound("no apt source for suite '" + suite + "' in " + list_dir +
                  "/*.sources, *.list or " + apt_dir + "/sources.list");
}

namespace {

uint64_t TreeDiskBytes(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return 0;
  uint64_t total = static_cast<uint64_t>(st.st_blocks) * 512;
  if (!S_ISDIR(st.st_mode)) return total;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return total;
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") total += TreeDiskBytes(path + "/" + n);
  }
  ::closedir(d);
  return total;
}

// Leftovers in `dir` whose process is gone and under which nothing is mounted.
std::vector<std::string> DeadLeftovers(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    std::optional<pid_t> pid = LeftoverPid(name);
    if (!pid || ProcessExists(*pid)) continue;
    std::string path = dir + "/" + name;
    if (HasMountsUnder(path)) {
      LogWarn("image", "not removing " + path + ": something is still mounted under it");
      continue;
    }
    out.push_back(path);
  }
  return out;
}

}  // namespace

std::vector<StaleBuild> FindStaleBuilds(const std::string& dir) {
  std::vector<StaleBuild> out;
  for (std::string& path : DeadLeftovers(dir)) {
    uint64_t bytes = TreeDiskBytes(path);
    out.push_back({std::move(path), bytes});
  }
  return out;
}

std::vector<std::string> RemoveStaleBuilds(const std::string& dir) {
  std::vector<std::string> removed;
  for (const std::string& path : DeadLeftovers(dir)) {
    // A frozen `.build-` directory is 0555: opened up so that a non-root daemon can empty it.
    (void)::chmod(path.c_str(), 0755);
    if (RemoveTree(path).ok()) removed.push_back(path);
  }
  return removed;
}

}  // namespace trybox::image
