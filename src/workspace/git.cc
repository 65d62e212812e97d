#include "workspace/git.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <set>
#include <thread>

#include "util/fd.h"
#include "util/names.h"
#include "util/process.h"
#include "util/utf8.h"

namespace trybox::workspace {
namespace {

constexpr const char* kZeroId = "0000000000000000000000000000000000000000";
constexpr size_t kErrTail = 2000;

std::vector<std::string> SplitZ(const std::string& s) { return SplitRecords(s, '\0'); }

// A path in the C-quoted form `hash-object --stdin-paths` unquotes. Its plain form cannot
// carry a newline, and git's line reader drops a carriage return before the newline, which
// made "name\r" hash the file "name".
std::string CQuote(const std::string& p) {
  std::string out = "\"";
  for (char c : p) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\%03o", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Reads `fd` to EOF into `out`.
void Drain(int fd, std::string* out) {
  char buf[65536];
  for (;;) {
    auto n = ReadSome(fd, buf, sizeof buf);
    if (!n.ok() || *n == 0) return;
    out->append(buf, *n);
  }
}

}  // namespace

std::vector<std::string> SplitRecords(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::vector<std::string> HardenedGitEnv(const std::string& dir, const std::string& index_file) {
  const char* path = std::getenv("PATH");
  std::vector<std::string> env = {
      std::string("PATH=") + (path ? path : "/usr/bin:/bin"),
      "LC_ALL=C",
      "HOME=/nonexistent",
      "GIT_CONFIG_GLOBAL=/dev/null",
      "GIT_CONFIG_SYSTEM=/dev/null",
      "GIT_CONFIG_NOSYSTEM=1",
      "GIT_TERMINAL_PROMPT=0",
      "GIT_ASKPASS=/bin/false",
      "SSH_ASKPASS=/bin/false",
      "GIT_OPTIONAL_LOCKS=0",
      "GIT_NO_REPLACE_OBJECTS=1",
      "GIT_ALLOW_PROTOCOL=",
      "GIT_PAGER=cat",
      "PAGER=cat",
      "GIT_EDITOR=false",
      "GIT_DIR=" + dir + "/.git",
      "GIT_WORK_TREE=" + dir,
      "GIT_AUTHOR_NAME=trybox",
      "GIT_AUTHOR_EMAIL=trybox@localhost",
      "GIT_COMMITTER_NAME=trybox",
      "GIT_COMMITTER_EMAIL=trybox@localhost",
  };
  if (!index_file.empty()) env.push_back("GIT_INDEX_FILE=" + index_file);
  return env;
}

std::vector<std::string> HardenedGitArgs() {
  std::vector<std::string> args = {"git", "--no-pager", "--no-replace-objects"};
  for (const char* kv :
       {"core.hooksPath=/dev/null", "core.fsmonitor=false", "core.pager=cat", "core.editor=false",
        "sequence.editor=false", "core.sshCommand=false",
        "core.askPass=", "credential.helper=", "protocol.allow=never",
        "core.attributesFile=/dev/null", "core.untrackedCache=false", "core.splitIndex=false",
        "gc.auto=0", "maintenance.auto=false", "core.protectNTFS=true", "core.protectHFS=true"}) {
    args.push_back("-c");
    args.push_back(kv);
  }
  return args;
}

Result<GitRepo> GitRepo::Open(const std::string& dir) {
  if (dir.empty()) return InvalidArgument("the workspace directory is empty");
  char real[PATH_MAX];
  if (!::realpath(dir.c_str(), real)) return ErrnoError("workspace " + dir);
  struct stat st;
  if (::stat(real, &st) != 0) return ErrnoError("workspace " + dir);
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("workspace " + dir + " is not a directory");
  std::string top = real;
  if (::lstat((top + "/.git").c_str(), &st) != 0) {
    return InvalidArgument("workspace " + dir +
                           " is not a git working tree (no .git in it; pass the top level of "
                           "the repository)");
  }
  GitRepo repo(top);
  auto check = repo.Run({"rev-parse", "--git-dir"});
  if (!check.ok()) {
    return InvalidArgument("workspace " + dir +
                           " is not a usable git repository: " + check.status().message());
  }
  return repo;
}

Result<std::string> GitRepo::Run(const std::vector<std::string>& args, std::string_view input,
                                 const std::string& index_file, std::string* err_out) const {
  int pin[2], pout[2], perr[2];
  if (::pipe2(pin, O_CLOEXEC) || ::pipe2(pout, O_CLOEXEC) || ::pipe2(perr, O_CLOEXEC)) {
    return ErrnoError("pipe");
  }
  UniqueFd in_r(pin[0]), in_w(pin[1]), out_r(pout[0]), out_w(pout[1]), err_r(perr[0]),
      err_w(perr[1]);
  SpawnOptions o;
  o.argv = HardenedGitArgs();
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  std::vector<std::string> env = HardenedGitEnv(dir_, index_file);
  if (!quarantine_.empty()) {
    env.push_back("GIT_OBJECT_DIRECTORY=" + quarantine_);
    env.push_back("GIT_ALTERNATE_OBJECT_DIRECTORIES=" + objects_);
  }
  o.env = std::move(env);
  // A daemon killed mid-commit takes its git with it: none may go on writing objects into a
  // quarantine the next daemon removes (git recreates missing object directories).
  o.die_with_parent = true;
  o.cwd = dir_;
  o.stdin_fd = in_r.get();
  o.stdout_fd = out_w.get();
  o.stderr_fd = err_w.get();
  ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Spawn(o));
  in_r.Reset();
  out_w.Reset();
  err_w.Reset();
  std::string out, err;
  std::thread writer([&] {
    (void)WriteFull(in_w.get(), input);
    in_w.Reset();
  });
  std::thread errs([&] { Drain(err_r.get(), &err); });
  Drain(out_r.get(), &out);
  errs.join();
  writer.join();
  ASSIGN_OR_RETURN(ExitInfo e, child.Wait());
  if (!e.exited || e.code != 0) {
    std::string tail = err.size() > kErrTail ? err.substr(err.size() - kErrTail) : err;
    // git quotes the paths it complains about as they are: bytes from a guest.
    return Internal("git " + (args.empty() ? std::string() : args[0]) + " " + e.Describe() + ": " +
                    JsonSafe(Trim(tail)));
  }
  if (err_out) *err_out = std::move(err);
  return out;
}

Result<std::vector<std::string>> GitRepo::ListFiles() const {
  ASSIGN_OR_RETURN(std::string out,
                   Run({"ls-files", "-z", "--cached", "--others", "--exclude-standard"}));
  std::vector<std::string> files;
  std::set<std::string> seen;
  for (auto& p : SplitZ(out)) {
    if (seen.insert(p).second) files.push_back(std::move(p));
  }
  return files;
}

Result<std::map<std::string, std::string>> GitRepo::StagedBlobs() const {
  ASSIGN_OR_RETURN(std::string out, Run({"ls-files", "-z", "--stage"}));
  std::map<std::string, std::string> blobs;
  // "MODE ID STAGE\tPATH", each record ended by NUL.
  for (const auto& rec : SplitZ(out)) {
    size_t tab = rec.find('\t');
    if (tab == std::string::npos) continue;
    std::string head = rec.substr(0, tab);
    size_t sp1 = head.find(' '), sp2 = head.rfind(' ');
    if (sp1 == std::string::npos || sp2 == sp1) continue;
    std::string mode = head.substr(0, sp1);
    if (head.substr(sp2 + 1) != "0" || mode == "160000") continue;
    blobs[rec.substr(tab + 1)] = head.substr(sp1 + 1, sp2 - sp1 - 1);
  }
  return blobs;
}

Result<std::optional<std::string>> GitRepo::ResolveCommit(const std::string& ref) const {
  auto r = Run({"rev-parse", "--verify", "-q", ref + "^{commit}"});
  if (!r.ok()) return std::optional<std::string>();
  return std::optional<std::string>(Trim(*r));
}

Result<std::optional<std::string>> GitRepo::Head() const { return ResolveCommit("HEAD"); }

Result<std::vector<std::string>> GitRepo::WriteBlobsFromFiles(
    const std::vector<std::string>& paths) const {
  if (paths.empty()) return std::vector<std::string>();
  std::string input;
  for (const auto& p : paths) input += CQuote(p) + "\n";
  ASSIGN_OR_RETURN(std::string out,
                   Run({"hash-object", "-w", "--no-filters", "--stdin-paths"}, input));
  std::vector<std::string> ids = SplitRecords(out, '\n');
  if (ids.size() != paths.size()) {
    return Internal("git hash-object returned " + std::to_string(ids.size()) + " ids for " +
                    std::to_string(paths.size()) + " files");
  }
  return ids;
}

Result<std::string> GitRepo::WriteBlob(std::string_view content) const {
  ASSIGN_OR_RETURN(std::string out, Run({"hash-object", "-w", "--no-filters", "--stdin"}, content));
  return Trim(out);
}

Result<GitObjectHash> GitRepo::ObjectHash() const {
  ASSIGN_OR_RETURN(std::string out, Run({"rev-parse", "--show-object-format"}));
  const std::string format = Trim(out);
  if (format == "sha1") return GitObjectHash::kSha1;
  if (format == "sha256") return GitObjectHash::kSha256;
  return Internal("git names objects with an unknown hash: " + JsonSafe(format));
}

Result<std::vector<bool>> GitRepo::HasBlobs(const std::vector<std::string>& ids) const {
  if (ids.empty()) return std::vector<bool>();
  std::string input;
  for (const auto& id : ids) input += id + "\n";
  // One line per id, in order: "ID blob" when it is there, "ID missing" when it is not.
  ASSIGN_OR_RETURN(std::string out,
                   Run({"cat-file", "--batch-check=%(objectname) %(objecttype)"}, input));
  std::vector<std::string> lines = SplitRecords(out, '\n');
  if (lines.size() != ids.size()) {
    return Internal("git cat-file answered " + std::to_string(lines.size()) + " lines for " +
                    std::to_string(ids.size()) + " ids");
  }
  std::vector<bool> have(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) have[i] = lines[i] == ids[i] + " blob";
  return have;
}

Result<std::string> GitRepo::BuildTree(const std::optional<std::string>& base,
                                       const std::vector<IndexEntry>& entries) const {
  ASSIGN_OR_RETURN(TempDir tmp, TempDir::Make("/tmp", "trybox-index-"));
  std::string index = tmp.path() + "/index";
  if (base) {
    RETURN_IF_ERROR(Run({"read-tree", *base}, {}, index).status());
  } else {
    RETURN_IF_ERROR(Run({"read-tree", "--empty"}, {}, index).status());
  }
  std::string input;
  for (const auto& e : entries) {
    input += e.mode + " " + (e.mode == "0" ? kZeroId : e.blob) + "\t" + e.path;
    input.push_back('\0');
  }
  if (!input.empty()) {
    std::string err;
    RETURN_IF_ERROR(Run({"update-index", "-z", "--index-info"}, input, index, &err).status());
    // update-index drops a path it refuses ("Ignoring path X") and still exits 0. Every path
    // is checked beforehand (UnstorablePath); one that got through would make the commit
    // disagree with the record, so it stops the commit instead.
    size_t at = err.find("Ignoring path ");
    if (at != std::string::npos) {
      std::string line = err.substr(at, err.find('\n', at) - at);
      return Internal("git refused a path that trybox's check let through (" + JsonSafe(line) +
                      "); nothing was committed");
    }
  }
  ASSIGN_OR_RETURN(std::string tree, Run({"write-tree"}, {}, index));
  return Trim(tree);
}

Result<std::vector<IndexEntry>> GitRepo::TreeEntries(const std::string& commit) const {
  ASSIGN_OR_RETURN(std::string out, Run({"ls-tree", "-r", "-z", "--full-tree", commit}));
  std::vector<IndexEntry> entries;
  for (const auto& line : SplitZ(out)) {
    // "<mode> SP <type> SP <object> TAB <path>"
    size_t tab = line.find('\t');
    size_t sp1 = line.find(' ');
    size_t sp2 = line.find(' ', sp1 + 1);
    if (tab == std::string::npos || sp1 == std::string::npos || sp2 == std::string::npos) {
      return Internal("unexpected ls-tree line: " + JsonSafe(line));
    }
    entries.push_back(
        {line.substr(0, sp1), line.substr(sp2 + 1, tab - sp2 - 1), line.substr(tab + 1)});
  }
  return entries;
}

Result<std::string> GitRepo::CommitTree(const std::string& tree,
                                        const std::optional<std::string>& parent,
                                        const std::string& message) const {
  std::vector<std::string> args = {"commit-tree", tree};
  if (parent) {
    args.push_back("-p");
    args.push_back(*parent);
  }
  ASSIGN_OR_RETURN(std::string id, Run(args, message));
  return Trim(id);
}

Status GitRepo::UpdateRef(const std::string& ref, const std::string& new_id,
                          const std::optional<std::string>& old_id) const {
  return Run({"update-ref", "-m", "trybox collect", ref, new_id, old_id ? *old_id : kZeroId})
      .status();
}

Result<std::string> GitRepo::ObjectsDir() const {
  ASSIGN_OR_RETURN(std::string out, Run({"rev-parse", "--git-path", "objects"}));
  std::string path = Trim(out);
  if (path.empty()) return Internal("git rev-parse --git-path objects printed nothing");
  return path[0] == '/' ? path : dir_ + "/" + path;
}

namespace {

constexpr char kQuarantinePrefix[] = "incoming-trybox-";

bool IsHex(const std::string& s, size_t n) {
  return s.size() == n && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

Result<ObjectQuarantine> ObjectQuarantine::Start(GitRepo& repo, const std::string& marker) {
  ASSIGN_OR_RETURN(std::string objects, repo.ObjectsDir());
  std::string path = objects + "/" + kQuarantinePrefix + RandomHex(8);
  if (!marker.empty()) RETURN_IF_ERROR(WriteFileAtomic(marker, path + "\n", 0600));
  if (::mkdir(path.c_str(), 0700) != 0) {
    Status st = ErrnoError("make the object quarantine " + path);
    if (!marker.empty()) ::unlink(marker.c_str());
    return st;
  }
  repo.WriteObjectsTo(path, objects);
  return ObjectQuarantine(&repo, std::move(path), std::move(objects), marker);
}

ObjectQuarantine::ObjectQuarantine(ObjectQuarantine&& o) noexcept
    : repo_(o.repo_),
      path_(std::move(o.path_)),
      objects_(std::move(o.objects_)),
      marker_(std::move(o.marker_)) {
  o.path_.clear();
  o.marker_.clear();
}

ObjectQuarantine::~ObjectQuarantine() {
  if (!path_.empty()) {
    repo_->WriteObjectsTo("", "");
    (void)RemoveTree(path_);
  }
  if (!marker_.empty()) ::unlink(marker_.c_str());
}

Status ObjectQuarantine::Finish() {
  if (path_.empty()) return FailedPrecondition("the object quarantine has ended");
  // Loose objects only: hash-object, write-tree and commit-tree write nothing else.
  ASSIGN_OR_RETURN(auto fanouts, ListDir(path_));
  for (const auto& fan : fanouts) {
    const std::string from_dir = path_ + "/" + fan;
    if (!IsHex(fan, 2)) return Internal("unexpected entry in the object quarantine: " + from_dir);
    const std::string to_dir = objects_ + "/" + fan;
    if (::mkdir(to_dir.c_str(), 0777) != 0 && errno != EEXIST) {
      return ErrnoError("make " + to_dir);
    }
    ASSIGN_OR_RETURN(auto files, ListDir(from_dir));
    for (const auto& f : files) {
      if (!IsHex(f, 38)) {
        return Internal("unexpected entry in the object quarantine: " + from_dir + "/" + f);
      }
      const std::string from = from_dir + "/" + f, to = to_dir + "/" + f;
      // As git moves an object into place: a hard link never replaces one that is there
      // (same name, same content); where links are refused, a rename.
      if (::link(from.c_str(), to.c_str()) != 0 && errno != EEXIST &&
          ::rename(from.c_str(), to.c_str()) != 0) {
        return ErrnoError("move object " + fan + f + " into " + objects_);
      }
    }
  }
  repo_->WriteObjectsTo("", "");
  Status st = RemoveTree(path_);
  path_.clear();
  if (!marker_.empty()) ::unlink(marker_.c_str());
  marker_.clear();
  return st;
}

Status RemoveAbandonedQuarantine(const std::string& marker) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(marker));
  std::string path = Trim(text);
  const size_t slash = path.rfind('/');
  const std::string base = slash == std::string::npos ? "" : path.substr(slash + 1);
  const std::string parent = slash == std::string::npos ? "" : path.substr(0, slash);
  const size_t plen = sizeof(kQuarantinePrefix) - 1;
  if (path.empty() || path[0] != '/' || base.compare(0, plen, kQuarantinePrefix) != 0 ||
      !IsHex(base.substr(std::min(plen, base.size())), 16) || parent.size() < 8 ||
      parent.compare(parent.size() - 8, 8, "/objects") != 0 ||
      path.find("/../") != std::string::npos) {
    return InvalidArgument("the quarantine marker " + marker +
                           " names no object quarantine: " + JsonSafe(path));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return InvalidArgument(path + " is not a directory");
    RETURN_IF_ERROR(RemoveTree(path));
  } else if (errno != ENOENT) {
    return ErrnoError("stat " + path);
  }
  if (::unlink(marker.c_str()) != 0 && errno != ENOENT) return ErrnoError("remove " + marker);
  return Status::Ok();
}

}  // namespace trybox::workspace
