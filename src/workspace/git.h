// Hardened git on a user's repository.
//
// Every call runs git with an environment built from nothing (PATH and LC_ALL only, plus
// the settings below) and with command-line configuration that outranks anything in the
// repository's config files or their includes:
//   env  GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_SYSTEM=/dev/null GIT_CONFIG_NOSYSTEM=1
//        GIT_TERMINAL_PROMPT=0 GIT_ASKPASS/SSH_ASKPASS=/bin/false GIT_OPTIONAL_LOCKS=0
//        GIT_NO_REPLACE_OBJECTS=1 GIT_ALLOW_PROTOCOL= GIT_PAGER=cat GIT_EDITOR=false
//        GIT_DIR=<dir>/.git GIT_WORK_TREE=<dir> (so core.worktree cannot redirect us)
//   -c   core.hooksPath=/dev/null core.fsmonitor=false core.pager=cat core.editor=false
//        sequence.editor=false core.sshCommand=false core.askPass= credential.helper=
//        protocol.allow=never core.attributesFile=/dev/null core.untrackedCache=false
//        core.splitIndex=false gc.auto=0 maintenance.auto=false
//        core.protectNTFS=true core.protectHFS=true (so git refuses exactly the paths
//        git_path.h predicts, whatever the repository or the platform default says)
// Only plumbing builtins are run (aliases can never shadow a builtin), never diff, log,
// status or checkout. Blobs are written with `hash-object --no-filters`, so no clean/smudge
// or process filter runs; commits are made with `commit-tree`, which runs no hooks, into a
// temporary index (GIT_INDEX_FILE), so the user's index, HEAD and working tree are never
// written. Docs: docs/workspace.md.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/sha256.h"
#include "util/status.h"

namespace trybox::workspace {

// One line of `update-index --index-info`: mode "0" removes the path.
struct IndexEntry {
  std::string mode;
  std::string blob;
  std::string path;
};

class GitRepo {
 public:
  // `dir` must be the top level of a git working tree (it holds `.git`).
  static Result<GitRepo> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }

  // Runs `git ARGS` hardened, with `input` on stdin. `index_file` (if not empty) becomes
  // GIT_INDEX_FILE. Returns stdout; a non-zero exit is an error quoting stderr's tail (made
  // JSON-safe). On success, stderr goes to `*err` if given.
  Result<std::string> Run(const std::vector<std::string>& args, std::string_view input = {},
                          const std::string& index_file = "", std::string* err = nullptr) const;

  // Tracked and untracked-but-not-ignored paths (`ls-files --cached --others
  // --exclude-standard`), relative, deduplicated.
  Result<std::vector<std::string>> ListFiles() const;
  // The object id the index records for each path at stage 0 (`ls-files --stage`): the
  // blob `git add` wrote for a file or symlink, so one the repository holds (unless the
  // entry is intent-to-add: then the id is the empty blob's, which it may not hold).
  // Submodules (mode 160000) and conflicted paths are left out.
  Result<std::map<std::string, std::string>> StagedBlobs() const;
  // HEAD's commit, or nullopt on an unborn branch.
  Result<std::optional<std::string>> Head() const;
  // `REF^{commit}` if it exists.
  Result<std::optional<std::string>> ResolveCommit(const std::string& ref) const;
  // Writes each file (absolute paths, regular files) as a blob, no filters. Same order.
  Result<std::vector<std::string>> WriteBlobsFromFiles(const std::vector<std::string>& paths) const;
  Result<std::string> WriteBlob(std::string_view content) const;
  // The hash the repository names objects with (`rev-parse --show-object-format`).
  Result<GitObjectHash> ObjectHash() const;
  // For each id, whether the repository holds a blob of that id (`cat-file --batch-check`).
  Result<std::vector<bool>> HasBlobs(const std::vector<std::string>& ids) const;

  // Builds a tree in a fresh temporary index: `base` (a commit, or none for the empty tree),
  // then `entries` applied. Returns the tree id. A path git refuses is an error, never a
  // silent drop.
  Result<std::string> BuildTree(const std::optional<std::string>& base,
                                const std::vector<IndexEntry>& entries) const;
  // The mode+path of every entry of `commit`'s tree, recursively ("160000" for submodules).
  Result<std::vector<IndexEntry>> TreeEntries(const std::string& commit) const;
  // commit-tree with an author/committer of "trybox"; returns the commit id.
  Result<std::string> CommitTree(const std::string& tree, const std::optional<std::string>& parent,
                                 const std::string& message) const;
  // update-ref REF NEW OLD, where OLD nullopt means "must not exist yet".
  Status UpdateRef(const std::string& ref, const std::string& new_id,
                   const std::optional<std::string>& old_id) const;

  // The repository's object store, absolute (`git rev-parse --git-path objects`).
  Result<std::string> ObjectsDir() const;
  // While `quarantine` is not empty, objects are written there (GIT_OBJECT_DIRECTORY) and
  // read from there and from `objects` (GIT_ALTERNATE_OBJECT_DIRECTORIES).
  void WriteObjectsTo(const std::string& quarantine, const std::string& objects) {
    quarantine_ = quarantine;
    objects_ = objects;
  }

 private:
  explicit GitRepo(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  std::string quarantine_;
  std::string objects_;
};

// The objects of one commit, kept apart until the commit is whole (git's receive-pack does
// the same): a directory `objects/incoming-trybox-<hex>` inside the repository's object
// store, where the repository's git writes while the quarantine lasts and which no other
// git process reads. Finish moves the objects into the store; a quarantine that is not
// finished is removed with it, so a failed commit leaves no dangling object. Before the
// directory exists its path is written to `marker` (when given), so that a process killed
// in between leaves something RemoveAbandonedQuarantine can find.
class ObjectQuarantine {
 public:
  static Result<ObjectQuarantine> Start(GitRepo& repo, const std::string& marker);
  ObjectQuarantine(ObjectQuarantine&& o) noexcept;
  ObjectQuarantine& operator=(ObjectQuarantine&&) = delete;
  ObjectQuarantine(const ObjectQuarantine&) = delete;
  ~ObjectQuarantine();
  const std::string& path() const { return path_; }
  // Moves every object into the store (an object already there is kept) and ends the
  // quarantine: the repository writes to the store again, as it does when a quarantine that
  // was not finished is dropped. Refs may name the objects only after this.
  Status Finish();

 private:
  ObjectQuarantine(GitRepo* repo, std::string path, std::string objects, std::string marker)
      : repo_(repo),
        path_(std::move(path)),
        objects_(std::move(objects)),
        marker_(std::move(marker)) {}
  GitRepo* repo_;     // writes here until the quarantine ends; must outlive it
  std::string path_;  // empty once finished or moved from
  std::string objects_;
  std::string marker_;
};

// Removes the quarantine a marker names (only a directory named incoming-trybox-<hex> in a
// directory named objects), then the marker. A marker naming anything else is an error and
// is left as it is.
Status RemoveAbandonedQuarantine(const std::string& marker);
// The name a daemon gives such a marker ends so.
inline constexpr std::string_view kQuarantineMarkerSuffix = ".quarantine";
inline bool IsQuarantineMarker(std::string_view name) {
  return name.size() > kQuarantineMarkerSuffix.size() &&
         name.substr(name.size() - kQuarantineMarkerSuffix.size()) == kQuarantineMarkerSuffix;
}

// "a\nb\n" -> {"a", "b"}: records ended (or separated) by `sep`, as git prints them.
std::vector<std::string> SplitRecords(const std::string& s, char sep);

// The hardened environment and leading arguments (for tests and docs).
std::vector<std::string> HardenedGitEnv(const std::string& dir, const std::string& index_file);
std::vector<std::string> HardenedGitArgs();

}  // namespace trybox::workspace
