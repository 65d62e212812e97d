// End to end: a project workspace into real guests and back, committed into real git
// repositories, through the real CLI and a private tryboxd.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "workspace/testing.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;
namespace wt = trybox::workspace::testing;

class WorkspaceE2E : public SharedHarness<WorkspaceE2E> {
 protected:
  void SetUp() override {
    ASSERT_NE(h_, nullptr);
    auto t = TempDir::Make("/tmp", "tbx-ws-e2e-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
    home_ = tmp_->path() + "/home";
    repo_ = tmp_->path() + "/repo";
    ASSERT_TRUE(MakeDirs(home_).ok());
  }

  std::string Sh(const std::string& script) {
    auto r = wt::Sh(home_, script);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : "";
  }
  // A committed repository with `files` small files spread over 50 directories.
  void MakeRepo(int files, const std::string& extra = "true") {
    Sh("git init -q -b main '" + repo_ + "' && cd '" + repo_ +
       "' && python3 -c \"\nimport os\nfor i in range(" + std::to_string(files) +
       "):\n d='src/d%02d' % (i % 50)\n os.makedirs(d, exist_ok=True)\n "
       "open('%s/f%05d.txt' % (d, i), 'w').write('file %d\\n' % i)\n\" && " +
       extra + " && git add -A && git commit -qm init");
  }
  static std::string VmIdFrom(const std::string& err) {
    std::smatch m;
    std::regex re("of VM ([0-9a-f]{12})");
    return std::regex_search(err, m, re) ? m[1].str() : "";
  }
  Json DiffJson(const std::string& id) {
    CliResult r = h_->Cli({"diff", id, "--json"});
    EXPECT_EQ(r.code, 0) << r.err;
    return Json::parse(r.out, nullptr, false);
  }
  std::string Create(const std::vector<std::string>& extra, Harness* h = nullptr) {
    std::vector<std::string> args = {"create", "--workspace", repo_};
    args.insert(args.end(), extra.begin(), extra.end());
    CliResult r = (h ? h : h_)->Cli(args);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.out.substr(0, r.out.find('\n'));
  }

  // A daemon whose VMs move workspaces as tars through the channel (TRYBOX_TRANSFER=channel:
  // no workspace disk), for the tests of what a guest's tar can do. Started once.
  static Harness* TarHarness() {
    if (tar_h_ == nullptr) {
      auto h = Harness::Start({"TRYBOX_TRANSFER=channel"});
      EXPECT_TRUE(h.ok()) << h.status().ToString();
      if (h.ok()) tar_h_ = std::move(*h).release();
    }
    return tar_h_;
  }
  static void TearDownTestSuite() {
    delete tar_h_;
    tar_h_ = nullptr;
    SharedHarness<WorkspaceE2E>::TearDownTestSuite();
  }

  std::optional<TempDir> tmp_;
  std::string home_, repo_;
  static inline Harness* tar_h_ = nullptr;
};

const Json* FindChange(const Json& changes, const std::string& path) {
  for (const auto& c : changes) {
    if (c["path"] == path) return &c;
  }
  return nullptr;
}

TEST_F(WorkspaceE2E, RoundTripOf5000FilesCommitsOnBranchAndLeavesTheTreeUntouched) {
  MakeRepo(5000,
           "mkdir -p a/b/node_modules/m c/target d/__pycache__ .venv/lib e/build .trybox && "
           "echo x > a/b/node_modules/m/i.js && echo x > c/target/t && echo x > "
           "d/__pycache__/z.pyc && echo x > .venv/lib/v && echo x > e/build/o && echo "
           "'*.secret' > .trybox/exclude && echo s > deep.secret && chmod +x src/d01/f00001.txt");
  Sh("cd '" + repo_ + "' && echo untracked > notes.txt && echo local >> src/d02/f00002.txt");
  std::string before = wt::TreeFingerprint(repo_);
  std::string head = Sh("cd '" + repo_ + "' && git rev-parse HEAD");
  // In the guest: count what arrived, check that nothing excluded did, then change things.
  std::string work =
      "set -e; test \"$(pwd)\" = /workspace; "
      "echo files=$(find . -type f | wc -l); "
      "for p in a/b/node_modules c/target d/__pycache__ .venv e/build deep.secret .git; do "
      "  if test -e $p; then echo leaked $p; exit 3; fi; done; "
      "grep -q local src/d02/f00002.txt; "
      "echo changed > src/d03/f00003.txt; rm src/d04/f00004.txt; "
      "mv src/d05/f00005.txt src/moved.txt; echo new > added.txt; chmod -x src/d01/f00001.txt; "
      "mkdir -p x/y/node_modules z/build; echo dep > x/y/node_modules/dep.js; "
      "echo out > z/build/out.o; echo s > new.secret";
  CliResult r = h_->Cli({"run", "--workspace", repo_, "--", "sh", "-c", work});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // 5000 + notes.txt + .trybox/exclude (deep.secret and the excluded trees stay out).
  EXPECT_NE(r.out.find("files=5002"), std::string::npos) << r.out;
  std::string id = VmIdFrom(r.err);
  ASSERT_FALSE(id.empty()) << r.err;

  Json c = DiffJson(id);
  ASSERT_TRUE(c.is_object());
  const Json& ch = c["changes"];
  EXPECT_EQ(ch.size(), 5u) << ch.dump(1);
  ASSERT_NE(FindChange(ch, "src/d03/f00003.txt"), nullptr);
  EXPECT_EQ((*FindChange(ch, "src/d03/f00003.txt"))["change"], "modified");
  EXPECT_EQ((*FindChange(ch, "src/d03/f00003.txt"))["new_size"], 8);
  ASSERT_NE(FindChange(ch, "src/d04/f00004.txt"), nullptr);
  EXPECT_EQ((*FindChange(ch, "src/d04/f00004.txt"))["change"], "deleted");
  ASSERT_NE(FindChange(ch, "src/moved.txt"), nullptr);
  EXPECT_EQ((*FindChange(ch, "src/moved.txt"))["change"], "renamed");
  EXPECT_EQ((*FindChange(ch, "src/moved.txt"))["from"], "src/d05/f00005.txt");
  ASSERT_NE(FindChange(ch, "added.txt"), nullptr);
  EXPECT_EQ((*FindChange(ch, "added.txt"))["change"], "added");
  ASSERT_NE(FindChange(ch, "src/d01/f00001.txt"), nullptr);
  EXPECT_EQ((*FindChange(ch, "src/d01/f00001.txt"))["change"], "mode_changed");
  EXPECT_EQ(c["branch"], "trybox/" + id);
  CliResult text = h_->Cli({"diff", id});
  EXPECT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("R  src/d05/f00005.txt -> src/moved.txt (7 bytes)"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("T  src/d01/f00001.txt (mode 755 -> 644)"), std::string::npos)
      << text.out;

  // The user's tree, index, HEAD and config are byte for byte as before.
  EXPECT_EQ(wt::TreeFingerprint(repo_), before);
  EXPECT_EQ(Sh("cd '" + repo_ + "' && git rev-parse HEAD"), head);
  // The VM's work is the branch's last commit; the dirty working tree is its parent.
  EXPECT_EQ(
      Sh("cd '" + repo_ + "' && git diff-tree -r -M --name-status trybox/" + id + "^ trybox/" + id),
      "A\tadded.txt\nM\tsrc/d01/f00001.txt\nM\tsrc/d03/f00003.txt\nD\tsrc/d04/"
      "f00004.txt\nR100\tsrc/d05/f00005.txt\tsrc/moved.txt\n");
  EXPECT_EQ(Sh("cd '" + repo_ + "' && git diff-tree -r --name-status HEAD trybox/" + id + "^"),
            "A\tnotes.txt\nM\tsrc/d02/f00002.txt\n");
  std::string msg = Sh("cd '" + repo_ + "' && git log -1 --format=%B trybox/" + id);
  EXPECT_NE(msg.find("VM: " + id), std::string::npos) << msg;
  EXPECT_NE(msg.find("Image: debian-12"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Command: sh -c"), std::string::npos) << msg;
}

TEST_F(WorkspaceE2E, NoChangeMakesNoCommitAndSaysSo) {
  MakeRepo(10);
  CliResult r = h_->Cli({"run", "--workspace", repo_, "--", "cat", "src/d01/f00001.txt"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "file 1\n");
  EXPECT_NE(r.err.find("no files changed; no commit made"), std::string::npos) << r.err;
  EXPECT_EQ(Sh("cd '" + repo_ + "' && git branch --list 'trybox/*'"), "");
}

TEST_F(WorkspaceE2E, AFailedCommandsWorkStillComesBackWithItsExitCode) {
  MakeRepo(10);
  CliResult r =
      h_->Cli({"run", "--workspace", repo_, "--", "sh", "-c", "echo partial > wip.txt; exit 3"});
  EXPECT_EQ(r.code, 3) << r.err;
  std::string id = VmIdFrom(r.err);
  ASSERT_FALSE(id.empty()) << r.err;
  EXPECT_EQ(Sh("cd '" + repo_ + "' && git show trybox/" + id + ":wip.txt"), "partial\n");
}

TEST_F(WorkspaceE2E, SetupHookRunsFirstAndItsFailureStopsTheRunWithItsCode) {
  MakeRepo(3,
           "mkdir -p .trybox && printf 'echo setup-ran\\ntouch /tmp/setup-done\\n' > "
           ".trybox/setup.sh");
  CliResult ok = h_->Cli({"run", "--workspace", repo_, "--", "sh", "-c",
                          "test -e /tmp/setup-done && echo command-ran"});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.err.find("setup-ran"), std::string::npos) << ok.err;
  EXPECT_EQ(ok.out, "command-ran\n");

  Sh("cd '" + repo_ + "' && printf 'echo setup-failing >&2\\nexit 7\\n' > .trybox/setup.sh");
  CliResult bad = h_->Cli({"run", "--workspace", repo_, "--", "echo", "command-ran"});
  EXPECT_EQ(bad.code, 7) << bad.err;
  EXPECT_EQ(bad.out, "");
  EXPECT_NE(bad.err.find("setup-failing"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find(".trybox/setup.sh failed"), std::string::npos) << bad.err;
}

TEST_F(WorkspaceE2E, QuotaExceededIsNamedAndTheVmKeepsRunning) {
  MakeRepo(5);
  CliResult in = h_->Cli({"run", "--workspace", repo_, "--workspace-quota", "16", "--", "true"});
  EXPECT_EQ(in.code, 125);
  EXPECT_NE(in.err.find("quota of 16 bytes"), std::string::npos) << in.err;

  std::string id = Create({"--workspace-quota", "64K"});
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(h_->Cli({"exec", id, "--", "sh", "-c", "head -c 200000 /dev/zero > big"}).code, 0);
  CliResult over = h_->Cli({"collect", id});
  EXPECT_EQ(over.code, 125);
  EXPECT_NE(over.err.find("workspace quota of 64.0 KiB (65536 bytes)"), std::string::npos)
      << over.err;
  EXPECT_EQ(Sh("cd '" + repo_ + "' && git branch --list 'trybox/*'"), "");
  CliResult alive = h_->Cli({"exec", id, "--", "sh", "-c", "rm big && echo alive"});
  EXPECT_EQ(alive.code, 0) << alive.err;
  EXPECT_EQ(alive.out, "alive\n");
  ASSERT_EQ(h_->Cli({"exec", id, "--", "sh", "-c", "echo small > small.txt"}).code, 0);
  CliResult ok = h_->Cli({"collect", id});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("committed"), std::string::npos) << ok.out;
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

TEST_F(WorkspaceE2E, PlantedGitConfigAttacksNeverRun) {
  MakeRepo(20);
  std::string marks = tmp_->path() + "/marks";
  ASSERT_TRUE(MakeDirs(marks).ok());
  ASSERT_TRUE(wt::PlantGitConfigAttacks(home_, repo_, marks).ok());
  std::string before = wt::TreeFingerprint(repo_);
  CliResult r =
      h_->Cli({"run", "--workspace", repo_, "--", "sh", "-c", "echo vm >> src/d01/f00001.txt"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("committed"), std::string::npos) << r.err;
  EXPECT_EQ(wt::AttacksThatRan(marks), std::vector<std::string>());
  EXPECT_EQ(wt::TreeFingerprint(repo_), before);
}

TEST_F(WorkspaceE2E, NotARepositoryOrMissingDirIsAClearError) {
  CliResult missing = h_->Cli({"run", "--workspace", tmp_->path() + "/nope", "--", "true"});
  EXPECT_EQ(missing.code, 125);
  EXPECT_NE(missing.err.find("nope"), std::string::npos) << missing.err;
  CliResult plain = h_->Cli({"run", "--workspace", home_, "--", "true"});
  EXPECT_EQ(plain.code, 125);
  EXPECT_NE(plain.err.find("not a git working tree"), std::string::npos) << plain.err;
}

// The guest powers off in the middle of the tar it sends (a VM without a workspace disk):
// the collect fails naming that, leaves no --into directory and no branch, and the failure
// is on record.
TEST_F(WorkspaceE2E, GuestDyingMidCollectIsItsOwnErrorAndLeavesNothing) {
  Harness* t = TarHarness();
  ASSERT_NE(t, nullptr);
  MakeRepo(200);
  std::string id = Create({}, t);
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(t->Cli({"exec", id, "--", "sh", "-c",
                    "echo changed > src/d01/f00001.txt && cp /bin/tar /bin/tar.real && printf "
                    "'#!/bin/sh\n/bin/tar.real -cf - -C /workspace . | head -c 20000\necho o "
                    "> /proc/sysrq-trigger\nsleep 60\n' > /bin/tar"})
                .code,
            0);
  std::string into = tmp_->path() + "/into";
  CliResult r = t->Cli({"collect", id, "--into", into});
  EXPECT_EQ(r.code, 125) << r.out;
  EXPECT_NE(r.err.find("collect the workspace of VM " + id), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("guest"), std::string::npos) << r.err;
  struct stat st;
  EXPECT_NE(::lstat(into.c_str(), &st), 0) << "a partial --into directory was left";
  EXPECT_EQ(Sh("cd '" + repo_ + "' && git branch --list 'trybox/*'"), "");
  CliResult d = t->Cli({"diff", id, "--json"});
  Json c = Json::parse(d.out, nullptr, false);
  EXPECT_EQ(c["outcome"], "error") << d.out << d.err;
  EXPECT_EQ(c["changes"].size(), 0u);
  (void)t->Cli({"rm", id});
}

// A hostile guest of a VM that moves its workspace as a tar: special files in /workspace,
// then a /bin/tar replaced by a script that emits a crafted archive aiming outside the
// collect directory in every way it can.
TEST_F(WorkspaceE2E, HostileReturnedTreeNeverWritesOutsideAndIsNamed) {
  Harness* t = TarHarness();
  ASSERT_NE(t, nullptr);
  MakeRepo(3);
  std::string outside = tmp_->path() + "/outside";
  ASSERT_TRUE(MakeDirs(outside).ok());
  // Privileged: the most a hostile guest can be (mknod needs it), against the host's side.
  std::string id = Create({"--privileged"}, t);
  ASSERT_FALSE(id.empty());
  CliResult sp = t->Cli({"exec", id, "--", "sh", "-c",
                         "mknod dev c 1 3 && mkfifo fifo && python3 -c \"import socket; "
                         "socket.socket(socket.AF_UNIX).bind('sock')\" && ln -s /etc/passwd pw"});
  ASSERT_EQ(sp.code, 0) << sp.err;
  CliResult c1 = t->Cli({"collect", id, "--json"});
  ASSERT_EQ(c1.code, 0) << c1.err;
  Json j1 = Json::parse(c1.out, nullptr, false);
  std::map<std::string, std::string> skipped;
  for (const auto& s : j1["skipped"]) skipped[s["path"]] = s["reason"];
  EXPECT_EQ(skipped["dev"], "a character device") << c1.out;
  EXPECT_EQ(skipped["fifo"], "a fifo") << c1.out;
  EXPECT_NE(skipped["sock"].find("a socket"), std::string::npos) << c1.out;
  ASSERT_NE(FindChange(j1["changes"], "pw"), nullptr);  // a symlink is content, kept as one

  std::string craft =
      "import tarfile, io, sys\n"
      "t = tarfile.open(fileobj=sys.stdout.buffer, mode='w|')\n"
      "def add(name, data=b'evil', **kw):\n"
      "    i = tarfile.TarInfo(name); i.size = len(data)\n"
      "    for k, v in kw.items(): setattr(i, k, v)\n"
      "    if i.type in (tarfile.REGTYPE,): t.addfile(i, io.BytesIO(data))\n"
      "    else: i.size = 0; t.addfile(i)\n"
      "add('./ok.txt', b'fine')\n"
      "add('../escape.txt')\n"
      "add('./a/../../escape2.txt')\n"
      "add('" +
      outside +
      "/abs.txt')\n"
      "add('./link', type=tarfile.SYMTYPE, linkname='" +
      outside +
      "')\n"
      "add('./link/through.txt')\n"
      "add('./hard', type=tarfile.LNKTYPE, linkname='/etc/passwd')\n"
      "add('./dev2', type=tarfile.CHRTYPE, devmajor=1, devminor=3)\n"
      "t.close()\n";
  ASSERT_TRUE(WriteFileAtomic(tmp_->path() + "/craft.py", craft).ok());
  ASSERT_EQ(t->Cli({"cp", tmp_->path() + "/craft.py", id + ":/root/craft.py"}).code, 0);
  ASSERT_EQ(t->Cli({"exec", id, "--", "sh", "-c",
                    "cp /bin/tar /bin/tar.real && printf '#!/bin/sh\\nexec python3 "
                    "/root/craft.py\\n' > /bin/tar"})
                .code,
            0);
  std::string into = tmp_->path() + "/into";
  CliResult c2 = t->Cli({"collect", id, "--into", into, "--no-commit", "--json"});
  ASSERT_EQ(c2.code, 0) << c2.err;
  Json j2 = Json::parse(c2.out, nullptr, false);
  // The crafted archive came from the guest's tar, through the channel.
  EXPECT_EQ(j2["transfer"], "channel") << c2.out;
  skipped.clear();
  for (const auto& s : j2["skipped"]) skipped[s["path"]] = s["reason"];
  EXPECT_EQ(skipped["../escape.txt"], "a '..' component") << c2.out;
  EXPECT_EQ(skipped["a/../../escape2.txt"], "a '..' component") << c2.out;
  EXPECT_EQ(skipped[outside + "/abs.txt"], "an absolute path") << c2.out;
  EXPECT_NE(skipped["link/through.txt"].find("refused"), std::string::npos) << c2.out;
  EXPECT_EQ(skipped["hard"], "a hard link to an absolute path") << c2.out;
  EXPECT_EQ(skipped["dev2"], "a character device") << c2.out;
  struct stat st;
  EXPECT_EQ(::lstat((into + "/ok.txt").c_str(), &st), 0);
  for (const auto& p : {tmp_->path() + "/escape.txt", tmp_->path() + "/escape2.txt",
                        outside + "/abs.txt", outside + "/through.txt", into + "/hard"}) {
    EXPECT_NE(::lstat(p.c_str(), &st), 0) << p << " was written";
  }
  EXPECT_EQ(t->Cli({"rm", id}).code, 0);
}

// ---- the workspace disk (docs/protocol/guest.md, "The workspace disk") ----

// /workspace is the disk's ext4, written on the host; the collect reads it back on the host
// while the guest holds it frozen, and the guest can write again afterwards.
TEST_F(WorkspaceE2E, TheWorkspaceIsTheDisksFileSystemAndComesBackFromIt) {
  MakeRepo(300,
           "printf '#!/bin/sh\\necho hi\\n' > run.sh && chmod 755 run.sh && ln -s "
           "src/d01/f00001.txt link");
  std::string id = Create({});
  ASSERT_FALSE(id.empty());
  CliResult fs =
      h_->Cli({"exec", id, "--", "sh", "-c", "awk '$2 == \"/workspace\" {print $3}' /proc/mounts"});
  EXPECT_EQ(fs.out, "ext4\n") << fs.err;
  CliResult look = h_->Cli({"exec", id, "--", "sh", "-c",
                            "cat link && ./run.sh > out.txt && rm src/d02/f00002.txt && chmod "
                            "600 src/d03/f00003.txt && mv src/d04/f00004.txt moved.txt"});
  ASSERT_EQ(look.code, 0) << look.err;
  EXPECT_EQ(look.out, "file 1\n");
  CliResult c1 = h_->Cli({"collect", id, "--no-commit", "--json"});
  ASSERT_EQ(c1.code, 0) << c1.err;
  Json j1 = Json::parse(c1.out, nullptr, false);
  EXPECT_EQ(j1["transfer"], "workspace_disk") << c1.out;
  EXPECT_EQ(j1["counts"]["added"], 1) << c1.out;
  EXPECT_EQ(j1["counts"]["deleted"], 1) << c1.out;
  EXPECT_EQ(j1["counts"]["mode_changed"], 1) << c1.out;
  EXPECT_EQ(j1["counts"]["renamed"], 1) << c1.out;
  EXPECT_EQ(j1["files"], 302) << c1.out;  // 300 - 1 + run.sh, link, out.txt
  // Thawed: the guest writes again, and the next collect sees it.
  CliResult after = h_->Cli({"exec", id, "--", "sh", "-c", "echo after > after.txt"});
  ASSERT_EQ(after.code, 0) << after.err;
  CliResult c2 = h_->Cli({"collect", id, "--json"});
  ASSERT_EQ(c2.code, 0) << c2.err;
  Json j2 = Json::parse(c2.out, nullptr, false);
  EXPECT_EQ(j2["counts"]["added"], 2) << c2.out;
  EXPECT_EQ(Sh("cd '" + repo_ + "' && git show trybox/" + id + ":after.txt"), "after\n");
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

// Past the disk's size the guest gets ENOSPC, as past any disk; nothing else breaks.
TEST_F(WorkspaceE2E, AFullWorkspaceDiskIsNoSpaceInTheGuestAndCollectStillWorks) {
  MakeRepo(5);
  // A small quota makes a small disk: about 66 MiB.
  std::string id = Create({"--workspace-quota", "1M", "--workspace-quota-entries", "100"});
  ASSERT_FALSE(id.empty());
  CliResult fill = h_->Cli({"exec", id, "--", "sh", "-c", "head -c 200M /dev/zero > big"});
  EXPECT_NE(fill.code, 0);
  EXPECT_NE(fill.err.find("No space left on device"), std::string::npos) << fill.err;
  ASSERT_EQ(h_->Cli({"exec", id, "--", "sh", "-c", "rm big && echo ok > ok.txt"}).code, 0);
  CliResult c = h_->Cli({"collect", id, "--no-commit", "--json"});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(Json::parse(c.out, nullptr, false)["counts"]["added"], 1) << c.out;
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

// A privileged guest makes special files; then the disk holds a corrupt directory block: the
// special files are named, the corrupt disk is a clear error from the sandboxed reader, and
// the daemon and the VM go on. No command can write the disk itself (the exec cgroup's
// device rules refuse even a privileged one, checked first), so the test writes on the host
// the bytes a subverted guest kernel could write.
TEST_F(WorkspaceE2E, SpecialFilesAreNamedAndACorruptWorkspaceDiskIsAClearError) {
  MakeRepo(3);
  std::string id = Create({"--privileged"});
  ASSERT_FALSE(id.empty());
  CliResult sp = h_->Cli({"exec", id, "--", "sh", "-c",
                          "mknod dev c 1 3 && mkfifo fifo && python3 -c \"import socket; "
                          "socket.socket(socket.AF_UNIX).bind('sock')\" && ln -s /etc/passwd pw"});
  ASSERT_EQ(sp.code, 0) << sp.err;
  CliResult c1 = h_->Cli({"collect", id, "--no-commit", "--json"});
  ASSERT_EQ(c1.code, 0) << c1.err;
  Json j1 = Json::parse(c1.out, nullptr, false);
  EXPECT_EQ(j1["transfer"], "workspace_disk") << c1.out;
  std::map<std::string, std::string> skipped;
  for (const auto& s : j1["skipped"]) skipped[s["path"]] = s["reason"];
  EXPECT_EQ(skipped["dev"], "a character device") << c1.out;
  EXPECT_EQ(skipped["fifo"], "a fifo") << c1.out;
  EXPECT_NE(skipped["sock"].find("a socket"), std::string::npos) << c1.out;
  ASSERT_NE(FindChange(j1["changes"], "pw"), nullptr);

  CliResult raw =
      h_->Cli({"exec", id, "--", "sh", "-c",
               "for d in /sys/block/*; do [ \"$(cat $d/serial 2>/dev/null)\" = trybox-ws ] && "
               "dev=$(cat $d/dev); done; mknod /tmp/wsdev b ${dev%:*} ${dev#*:} && head -c 4096 "
               "/dev/urandom | dd of=/tmp/wsdev bs=4096 seek=1 conv=notrunc status=none"});
  EXPECT_NE(raw.code, 0);
  EXPECT_NE(raw.err.find("Permission denied"), std::string::npos) << raw.err;
  // The root directory's first block, as the host's debugfs finds it, overwritten.
  const std::string img = h_->vms_dir() + "/" + id + "/ws.img";
  std::string block = Sh("debugfs -R 'bmap / 0' '" + img + "' 2>/dev/null | tr -d '\\n'");
  ASSERT_FALSE(block.empty());
  ASSERT_EQ(block.find_first_not_of("0123456789"), std::string::npos) << block;
  EXPECT_EQ(Sh("head -c 4096 /dev/urandom | dd of='" + img + "' bs=4096 seek=" + block +
               " conv=notrunc status=none && echo done"),
            "done\n");
  CliResult c2 = h_->Cli({"collect", id});
  EXPECT_EQ(c2.code, 125) << c2.out;
  EXPECT_NE(c2.err.find("the workspace disk could not be read"), std::string::npos) << c2.err;
  EXPECT_EQ(Sh("cd '" + repo_ + "' && git branch --list 'trybox/*'"), "");
  CliResult alive = h_->Cli({"exec", id, "--", "echo", "alive"});
  EXPECT_EQ(alive.out, "alive\n") << alive.err;
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

// A guest that died before the collect: its own error, nothing left behind, on record.
TEST_F(WorkspaceE2E, ACollectFromADeadGuestIsItsOwnError) {
  MakeRepo(20);
  std::string id = Create({"--privileged"});
  ASSERT_FALSE(id.empty());
  (void)h_->Cli({"exec", id, "--", "sh", "-c",
                 "echo changed > src/d01/f00001.txt && sync && "
                 "echo o > /proc/sysrq-trigger"});
  std::string into = tmp_->path() + "/into";
  CliResult r = h_->Cli({"collect", id, "--into", into});
  EXPECT_EQ(r.code, 125) << r.out;
  // Whether the daemon heard of QEMU's exit or of the channel's loss first, the same words.
  EXPECT_NE(r.err.find("VM " + id + ": the guest is gone: "), std::string::npos) << r.err;
  struct stat st;
  EXPECT_NE(::lstat(into.c_str(), &st), 0) << "a partial --into directory was left";
  EXPECT_EQ(Sh("cd '" + repo_ + "' && git branch --list 'trybox/*'"), "");
  (void)h_->Cli({"rm", id});
}

}  // namespace
}  // namespace trybox::e2e
