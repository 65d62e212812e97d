#include "workspace/workspace.h"

#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <set>

#include "util/fd.h"
#include "util/utf8.h"

namespace trybox::workspace {
namespace {

constexpr const char* kEmptyTree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

Result<std::string> TreeOf(const GitRepo& repo, const std::string& commit) {
  ASSIGN_OR_RETURN(std::string t, repo.Run({"rev-parse", commit + "^{tree}"}));
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t;
}

// Writes blobs for every entry of `m` under `root` that has none yet.
Status WriteBlobs(const GitRepo& repo, const std::string& root, Manifest* m) {
  std::vector<std::string> files;
  std::vector<Entry*> file_entries;
  for (auto& [p, e] : *m) {
    if (!e.blob.empty()) continue;
    if (e.symlink) {
      ASSIGN_OR_RETURN(e.blob, repo.WriteBlob(e.target));
    } else {
      files.push_back(root + "/" + p);
      file_entries.push_back(&e);
    }
  }
  ASSIGN_OR_RETURN(auto ids, repo.WriteBlobsFromFiles(files));
  for (size_t i = 0; i < ids.size(); ++i) file_entries[i]->blob = ids[i];
  return Status::Ok();
}

// Clears the blob id of every entry whose blob the repository does not hold yet, so that
// WriteBlobs writes it: ids computed from the files (ManifestFromList) cost one lookup here
// instead of git reading and hashing every file again. A file whose id is the one the index
// records for its path (committed or added, unchanged since) needs no lookup: `git add`
// wrote that blob. An intent-to-add entry records the empty blob's id, so only an empty file
// could match it, and the empty blob is always looked up. Were the index to name an object
// the store lacks, the commit would fail naming it (`write-tree` checks), never record a
// tree with a hole.
Status ForgetAbsentBlobs(const GitRepo& repo, GitObjectHash object_hash, Manifest* m) {
  ASSIGN_OR_RETURN(auto staged, repo.StagedBlobs());
  const std::string empty = GitBlobId("", object_hash);
  std::vector<Entry*> known;
  std::vector<std::string> ids;
  for (auto& [p, e] : *m) {
    if (e.blob.empty()) continue;
    if (auto s = staged.find(p); s != staged.end() && s->second == e.blob && e.blob != empty) {
      continue;
    }
    known.push_back(&e);
    ids.push_back(e.blob);
  }
  ASSIGN_OR_RETURN(std::vector<bool> have, repo.HasBlobs(ids));
  for (size_t i = 0; i < known.size(); ++i) {
    if (!have[i]) known[i]->blob.clear();
  }
  return Status::Ok();
}

}  // namespace

std::string FormatBytes(uint64_t n) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(n));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

Result<uint64_t> ParseSize(const std::string& text) {
  if (text.empty()) return InvalidArgument("a size is empty");
  size_t pos = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &pos);
  } catch (const std::exception&) {
    return InvalidArgument("not a size: " + text + " (use bytes or K, M, G)");
  }
  std::string unit = text.substr(pos);
  uint64_t mult = 1;
  if (unit == "K" || unit == "KiB" || unit == "k")
    mult = 1ull << 10;
  else if (unit == "M" || unit == "MiB")
    mult = 1ull << 20;
  else if (unit == "G" || unit == "GiB")
    mult = 1ull << 30;
  else if (!unit.empty())
    return InvalidArgument("not a size: " + text + " (use bytes or K, M, G)");
  if (n == 0) return InvalidArgument("a size must be positive: " + text);
  return static_cast<uint64_t>(n) * mult;
}

Result<ExcludeList> ExcludesFromLines(const std::vector<std::string>& lines) {
  std::string joined;
  for (const auto& l : lines) joined += l + "\n";
  return ExcludeList::WithProjectFile(joined);
}

uint64_t CountEntries(const Manifest& m) {
  std::set<std::string_view> dirs;
  for (const auto& [p, e] : m) {
    std::string_view v(p);
    for (size_t slash = v.rfind('/'); slash != std::string_view::npos; slash = v.rfind('/')) {
      v = v.substr(0, slash);
      if (!dirs.insert(v).second) break;  // its parents are in already
    }
  }
  return m.size() + dirs.size();
}

Result<InjectPlan> PlanInject(const std::string& dir, uint64_t quota_bytes) {
  return PlanInject(dir, Quota{quota_bytes, kDefaultQuotaEntries});
}

Result<InjectPlan> PlanInject(const std::string& dir, const Quota& quota,
                              const std::function<Status(const InjectPlan&)>& alongside) {
  const uint64_t quota_bytes = quota.bytes;
  ASSIGN_OR_RETURN(GitRepo repo, GitRepo::Open(dir));
  InjectPlan plan;
  plan.dir = repo.dir();
  ASSIGN_OR_RETURN(plan.base, repo.Head());
  std::string exclude_file = plan.dir + "/.trybox/exclude";
  struct stat st;
  if (::lstat(exclude_file.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      return InvalidArgument(exclude_file + " must be a regular file");
    }
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(exclude_file));
    ASSIGN_OR_RETURN(plan.excludes, ExcludeList::WithProjectFile(text));
  }
  ASSIGN_OR_RETURN(auto files, repo.ListFiles());
  ASSIGN_OR_RETURN(GitObjectHash object_hash, repo.ObjectHash());
  // The quota needs only sizes: it is checked once the files are listed, before anything
  // runs alongside the hashing and while the hashing has barely begun (an over-quota tree
  // stops it).
  auto listed = [&](const Manifest& m) -> Status {
    uint64_t total = TotalBytes(m);
    if (quota_bytes && total > quota_bytes) {
      return ResourceExhausted("workspace " + plan.dir + " holds " + FormatBytes(total) +
                               ", over the workspace quota of " + FormatBytes(quota_bytes) + " (" +
                               std::to_string(quota_bytes) + " bytes)");
    }
    uint64_t entries = CountEntries(m);
    if (quota.entries && entries > quota.entries) {
      return ResourceExhausted("workspace " + plan.dir + " holds " + std::to_string(entries) +
                               " entries (files, directories and symbolic links), over the "
                               "workspace quota of " +
                               std::to_string(quota.entries) + " entries");
    }
    if (!alongside) return Status::Ok();
    InjectPlan so_far;
    so_far.dir = plan.dir;
    so_far.base = plan.base;
    so_far.excludes = plan.excludes;
    so_far.manifest = m;
    return alongside(so_far);
  };
  ASSIGN_OR_RETURN(plan.manifest, ManifestFromList(plan.dir, files, plan.excludes, &plan.skipped,
                                                   object_hash, listed));
  // Most files of a workspace are committed already: their blobs are looked up, not written.
  RETURN_IF_ERROR(ForgetAbsentBlobs(repo, object_hash, &plan.manifest));
  RETURN_IF_ERROR(WriteBlobs(repo, plan.dir, &plan.manifest));
  return plan;
}

Result<CommitOutcome> CommitCollected(const CommitInput& in) {
  CommitOutcome out;
  if (Diff(in.before, in.after).empty()) {
    out.note = "no files changed; no commit made";
    return out;
  }
  ASSIGN_OR_RETURN(GitRepo repo, GitRepo::Open(in.dir));
  ASSIGN_OR_RETURN(ObjectQuarantine quarantine,
                   ObjectQuarantine::Start(repo, in.quarantine_marker));
  // Tree A: the base commit as the working tree was injected. Tracked paths that were not
  // sent are dropped unless excluded (excluded paths never left, so they stay as they are)
  // or submodules (never sent).
  std::vector<IndexEntry> entries;
  if (in.base) {
    ASSIGN_OR_RETURN(auto base_entries, repo.TreeEntries(*in.base));
    for (const auto& b : base_entries) {
      if (b.mode == "160000" || in.before.count(b.path) || in.excludes.Excluded(b.path, false)) {
        continue;
      }
      entries.push_back({"0", "", b.path});
    }
  }
  for (const auto& [p, e] : in.before) entries.push_back({e.GitMode(), e.blob, p});
  ASSIGN_OR_RETURN(std::string tree_a, repo.BuildTree(in.base, entries));

  // Tree B: tree A with what came back.
  Manifest after = in.after;
  for (auto& [p, e] : after) {
    auto it = in.before.find(p);
    if (it != in.before.end() && it->second.symlink == e.symlink && it->second.sha256 == e.sha256) {
      e.blob = it->second.blob;
    }
  }
  RETURN_IF_ERROR(WriteBlobs(repo, in.staging, &after));
  for (const auto& [p, e] : in.before) {
    if (!after.count(p)) entries.push_back({"0", "", p});
  }
  for (const auto& [p, e] : after) entries.push_back({e.GitMode(), e.blob, p});
  ASSIGN_OR_RETURN(std::string tree_b, repo.BuildTree(in.base, entries));

  std::string ref = "refs/heads/" + in.branch;
  ASSIGN_OR_RETURN(auto tip, repo.ResolveCommit(ref));
  std::optional<std::string> parent;
  if (tip) {
    ASSIGN_OR_RETURN(std::string tip_tree, TreeOf(repo, *tip));
    if (tip_tree == tree_b) {
      out.note = "nothing changed since the last commit on " + in.branch + "; no commit made";
      out.commit = *tip;
      return out;
    }
    parent = tip;
  } else {
    if (tree_a == tree_b) {
      out.note =
          "the changes are not recorded by git (permission bits other than the "
          "executable bit); no commit made";
      return out;
    }
    parent = in.base;
    std::string base_tree = kEmptyTree;
    if (in.base) {
      ASSIGN_OR_RETURN(base_tree, TreeOf(repo, *in.base));
    }
    if (tree_a != base_tree) {
      ASSIGN_OR_RETURN(out.injected_commit,
                       repo.CommitTree(tree_a, in.base,
                                       "trybox: the working tree as copied into the VM\n\n"
                                       "Uncommitted changes of the working tree at the time the "
                                       "workspace was injected, so that the next commit holds "
                                       "only the VM's work.\n"));
      parent = out.injected_commit;
    }
  }
  // The message is built by the daemon; whatever reached it, no host directory leaves.
  std::string message = in.message;
  std::vector<std::string> hide = in.private_paths;
  hide.push_back(in.staging);
  for (const auto& p : hide) {
    if (p.empty()) continue;
    for (size_t at = message.find(p); at != std::string::npos; at = message.find(p, at)) {
      message.replace(at, p.size(), "<host directory>");
    }
  }
  ASSIGN_OR_RETURN(out.commit, repo.CommitTree(tree_b, parent, message));
  RETURN_IF_ERROR(quarantine.Finish());
  RETURN_IF_ERROR(repo.UpdateRef(ref, out.commit, tip));
  out.committed = true;
  return out;
}

std::string CollectCommitMessage(const CollectSummary& s) {
  std::map<Change::Kind, size_t> n;
  for (const auto& c : s.changes) ++n[c.kind];
  auto count = [&](Change::Kind k, const char* what) { return std::to_string(n[k]) + " " + what; };
  std::string m =
      "trybox: work of VM " + OneLine(s.vm_id) + "\n\nVM: " + OneLine(s.vm_id) +
      "\nImage: " + OneLine(s.image) + " (manifest sha256 " + OneLine(s.image_sha256) +
      ")\nCommand: " + OneLine(s.command) + "\nFiles changed: " + std::to_string(s.changes.size()) +
      " (" + count(Change::Kind::kAdded, "added") + ", " +
      count(Change::Kind::kModified, "modified") + ", " + count(Change::Kind::kDeleted, "deleted") +
      ", " + count(Change::Kind::kRenamed, "renamed") + ", " +
      count(Change::Kind::kModeChanged, "mode changes") + ")\n";
  uint64_t skipped = s.skipped.size() + s.skipped_unlisted;
  if (skipped == 0) return m;
  m += "Skipped (not collected): " + std::to_string(skipped) + "\n";
  size_t listed = std::min(s.skipped.size(), kCommitListedSkipped);
  for (size_t i = 0; i < listed; ++i) {
    m += "  " + OneLine(s.skipped[i].path) + ": " + OneLine(s.skipped[i].reason) + "\n";
  }
  if (skipped > listed) {
    m += "  and " + std::to_string(skipped - listed) + " more (trybox diff " + OneLine(s.vm_id) +
         " lists them)\n";
  }
  return m;
}

std::vector<Skipped> SkippedFromTarWarnings(const std::string& warnings) {
  std::vector<Skipped> out;
  for (const std::string& line : SplitRecords(warnings, '\n')) {
    // "tar: ./s: socket ignored" or "/bin/tar: ./s: socket ignored".
    const std::string suffix = ": socket ignored";
    size_t colon = line.find(": ");
    if (colon == std::string::npos || colon < 3 || line.compare(colon - 3, 3, "tar") != 0 ||
        line.size() <= colon + 2 + suffix.size() ||
        line.compare(line.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    std::string path = line.substr(colon + 2, line.size() - suffix.size() - colon - 2);
    if (path.rfind("./", 0) == 0) path.erase(0, 2);
    out.push_back({path, "a socket (left out by the guest's tar)"});
  }
  return out;
}

}  // namespace trybox::workspace
