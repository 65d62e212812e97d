// A project workspace: what the daemon sends into a VM, and how what comes back becomes a
// commit. The daemon's verbs (workspace_in, collect, diff) are thin wrappers around this.
// Design and decisions: docs/workspace.md. Plain functions; no shared state.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "workspace/exclude.h"
#include "workspace/git.h"
#include "workspace/manifest.h"

namespace trybox::workspace {

inline constexpr const char* kGuestPath = "/workspace";
inline constexpr const char* kSetupScript = ".trybox/setup.sh";
inline constexpr uint64_t kDefaultQuotaBytes = 1ull << 30;
inline constexpr uint64_t kDefaultQuotaEntries = 100000;

// The workspace quota, enforced where bytes cross the boundary, both ways.
struct Quota {
  uint64_t bytes = kDefaultQuotaBytes;      // content bytes of the files
  uint64_t entries = kDefaultQuotaEntries;  // files, directories and symlinks
};

// Everything decided on the host before a byte goes into the VM.
struct InjectPlan {
  std::string dir;                  // the working tree's top level (absolute, resolved)
  std::optional<std::string> base;  // HEAD at inject time
  ExcludeList excludes;
  Manifest manifest;  // with blob ids: the blobs are already in the repository
  std::vector<Skipped> skipped;
};

// Lists the files (hardened git), applies the exclude list, checks the quota (an over-quota
// workspace is kResourceExhausted naming the quota and the size or the count) and writes the
// blobs of what will be sent, so that the commit can later record exactly what went in.
//
// With `alongside`: once the files are listed and within the quota, it is called on a
// thread of its own with the plan so far (entries without digests or blob ids) while the
// files are hashed, e.g. to write them into the VM's workspace disk at the same time. Its
// error fails the plan.
Result<InjectPlan> PlanInject(const std::string& dir, const Quota& quota,
                              const std::function<Status(const InjectPlan&)>& alongside = nullptr);
// The default entry quota.
Result<InjectPlan> PlanInject(const std::string& dir, uint64_t quota_bytes);

// Files, symlinks and the directories that hold them: what the entry quota counts.
uint64_t CountEntries(const Manifest& m);

// The exclude list stored with a workspace record ("project lines" joined by '\n').
Result<ExcludeList> ExcludesFromLines(const std::vector<std::string>& lines);

struct CommitInput {
  std::string dir;
  std::optional<std::string> base;
  ExcludeList excludes;
  Manifest before;      // as injected, with blob ids
  Manifest after;       // as collected
  std::string staging;  // where `after` was unpacked
  std::string branch;   // "trybox/<vm-id>"
  std::string message;  // CollectCommitMessage
  // Host paths the message must not show (the daemon's state directory); `staging` always
  // counts. Each occurrence becomes "<host directory>".
  std::vector<std::string> private_paths;
  // Where to note the object quarantine's path while the commit is built (ObjectQuarantine),
  // so that a daemon killed meanwhile leaves something the next one removes; "" for none.
  std::string quarantine_marker;
};

struct CommitOutcome {
  bool committed = false;
  std::string commit;           // the branch's new tip
  std::string injected_commit;  // the "as injected" commit, when the working tree was dirty
  std::string note;             // why there is no commit
};

// Records `after` as a commit on refs/heads/<branch> without touching HEAD, the index or
// the working tree. When the working tree differed from HEAD at inject time, a first commit
// records the tree as injected, so the branch's last commit holds only the VM's work. A
// second collect builds on the branch's tip. No change: no commit, and the note says so.
// The commit's objects enter the repository only with the commit: until the branch can be
// moved they are kept in an ObjectQuarantine, so a commit that fails leaves none behind.
Result<CommitOutcome> CommitCollected(const CommitInput& in);

// What a collect's commit message says: where the work comes from and what changed.
struct CollectSummary {
  std::string vm_id;
  std::string image;
  std::string image_sha256;  // of the image's manifest
  std::string command;       // the command that did the work, as the caller gave it
  std::vector<Change> changes;
  std::vector<Skipped> skipped;
  uint64_t skipped_unlisted = 0;
};

// The message, every guest-made name and the command shown on one line each (OneLine), at
// most kCommitListedSkipped skipped entries listed.
inline constexpr size_t kCommitListedSkipped = 20;
std::string CollectCommitMessage(const CollectSummary& s);

// The lines of GNU tar's warnings that say an entry was left out ("tar: ./s: socket
// ignored"), as skipped entries.
std::vector<Skipped> SkippedFromTarWarnings(const std::string& warnings);

// "1073741824", "512M", "1G", "64K" -> bytes. Zero and garbage are errors.
Result<uint64_t> ParseSize(const std::string& text);
std::string FormatBytes(uint64_t n);

}  // namespace trybox::workspace
