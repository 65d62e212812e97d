// Real git on real repositories: the commit flow and the hardening against a hostile
// repository configuration. No VM: the "guest" here is a tar round trip into a staging dir.
#include "workspace/workspace.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>

#include "util/fd.h"
#include "util/process.h"
#include "util/sha256.h"
#include "util/utf8.h"
#include "workspace/tar.h"
#include "workspace/testing.h"

namespace trybox::workspace {
namespace {

using testing::AttacksThatRan;
using testing::TreeFingerprint;

std::string Sh(const std::string& home, const std::string& script) {
  auto r = testing::Sh(home, script);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : "";
}

class WorkspaceGitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = TempDir::Make("/tmp", "ws-git-test-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
    home_ = tmp_->path() + "/home";
    repo_ = tmp_->path() + "/repo";
    marks_ = tmp_->path() + "/marks";
    staging_ = tmp_->path() + "/staging";
    ASSERT_TRUE(MakeDirs(home_).ok());
    ASSERT_TRUE(MakeDirs(marks_).ok());
    Sh(home_, "git init -q -b main '" + repo_ + "' && cd '" + repo_ +
                  "' && mkdir -p src/build node_modules/pkg && echo one > src/a.txt && "
                  "echo two > src/b.txt && echo gone > src/c.txt && echo keep > "
                  "src/build/out.o && echo dep > node_modules/pkg/i.js && printf "
                  "'#!/bin/sh\\necho hi\\n' > run.sh && chmod +x run.sh && git add -A && "
                  "git commit -qm init");
  }

  // Injects, plays the VM by unpacking the same tar into `staging_`, applies `work` there,
  // then collects and commits as the daemon does.
  Result<CommitOutcome> RoundTrip(const std::string& work, Manifest* after_out = nullptr,
                                  std::vector<Change>* changes = nullptr,
                                  std::vector<Skipped>* skipped = nullptr,
                                  const std::string& message = "trybox: test\n\nVM: vm1\n") {
    ASSIGN_OR_RETURN(InjectPlan plan, PlanInject(repo_, kDefaultQuotaBytes));
    std::string tar;
    RETURN_IF_ERROR(WriteTar(plan.dir, plan.manifest, [&](std::string_view d) {
      tar.append(d);
      return Status::Ok();
    }));
    (void)RemoveTree(staging_);
    ExtractReport r;
    bool done = false;
    RETURN_IF_ERROR(ExtractTar(
        [&]() -> Result<std::string> {
          if (done) return std::string();
          done = true;
          return tar;
        },
        staging_, {}, &r));
    if (!work.empty()) Sh(home_, "cd '" + staging_ + "' && " + work);
    // The guest's tree comes back through a tar, as in a collect.
    std::string back;
    RETURN_IF_ERROR(WriteTarOfTree(staging_, &back));
    std::string collected = staging_ + "-collected";
    (void)RemoveTree(collected);
    ExtractReport report;
    // As the daemon collects without --into: files that came back unchanged stay unwritten.
    ExtractOptions xo =
        ExtractOptions::ForCollect(&plan.excludes, kDefaultQuotaBytes, kDefaultQuotaEntries);
    xo.unchanged_from = &plan.manifest;
    RETURN_IF_ERROR(ExtractTar(Once(back), collected, xo, &report));
    if (skipped) *skipped = report.skipped;
    ASSIGN_OR_RETURN(Manifest after, ManifestFromTree(collected, plan.excludes, skipped));
    after.merge(report.unwritten);
    if (changes) *changes = Diff(plan.manifest, after);
    if (after_out) *after_out = after;
    CommitInput in{plan.dir, plan.base, plan.excludes, plan.manifest,
                   after,    collected, "trybox/vm1",  message};
    return CommitCollected(in);
  }

  // The guest's side of a collect: GNU tar of the whole tree, as trybox-init runs it.
  Status WriteTarOfTree(const std::string& dir, std::string* out) {
    std::string file = tmp_->path() + "/guest.tar";
    RETURN_IF_ERROR(RunChecked({"tar", "-c", "-f", file, "-C", dir, "."}));
    ASSIGN_OR_RETURN(*out, ReadFileToString(file));
    return Status::Ok();
  }
  static std::function<Result<std::string>()> Once(std::string data) {
    auto d = std::make_shared<std::string>(std::move(data));
    return [d]() -> Result<std::string> { return std::exchange(*d, std::string()); };
  }
  // Paths in the tree of `rev` (NUL-separated listing, so any byte is exact).
  std::set<std::string> TreePaths(const std::string& rev) {
    auto repo = GitRepo::Open(repo_);
    EXPECT_TRUE(repo.ok());
    auto out = repo->Run({"ls-tree", "-r", "-z", "--name-only", rev});
    EXPECT_TRUE(out.ok());
    auto v = SplitRecords(out.value_or(""), '\0');
    return std::set<std::string>(v.begin(), v.end());
  }

  std::optional<TempDir> tmp_;
  std::string home_, repo_, marks_, staging_;
};

TEST_F(WorkspaceGitTest, InjectListsTrackedAndUntrackedButNotIgnoredOrExcluded) {
  Sh(home_, "cd '" + repo_ +
                "' && echo new > untracked.txt && echo '*.log' > .gitignore && "
                "echo x > ignored.log && mkdir -p deep/a/target && echo t > "
                "deep/a/target/t && mkdir -p .trybox && echo 'secret*' > "
                ".trybox/exclude && echo s > secrets.env");
  auto plan = PlanInject(repo_, kDefaultQuotaBytes);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<std::string> paths;
  for (const auto& [p, e] : plan->manifest) paths.push_back(p);
  EXPECT_EQ(paths, (std::vector<std::string>{".gitignore", ".trybox/exclude", "run.sh", "src/a.txt",
                                             "src/b.txt", "src/c.txt", "untracked.txt"}));
  EXPECT_EQ(plan->manifest.at("run.sh").GitMode(), std::string("100755"));
  for (const auto& [p, e] : plan->manifest) EXPECT_EQ(e.blob.size(), 40u) << p;
}

// The plan's blob ids are computed from the same read as each file's SHA-256: a committed
// file's blob is looked up, never written again; a changed, new or symlinked entry is
// written; either way each id is what git itself gives that content, and the repository
// holds it afterwards.
TEST_F(WorkspaceGitTest, ThePlansBlobIdsAreGitsAndTheRepositoryHoldsEachOne) {
  Sh(home_, "cd '" + repo_ +
                "' && echo changed >> src/b.txt && echo fresh > src/new.txt && "
                "ln -s a.txt src/link");
  const std::string objects = repo_ + "/.git/objects";
  auto plan = PlanInject(repo_, kDefaultQuotaBytes);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (const char* p : {"src/a.txt", "src/b.txt", "src/new.txt", "run.sh"}) {
    ASSERT_TRUE(plan->manifest.count(p)) << p;
    EXPECT_EQ(plan->manifest[p].blob + "\n",
              Sh(home_, "cd '" + repo_ + "' && git hash-object --no-filters " + p))
        << p;
    EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git cat-file -t " + plan->manifest[p].blob),
              "blob\n")
        << p;
  }
  const Entry& link = plan->manifest["src/link"];
  EXPECT_EQ(link.blob + "\n", Sh(home_, "printf a.txt | git hash-object --stdin"));
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git cat-file -p " + link.blob), "a.txt");
  // The committed file's loose object was not written again (git would refresh its mtime).
  const std::string a = plan->manifest["src/a.txt"].blob;
  struct stat before;
  ASSERT_EQ(::utimensat(AT_FDCWD, (objects + "/" + a.substr(0, 2) + "/" + a.substr(2)).c_str(),
                        std::array<timespec, 2>{timespec{1, 0}, timespec{1, 0}}.data(), 0),
            0);
  ASSERT_TRUE(PlanInject(repo_, kDefaultQuotaBytes).ok());
  ASSERT_EQ(::stat((objects + "/" + a.substr(0, 2) + "/" + a.substr(2)).c_str(), &before), 0);
  EXPECT_EQ(before.st_mtim.tv_sec, 1);
}

// The index's ids spare the lookup of committed files. An intent-to-add entry records the
// empty blob's id whatever the file holds: its content is looked up, found missing and
// written, and the commit holds both files.
TEST_F(WorkspaceGitTest, IntentToAddFilesGetTheirBlobsWritten) {
  Sh(home_, "cd '" + repo_ +
                "' && : > src/empty && echo 'not yet added' > src/ita && "
                "git add -N src/empty src/ita");
  const std::string empty = GitBlobId("", GitObjectHash::kSha1);
  ASSERT_NE(Sh(home_, "cd '" + repo_ + "' && git ls-files -s src/ita").find(empty),
            std::string::npos);
  auto plan = PlanInject(repo_, kDefaultQuotaBytes);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->manifest.at("src/empty").blob, empty);
  const std::string ita = plan->manifest.at("src/ita").blob;
  EXPECT_EQ(ita, GitBlobId("not yet added\n", GitObjectHash::kSha1));
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git cat-file -t " + ita), "blob\n");
  auto c = RoundTrip("echo more >> src/a.txt");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->committed) << c->note;
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git rev-parse trybox/vm1:src/empty"), empty + "\n");
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git rev-parse trybox/vm1:src/ita"), ita + "\n");
}

TEST_F(WorkspaceGitTest, ARepositoryOfSha256ObjectsGetsSha256BlobIds) {
  const std::string repo = tmp_->path() + "/repo256";
  Sh(home_, "git init -q --object-format=sha256 -b main '" + repo + "' && cd '" + repo +
                "' && echo one > a.txt && git add -A && git commit -qm init && echo two > b.txt");
  auto plan = PlanInject(repo, kDefaultQuotaBytes);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (const char* p : {"a.txt", "b.txt"}) {
    EXPECT_EQ(plan->manifest[p].blob.size(), 64u) << p;
    EXPECT_EQ(Sh(home_, "cd '" + repo + "' && git cat-file -t " + plan->manifest[p].blob), "blob\n")
        << p;
  }
}

TEST_F(WorkspaceGitTest, QuotaIsCheckedBeforeAnythingIsSent) {
  auto plan = PlanInject(repo_, 10);
  ASSERT_EQ(plan.status().code(), Code::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("quota of 10 bytes"), std::string::npos)
      << plan.status().message();
}

// What runs alongside the hashing (the daemon writes the workspace disk) gets the listed
// entries, sizes and symlink targets known, and only once the quota holds; its failure is
// the plan's.
TEST_F(WorkspaceGitTest, AlongsideTheHashingRunsOnlyWithinTheQuotaAndItsErrorFailsThePlan) {
  Sh(home_, "cd '" + repo_ + "' && ln -s a.txt src/link");
  int calls = 0;
  auto over = PlanInject(repo_, Quota{10, kDefaultQuotaEntries}, [&](const InjectPlan&) {
    ++calls;
    return Status::Ok();
  });
  EXPECT_EQ(over.status().code(), Code::kResourceExhausted) << over.status().ToString();
  EXPECT_EQ(calls, 0);

  Manifest seen;
  auto plan = PlanInject(repo_, Quota{}, [&](const InjectPlan& listed) {
    ++calls;
    seen = listed.manifest;
    return Status::Ok();
  });
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(seen.size(), plan->manifest.size());
  for (const auto& [p, e] : plan->manifest) {
    ASSERT_TRUE(seen.count(p)) << p;
    EXPECT_EQ(seen[p].size, e.size) << p;
    EXPECT_EQ(seen[p].mode, e.mode) << p;
    EXPECT_EQ(seen[p].symlink, e.symlink) << p;
    EXPECT_EQ(seen[p].target, e.target) << p;
  }
  EXPECT_EQ(seen.at("src/link").target, "a.txt");

  auto failed = PlanInject(repo_, Quota{}, [&](const InjectPlan&) {
    return Status(Code::kUnavailable, "the disk went away");
  });
  EXPECT_EQ(failed.status().code(), Code::kUnavailable);
  EXPECT_NE(failed.status().message().find("the disk went away"), std::string::npos);
}

TEST_F(WorkspaceGitTest, NotARepositoryAndMissingDirAreClearErrors) {
  auto a = PlanInject(tmp_->path() + "/nope", kDefaultQuotaBytes);
  EXPECT_EQ(a.status().code(), Code::kNotFound) << a.status().ToString();
  auto b = PlanInject(home_, kDefaultQuotaBytes);
  EXPECT_EQ(b.status().code(), Code::kInvalidArgument);
  EXPECT_NE(b.status().message().find("not a git working tree"), std::string::npos);
  auto c = PlanInject(repo_ + "/src", kDefaultQuotaBytes);
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
}

TEST_F(WorkspaceGitTest, CommitOnBranchLeavesHeadIndexAndTreeUntouched) {
  std::string before = TreeFingerprint(repo_);
  std::string head = Sh(home_, "cd '" + repo_ + "' && git rev-parse HEAD");
  std::vector<Change> changes;
  auto out = RoundTrip(
      "echo changed > src/a.txt && rm src/c.txt && mv src/b.txt src/b2.txt && echo n > "
      "added.txt && chmod -x run.sh && mkdir -p x/build && echo o > x/build/o",
      nullptr, &changes);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_TRUE(out->committed);
  EXPECT_TRUE(out->injected_commit.empty());  // clean working tree: one commit
  EXPECT_EQ(TreeFingerprint(repo_), before);
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git rev-parse HEAD"), head);
  std::string status =
      Sh(home_, "cd '" + repo_ + "' && git diff-tree -r -M --name-status HEAD trybox/vm1");
  EXPECT_EQ(status,
            "A\tadded.txt\nM\trun.sh\nM\tsrc/a.txt\nR100\tsrc/b.txt\tsrc/b2.txt\nD\tsrc/c.txt\n");
  // The tracked, excluded build output stays as it was in HEAD.
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git show trybox/vm1:src/build/out.o"), "keep\n");
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git rev-parse trybox/vm1^"), head);
  ASSERT_EQ(changes.size(), 5u);
}

TEST_F(WorkspaceGitTest, NoChangeMeansNoCommit) {
  auto out = RoundTrip("");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_FALSE(out->committed);
  EXPECT_NE(out->note.find("no commit"), std::string::npos);
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git branch --list 'trybox/*'"), "");
}

TEST_F(WorkspaceGitTest, DirtyWorkingTreeGetsItsOwnCommitFirst) {
  Sh(home_, "cd '" + repo_ +
                "' && echo local > src/a.txt && echo u > untracked.txt && rm "
                "src/c.txt && git add src/a.txt");
  std::string index_before = Sha256File(repo_ + "/.git/index").value_or("");
  auto out = RoundTrip("echo vm > vm.txt");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_TRUE(out->committed);
  ASSERT_FALSE(out->injected_commit.empty());
  EXPECT_EQ(Sh(home_, "cd '" + repo_ +
                          "' && git diff-tree -r --name-status trybox/vm1^ "
                          "trybox/vm1"),
            "A\tvm.txt\n");
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git diff-tree -r --name-status HEAD trybox/vm1^"),
            "M\tsrc/a.txt\nD\tsrc/c.txt\nA\tuntracked.txt\n");
  EXPECT_EQ(Sha256File(repo_ + "/.git/index").value_or("x"), index_before);
}

TEST_F(WorkspaceGitTest, PlantedConfigAttacksNeverRun) {
  ASSERT_TRUE(testing::PlantGitConfigAttacks(home_, repo_, marks_).ok());

  // Control: the same repository under plain git does run them, so the plants are live.
  std::string control = tmp_->path() + "/control";
  Sh(home_, "cp -a '" + repo_ + "' '" + control + "' && cd '" + control +
                "' && echo c >> src/a.txt && git add src/a.txt && git commit -qm c && "
                "git status >/dev/null && script -qc 'git log -1' /dev/null >/dev/null");
  auto ran = AttacksThatRan(marks_);
  auto has = [&](const std::string& n) {
    return std::find(ran.begin(), ran.end(), n) != ran.end();
  };
  EXPECT_TRUE(has("ran-clean")) << "the filter did not run under plain git";
  EXPECT_TRUE(has("hook-pre-commit")) << "the hook did not run under plain git";
  EXPECT_TRUE(has("ran-included-pager")) << "the included pager did not run under plain git";
  EXPECT_TRUE(has("ran-fsmonitor")) << "fsmonitor did not run under plain git";
  Sh(home_, "rm -f '" + marks_ + "'/ran-* '" + marks_ + "'/hook-*");

  std::string before = TreeFingerprint(repo_);
  auto out = RoundTrip("echo changed > src/a.txt && echo n > added.txt");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->committed);
  EXPECT_EQ(AttacksThatRan(marks_), std::vector<std::string>());
  EXPECT_EQ(TreeFingerprint(repo_), before);
  // The committed blob is the raw content: no clean filter touched it.
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git cat-file blob trybox/vm1:src/a.txt"), "changed\n");
}

TEST_F(WorkspaceGitTest, SecondCollectBuildsOnTheBranch) {
  auto first = RoundTrip("echo 1 > one.txt");
  ASSERT_TRUE(first.ok() && first->committed);
  auto second = RoundTrip("echo 1 > one.txt && echo 2 > two.txt");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE(second->committed);
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git rev-parse trybox/vm1^"), first->commit + "\n");
  auto third = RoundTrip("echo 1 > one.txt && echo 2 > two.txt");
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->committed);
}

TEST(WorkspaceTest, ParseSize) {
  EXPECT_EQ(ParseSize("1G").value_or(0), 1ull << 30);
  EXPECT_EQ(ParseSize("512M").value_or(0), 512ull << 20);
  EXPECT_EQ(ParseSize("100").value_or(0), 100u);
  EXPECT_FALSE(ParseSize("0").ok());
  EXPECT_FALSE(ParseSize("12X").ok());
  EXPECT_FALSE(ParseSize("").ok());
}

TEST(WorkspaceTest, SocketsFromTarWarnings) {
  auto s = SkippedFromTarWarnings(
      "tar: ./a/s: socket ignored\ntar: other warning\n/bin/tar: ./b: socket ignored");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].path, "a/s");
  EXPECT_EQ(s[1].path, "b");
}

TEST_F(WorkspaceGitTest, InjectEntryQuotaCountsFilesAndDirectories) {
  // run.sh, src/a.txt, src/b.txt, src/c.txt and the directory src: five entries.
  auto five = PlanInject(repo_, Quota{kDefaultQuotaBytes, 5});
  ASSERT_TRUE(five.ok()) << five.status().ToString();
  EXPECT_EQ(CountEntries(five->manifest), 5u);
  auto four = PlanInject(repo_, Quota{kDefaultQuotaBytes, 4});
  ASSERT_EQ(four.status().code(), Code::kResourceExhausted);
  EXPECT_NE(four.status().message().find("holds 5 entries"), std::string::npos)
      << four.status().message();
  EXPECT_NE(four.status().message().find("quota of 4 entries"), std::string::npos);
}

// The guest names files as git never would. What the record claims is exactly what the
// commit holds; what neither holds is named with its reason; nothing fails the collect.
TEST_F(WorkspaceGitTest, RecordAndCommitAgreeOnNamesGitRefusesOrCannotCarry) {
  std::vector<Skipped> skipped;
  Manifest after;
  auto out = RoundTrip(
      "mkdir -p 'git~1' '.GIT' '.git. ' 'sub/.Git' && for d in 'git~1' '.GIT' '.git. ' "
      "'sub/.Git'; do echo '[core]' > \"$d/config\"; done && printf x > \"$(printf 'a\\nb')\" "
      "&& printf 'cr' > \"$(printf 'name\\r')\" && printf 'plain' > name && ln -s /etc/passwd "
      ".gitmodules && echo ok > ok.txt",
      &after, nullptr, &skipped);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_TRUE(out->committed);
  std::map<std::string, std::string> why;
  for (const auto& s : skipped) why[s.path] = s.reason;
  for (const char* p : {"git~1", ".GIT", ".git. ", "sub/.Git", "a\nb", ".gitmodules"}) {
    EXPECT_FALSE(why[p].empty()) << JsonSafe(p);
  }
  std::set<std::string> committed = TreePaths("trybox/vm1");
  for (const auto& [p, e] : after) EXPECT_EQ(committed.count(p), 1u) << JsonSafe(p);
  for (const auto& p : committed) {
    bool tracked_and_excluded = p == "src/build/out.o" || p == "node_modules/pkg/i.js";
    EXPECT_TRUE(after.count(p) || tracked_and_excluded)
        << "committed, not recorded: " << JsonSafe(p);
  }
  // "name\r" is its own file, with its own content.
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git cat-file blob \"trybox/vm1:$(printf 'name\\r')\""),
            "cr");
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git cat-file blob trybox/vm1:name"), "plain");
}

TEST_F(WorkspaceGitTest, NamesThatAreNotUtf8GoInAndComeBackExactly) {
  Sh(home_, "cd '" + repo_ +
                "' && printf one > \"$(printf 'caf\\303\\251')\" && printf two > "
                "\"$(printf 'bad\\377\\376')\" && git add -A && git commit -qm names");
  std::vector<Change> changes;
  Manifest after;
  auto out = RoundTrip(
      "printf changed > \"$(printf 'bad\\377\\376')\" && printf new > "
      "\"$(printf 'new\\375')\"",
      &after, &changes);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_TRUE(out->committed);
  EXPECT_TRUE(after.count("caf\xc3\xa9"));
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].path, "bad\xff\xfe");
  EXPECT_EQ(changes[1].path, "new\xfd");
  Json j = Json::parse(ChangesToJson(changes).dump());
  EXPECT_EQ(GetBytesField(j[0], "path").value(), "bad\xff\xfe");
  std::set<std::string> committed = TreePaths("trybox/vm1");
  EXPECT_TRUE(committed.count("bad\xff\xfe") && committed.count("new\xfd") &&
              committed.count("caf\xc3\xa9"));
}

TEST_F(WorkspaceGitTest, CommitMessageNeverShowsTheHostDirectory) {
  std::string leaky = "trybox: test\n\nSkipped: refused: Cannot extract through symlink " +
                      staging_ + "-collected/link/x\n";
  auto out = RoundTrip("echo n > added.txt", nullptr, nullptr, nullptr, leaky);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  std::string msg = Sh(home_, "cd '" + repo_ + "' && git log -1 --format=%B trybox/vm1");
  EXPECT_EQ(msg.find(tmp_->path()), std::string::npos) << msg;
  EXPECT_NE(msg.find("<host directory>/link/x"), std::string::npos) << msg;
}

TEST(WorkspaceTest, CommitMessageShowsGuestNamesOnOneLineEachAndCapsTheList) {
  CollectSummary s;
  s.vm_id = "vm1";
  s.image = "debian-12";
  s.image_sha256 = "abc";
  s.command = "sh -c 'echo hi\nFake-Trailer: yes'";
  s.changes = {{Change::Kind::kAdded, "a", "", 0, 1, 0, 0644},
               {Change::Kind::kModified, "b", "", 1, 2, 0644, 0644}};
  s.skipped.push_back({"evil\nSigned-off-by: someone", "a newline in the name"});
  for (int i = 0; i < 30; ++i) s.skipped.push_back({"p" + std::to_string(i), "a fifo"});
  s.skipped_unlisted = 5;
  std::string m = CollectCommitMessage(s);
  EXPECT_EQ(m.find("\nFake-Trailer"), std::string::npos) << m;
  EXPECT_EQ(m.find("\nSigned-off-by"), std::string::npos) << m;
  EXPECT_NE(m.find("Files changed: 2 (1 added, 1 modified, 0 deleted, 0 renamed, 0 mode changes)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("Skipped (not collected): 36\n"), std::string::npos) << m;
  EXPECT_NE(m.find("  and 16 more"), std::string::npos) << m;
  size_t lines = std::count(m.begin(), m.end(), '\n');
  EXPECT_EQ(lines, 7u + kCommitListedSkipped + 1) << m;
}

// Every object a collect's commit writes is kept apart until the commit is whole: after a
// commit the repository has no object that nothing reaches, and no quarantine is left.
TEST_F(WorkspaceGitTest, ACommitLeavesNoUnreachableObjectAndNoQuarantine) {
  auto c = RoundTrip("echo brand-new > src/new.txt && echo changed > src/a.txt");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->committed);
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git fsck --no-reflogs --unreachable 2>&1"), "");
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && ls .git/objects | grep -c incoming || true"), "0\n");
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git show trybox/vm1:src/new.txt"), "brand-new\n");
}

// A commit that fails after its blobs and trees exist (git refuses a NUL in a message,
// after both were written) leaves none of them in the repository.
TEST_F(WorkspaceGitTest, ACommitThatFailsLeavesNoObjectBehind) {
  auto c = RoundTrip("echo brand-new > src/new.txt", nullptr, nullptr, nullptr,
                     std::string("trybox: test\0with a NUL\n", 25));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("NUL"), std::string::npos) << c.status().ToString();
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && git fsck --no-reflogs --unreachable 2>&1"), "");
  EXPECT_EQ(Sh(home_, "cd '" + repo_ + "' && ls .git/objects | grep -c incoming || true"), "0\n");
}

TEST_F(WorkspaceGitTest, AQuarantineNotFinishedTakesItsObjectsWithIt) {
  auto repo = GitRepo::Open(repo_);
  ASSERT_TRUE(repo.ok());
  const std::string marker = tmp_->path() + "/q.quarantine";
  std::string blob, dir;
  {
    auto q = ObjectQuarantine::Start(*repo, marker);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    dir = q->path();
    auto b = repo->WriteBlob("only in the quarantine\n");
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    blob = *b;
    // This repository reads it; any other git process does not see it.
    EXPECT_TRUE(repo->Run({"cat-file", "-e", blob}).ok());
    EXPECT_FALSE(GitRepo::Open(repo_)->Run({"cat-file", "-e", blob}).ok());
    EXPECT_EQ(ReadFileToString(marker).value_or(""), dir + "\n");
  }
  struct stat st;
  EXPECT_NE(::lstat(dir.c_str(), &st), 0) << dir;
  EXPECT_NE(::lstat(marker.c_str(), &st), 0) << marker;
  EXPECT_FALSE(GitRepo::Open(repo_)->Run({"cat-file", "-e", blob}).ok());
}

TEST_F(WorkspaceGitTest, AFinishedQuarantineMovesItsObjectsIntoTheStore) {
  auto repo = GitRepo::Open(repo_);
  ASSERT_TRUE(repo.ok());
  auto q = ObjectQuarantine::Start(*repo, "");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  const std::string dir = q->path();
  auto fresh = repo->WriteBlob("new in the quarantine\n");
  auto known = repo->WriteBlob("one\n");  // already in the store: src/a.txt
  ASSERT_TRUE(fresh.ok() && known.ok());
  ASSERT_TRUE(q->Finish().ok());
  struct stat st;
  EXPECT_NE(::lstat(dir.c_str(), &st), 0);
  auto plain = GitRepo::Open(repo_);
  EXPECT_TRUE(plain->Run({"cat-file", "-e", *fresh}).ok());
  EXPECT_TRUE(plain->Run({"cat-file", "-e", *known}).ok());
  // The repository writes to the store again.
  auto after = repo->WriteBlob("after the quarantine\n");
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(plain->Run({"cat-file", "-e", *after}).ok());
  EXPECT_EQ(
      Sh(home_, "cd '" + repo_ + "' && git fsck --no-dangling 2>&1 | grep -v '^Checking' || true"),
      "");
}

// What a daemon killed mid-commit leaves: the marker and the quarantine it names. The next
// daemon removes both, and nothing else.
TEST_F(WorkspaceGitTest, AnAbandonedQuarantineIsRemovedByItsMarkerAndNothingElseIs) {
  auto repo = GitRepo::Open(repo_);
  ASSERT_TRUE(repo.ok());
  const std::string marker = tmp_->path() + "/vm-abc.quarantine";
  std::string dir;
  {
    auto q = ObjectQuarantine::Start(*repo, marker);
    ASSERT_TRUE(q.ok());
    dir = q->path();
    ASSERT_TRUE(repo->WriteBlob("abandoned\n").ok());
    // A kill: neither Finish nor the destructor runs. Copy what is on disk aside.
    ASSERT_TRUE(RunChecked({"cp", "-a", dir, dir + ".kept"}).ok());
    ASSERT_TRUE(RunChecked({"cp", "-a", marker, marker + ".kept"}).ok());
  }
  ASSERT_EQ(::rename((dir + ".kept").c_str(), dir.c_str()), 0);
  ASSERT_EQ(::rename((marker + ".kept").c_str(), marker.c_str()), 0);
  Status st = RemoveAbandonedQuarantine(marker);
  EXPECT_TRUE(st.ok()) << st.ToString();
  struct stat sb;
  EXPECT_NE(::lstat(dir.c_str(), &sb), 0);
  EXPECT_NE(::lstat(marker.c_str(), &sb), 0);
  EXPECT_EQ(::lstat((repo_ + "/.git/objects").c_str(), &sb), 0);
  // A marker that names anything but a quarantine is refused and kept, its target untouched.
  const std::string bad = tmp_->path() + "/bad.quarantine";
  for (const std::string& target : std::vector<std::string>{
           repo_, repo_ + "/.git/objects", "/tmp/incoming-trybox-0123456789abcdef",
           repo_ + "/.git/objects/incoming-trybox-xyz",
           "relative/objects/incoming-trybox-0123456789abcdef"}) {
    ASSERT_TRUE(WriteFileAtomic(bad, target + "\n").ok());
    Status refused = RemoveAbandonedQuarantine(bad);
    EXPECT_EQ(refused.code(), Code::kInvalidArgument) << target;
    EXPECT_EQ(::lstat(bad.c_str(), &sb), 0);
  }
  EXPECT_EQ(::lstat((repo_ + "/src/a.txt").c_str(), &sb), 0);
}

}  // namespace
}  // namespace trybox::workspace
