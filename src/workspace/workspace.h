// A project workspace: what the daemon sends into a VM, and how what comes back becomes a
// commit. The daemon's verbs (workspace_in, collect, diff) are thin wrappers around this.
// Design and decisions: docs/workspace.md. Plain functions; no shared state.
#pragma once

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

// Everything decided on the host before a byte goes into the VM.
struct InjectPlan {
  std::string dir;                  // the working tree's top level (absolute, resolved)
  std::optional<std::string> base;  // HEAD at inject time
  ExcludeList excludes;
  Manifest manifest;  // with blob ids: the blobs are already in the repository
  std::vector<Skipped> skipped;
};

// Lists the files (hardened git), applies the exclude list, checks `quota_bytes` (an
// over-quota workspace is kResourceExhausted naming the quota and the size) and writes the
// blobs of what will be sent, so that the commit can later record exactly what went in.
Result<InjectPlan> PlanInject(const std::string& dir, uint64_t quota_bytes);

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
  std::string message;
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
Result<CommitOutcome> CommitCollected(const CommitInput& in);

// The lines of GNU tar's warnings that say an entry was left out ("tar: ./s: socket
// ignored"), as skipped entries.
std::vector<Skipped> SkippedFromTarWarnings(const std::string& warnings);

// "1073741824", "512M", "1G", "64K" -> bytes. Zero and garbage are errors.
Result<uint64_t> ParseSize(const std::string& text);
std::string FormatBytes(uint64_t n);

}  // namespace trybox::workspace
