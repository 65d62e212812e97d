// End to end: the CLI and the host (issue 18, docs/security.md "The CLI and the host"). Real
// guests, the real trybox binary and a private tryboxd: what a guest sends is never
// privileged on the host, never written through a planted link and never left half-done;
// the CLI talks only to a daemon of its own user, through a directory only it controls.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <set>
#include <thread>

#include "cli/testing.h"
#include "store/store.h"
#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

constexpr mode_t kSpecialBits = S_ISUID | S_ISGID | S_ISVTX;

using cli::testing::Entries;
using cli::testing::ModeOf;
using cli::testing::Trap;

// Every path below `root` (itself included) whose mode has a set-uid, set-gid or sticky bit.
std::vector<std::string> SpecialModes(const std::string& root) {
  std::vector<std::string> found;
  if (ModeOf(root) & kSpecialBits) found.push_back(root);
  if (!S_ISDIR(ModeOf(root))) return found;
  for (const auto& e : Entries(root)) {
    auto below = SpecialModes(root + "/" + e);
    found.insert(found.end(), below.begin(), below.end());
  }
  return found;
}

// A squatter's runtime directory: another user created it (or a link to their own), so
// their process could answer as tryboxd and read the requests, API keys included. The CLI
// runs with only XDG variables pointing into the test's directory (no TRYBOX_HOME), so its
// runtime directory is $XDG_RUNTIME_DIR/trybox, as for a user.
std::vector<std::string> XdgEnv(const std::string& t) {
  return {"PATH=/usr/bin:/bin",
          "HOME=" + t + "/home",
          "XDG_RUNTIME_DIR=" + t + "/xdg",
          "XDG_STATE_HOME=" + t + "/state",
          "XDG_CONFIG_HOME=" + t + "/config",
          "XDG_DATA_HOME=" + t + "/data",
          "XDG_CACHE_HOME=" + t + "/cache"};
}

void ExpectSquatRefused(const std::string& t, const Trap& trap, const std::string& why) {
  std::string runtime = t + "/xdg/trybox";
  CliResult r = RunProgram({BinDir() + "/trybox", "ls"}, XdgEnv(t));
  EXPECT_EQ(r.code, 125) << r.err;
  EXPECT_NE(r.err.find(runtime + " is not a private directory: " + why), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("remove it"), std::string::npos) << r.err;
  EXPECT_FALSE(trap.connected()) << "the CLI connected to the squatter's socket";
  EXPECT_FALSE(S_ISDIR(ModeOf(t + "/state"))) << "a daemon was started";
}

std::string Runtime(const std::string& t) { return t + "/xdg/trybox"; }

class CliHardeningE2E : public SharedHarness<CliHardeningE2E> {
 protected:
  void SetUp() override {
    ASSERT_NE(h_, nullptr);
    auto t = TempDir::Make("/tmp", "tbx-clih-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
    victim_ = tmp_->path() + "/victim";
    ASSERT_TRUE(WriteFileAtomic(victim_, "precious\n", 0600).ok());
    ASSERT_EQ(::mkdir((tmp_->path() + "/xdg").c_str(), 0700), 0);
  }
  void TearDown() override {
    if (!vm_.empty()) {
      EXPECT_EQ(h_->Cli({"rm", vm_}).code, 0);
    }
  }

  // A VM, created on first use, destroyed after the test.
  const std::string& Vm() {
    if (vm_.empty()) {
      CliResult r = h_->Cli({"create"});
      EXPECT_EQ(r.code, 0) << r.err;
      vm_ = r.out.substr(0, r.out.find('\n'));
    }
    return vm_;
  }
  void InGuest(const std::string& script) {
    CliResult r = h_->Cli({"exec", Vm(), "--", "sh", "-ec", script});
    ASSERT_EQ(r.code, 0) << script << "\n" << r.err;
  }
  void ExpectVictimUntouched() {
    EXPECT_EQ(ReadFileToString(victim_).value_or(""), "precious\n");
    EXPECT_EQ(ModeOf(victim_) & 07777, 0600u);
  }

  std::optional<TempDir> tmp_;
  std::string victim_;
  std::string vm_;
};

// A guest's `chmod 4755` copy of id once came out set-uid root and ran as euid 0 for any
// user of the host.
TEST_F(CliHardeningE2E, SetUidCopyOfIdComesOutWithoutSpecialBitsAsAFileAndInATree) {
  InGuest(
      "cp /usr/bin/id /root/id && chmod 4755 /root/id && "
      "mkdir -p /root/tree/sub /root/tree/shared && cp /usr/bin/id /root/tree/sub/id && "
      "chmod 6755 /root/tree/sub/id && chmod 2755 /root/tree/sub && "
      "chmod 1777 /root/tree/shared && chmod 3755 /root/tree && stat -c %a /root/id");
  ASSERT_EQ(::chmod(tmp_->path().c_str(), 0755), 0);  // so that uid 65534 can run the copy
  std::string id = tmp_->path() + "/id";
  CliResult cp = h_->Cli({"cp", Vm() + ":/root/id", id});
  ASSERT_EQ(cp.code, 0) << cp.err;
  EXPECT_EQ(ModeOf(id) & 07777, 0755u);
  EXPECT_EQ(SpecialModes(id), std::vector<std::string>{});
  // Run by another user, it runs as that user.
  CliResult as_nobody =
      RunProgram({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", id, "-u"},
                 {"PATH=/usr/bin:/bin"});
  EXPECT_EQ(as_nobody.out, "65534\n") << as_nobody.err;

  std::string tree = tmp_->path() + "/tree";
  cp = h_->Cli({"cp", Vm() + ":/root/tree", tree});
  ASSERT_EQ(cp.code, 0) << cp.err;
  EXPECT_EQ(ModeOf(tree + "/sub/id") & 07777, 0755u);
  EXPECT_EQ(ModeOf(tree + "/shared") & 07777, 0755u);  // nor group or other write (41.10)
  EXPECT_EQ(SpecialModes(tree), std::vector<std::string>{});
}

// Issue 41.10: a guest's 0666 file and 1777 directory kept their group and other write on the
// host (the sticky bit alone was dropped: 0777), in a destination root owns.
TEST_F(CliHardeningE2E, NothingFromAGuestLandsGroupOrWorldWritable) {
  const mode_t old_umask = ::umask(022);
  InGuest(
      "printf open > /root/open && chmod 666 /root/open && mkdir -p /root/t/pub /root/t/grp && "
      "chmod 1777 /root/t && chmod 777 /root/t/pub && chmod 2775 /root/t/grp && "
      "printf x > /root/t/pub/f && chmod 666 /root/t/pub/f && printf y > /root/t/grp/g && "
      "chmod 664 /root/t/grp/g && printf z > /root/t/run && chmod 777 /root/t/run");
  std::string file = tmp_->path() + "/open";
  CliResult cp = h_->Cli({"cp", Vm() + ":/root/open", file});
  ASSERT_EQ(cp.code, 0) << cp.err;
  EXPECT_EQ(ModeOf(file) & 07777, 0644u);
  std::string tree = tmp_->path() + "/t";
  cp = h_->Cli({"cp", Vm() + ":/root/t", tree});
  ASSERT_EQ(cp.code, 0) << cp.err;
  EXPECT_EQ(ModeOf(tree) & 07777, 0755u);
  EXPECT_EQ(ModeOf(tree + "/pub") & 07777, 0755u);
  EXPECT_EQ(ModeOf(tree + "/pub/f") & 07777, 0644u);
  EXPECT_EQ(ModeOf(tree + "/grp") & 07777, 0755u);
  EXPECT_EQ(ModeOf(tree + "/grp/g") & 07777, 0644u);
  EXPECT_EQ(ModeOf(tree + "/run") & 07777, 0755u);
  ::umask(old_umask);
}

// The bytes below 0x20 (but '\n'), DEL, C1 controls and U+202E found in `text`.
std::string ControlsIn(const std::string& text) {
  std::string found;
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n') || c == 0x7f) found += "byte " + std::to_string(c) + " ";
    if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
        static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      found += "C1 ";
    }
    if (text.compare(i, 3, "\xe2\x80\xae") == 0) found += "U+202E ";
  }
  return found;
}

bool HasLineStartingWith(const std::string& text, const std::string& prefix) {
  size_t at = 0;
  while (at < text.size()) {
    if (text.compare(at, prefix.size(), prefix) == 0) return true;
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  return false;
}

// Issue 41.3: a real guest's file names, chosen to erase the line before them, set the
// window title, write the clipboard (OSC 52), forge a `trybox:` line and reverse the text,
// reached the terminal raw through `run --workspace`'s collect summary and `diff`.
TEST_F(CliHardeningE2E, AGuestsFileNamesAreEscapedInTheCollectSummaryAndDiff) {
  std::string repo = tmp_->path() + "/repo";
  ASSERT_TRUE(RunChecked({"sh", "-c",
                          "git init -q -b main '" + repo + "' && cd '" + repo +
                              "' && echo x > README && git add -A && git -c user.name=t -c "
                              "user.email=t@t.test commit -qm init"})
                  .ok());
  // A name with ESC and BEL (git can hold it), and one with a newline (skipped and named).
  const std::string work =
      "touch \"$(printf "
      "'a\\033[2K\\r\\033]0;owned\\007\\033]52;c;aGk=\\007\\342\\200\\256txt.sh')\" "
      "\"$(printf 'b\\ntrybox: all clear')\" && echo done";
  CliResult r = h_->Cli({"run", "--workspace", repo, "--", "sh", "-c", work});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "done\n");
  EXPECT_EQ(ControlsIn(r.err), "") << r.err;
  EXPECT_FALSE(HasLineStartingWith(r.err, "trybox: all clear")) << r.err;
  // The summary counts the changes and names what it skipped: the name with a newline.
  EXPECT_NE(r.err.find("skipped b\\u{000A}trybox: all clear: "), std::string::npos) << r.err;
  std::smatch m;
  std::regex re("of VM ([0-9a-f]{12})");
  ASSERT_TRUE(std::regex_search(r.err, m, re)) << r.err;
  const std::string vm = m[1].str();  // gone with the run; its collect stays in the record
  CliResult d = h_->Cli({"diff", vm});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(ControlsIn(d.out), "") << d.out;
  EXPECT_FALSE(HasLineStartingWith(d.out, "trybox: all clear")) << d.out;
  EXPECT_NE(d.out.find("A  a\\u{001B}[2K\\u{000D}\\u{001B}]0;owned\\u{0007}\\u{001B}]52;c;aGk="
                       "\\u{0007}\\u{202E}txt.sh (0 bytes)\n"),
            std::string::npos)
      << d.out;
}

// Issue 41.9: `trybox audit` printed the host of a row raw. A default guest's proxy requests
// cannot carry control bytes (the proxy refuses them before recording a host), but a
// privileged guest can open an egress stream with any host, which is recorded as sent: here
// the row is written to the daemon's store as that stream would have it.
TEST_F(CliHardeningE2E, AGuestsHostIsEscapedInAudit) {
  auto store = store::Store::Open(h_->home() + "/state/trybox.db");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  store::EgressRecord e;
  e.vm_id = "hostile0vm01";
  e.started_at = 1.7e9;
  e.ended_at = 1.7e9;
  e.method = "TCP";
  e.host = "\x1b]52;c;aGk=\x07\x1b[2K\rok.test\ntrybox: all clear";
  e.port = 443;
  e.verdict = "refused";
  e.reason = "not on the list";
  ASSERT_TRUE((*store)->InsertEgress(e).ok());
  CliResult r = h_->Cli({"audit", "--vm", "hostile0vm01"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ControlsIn(r.out), "") << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;  // header and row
  EXPECT_NE(r.out.find("\\u{001B}]52;c;aGk="), std::string::npos) << r.out;
}

// The old CLI wrote DST.trybox-part-PID (O_CREAT|O_TRUNC, no O_NOFOLLOW) and chmod'ed it:
// a link planted there overwrote and chmod'ed a root file. Here one is planted for every
// pid the kernel can hand out (pid_max; a window after the last pid if that is huge).
TEST_F(CliHardeningE2E, LinksPlantedAtEveryOldTemporaryNameAreNeverFollowed) {
  InGuest("printf 'guest bytes' > /root/f && chmod 4755 /root/f");
  std::string dst = tmp_->path() + "/out";
  long pid_max = std::stol(ReadFileToString("/proc/sys/kernel/pid_max").value_or("32768"));
  long first = 1, last = pid_max;
  if (pid_max > 100000) {
    first = std::stol(ReadFileToString("/proc/sys/kernel/ns_last_pid").value_or("1"));
    last = first + 50000;
  }
  for (long pid = first; pid <= last; ++pid) {
    std::string name = dst + ".trybox-part-" + std::to_string(pid);
    ASSERT_EQ(::symlink(victim_.c_str(), name.c_str()), 0) << name;
  }
  size_t planted = Entries(tmp_->path()).size();
  CliResult cp = h_->Cli({"cp", Vm() + ":/root/f", dst});
  ASSERT_EQ(cp.code, 0) << cp.err;
  ExpectVictimUntouched();
  EXPECT_TRUE(S_ISREG(ModeOf(dst)));
  EXPECT_EQ(ModeOf(dst) & 07777, 0755u);
  EXPECT_EQ(ReadFileToString(dst).value_or(""), "guest bytes");
  EXPECT_EQ(Entries(tmp_->path()).size(), planted + 1) << "only DST is new";
}

// Decision: a DST that is a symbolic link is refused, whatever it points to (cp(1) would
// write through it); "DST/" copies into the directory a link points to.
TEST_F(CliHardeningE2E, DestinationThatIsASymlinkIsRefused) {
  InGuest("printf 'guest bytes' > /root/f && mkdir -p /root/d && echo x > /root/d/x");
  std::string link = tmp_->path() + "/link";
  ASSERT_EQ(::symlink(victim_.c_str(), link.c_str()), 0);
  for (const char* src : {":/root/f", ":/root/d"}) {
    CliResult cp = h_->Cli({"cp", Vm() + src, link});
    EXPECT_EQ(cp.code, 125) << src;
    EXPECT_NE(cp.err.find(link + " is a symbolic link"), std::string::npos) << cp.err;
    ExpectVictimUntouched();
    EXPECT_TRUE(S_ISLNK(ModeOf(link)));
  }
  // The same link met as DST/NAME when DST is a directory.
  std::string dir = tmp_->path() + "/dir";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(victim_.c_str(), (dir + "/f").c_str()), 0);
  CliResult cp = h_->Cli({"cp", Vm() + ":/root/f", dir});
  EXPECT_EQ(cp.code, 125);
  EXPECT_NE(cp.err.find("is a symbolic link"), std::string::npos) << cp.err;
  ExpectVictimUntouched();
  // With a trailing slash, a link to a directory is the directory.
  std::string to_dir = tmp_->path() + "/to-dir";
  ASSERT_EQ(::symlink(dir.c_str(), to_dir.c_str()), 0);
  cp = h_->Cli({"cp", Vm() + ":/root/d", to_dir + "/"});
  ASSERT_EQ(cp.code, 0) << cp.err;
  EXPECT_EQ(ReadFileToString(dir + "/d/x").value_or(""), "x\n");
}

// Killed with SIGKILL part-way through a 200-file tree, the old CLI left the files it had
// written at the destination (27 in the report). Now the tree is written to
// .DST.trybox-tmp-RANDOM and renamed only when complete, and the helper the CLI started
// removes the temporary directory when the CLI dies: nothing at all is left.
TEST_F(CliHardeningE2E, TreeCopyKilledMidwayLeavesNothing) {
  InGuest(
      "mkdir /root/big && i=0; while [ $i -lt 200 ]; do "
      "head -c 262144 /dev/urandom > /root/big/f$i; i=$((i+1)); done");
  std::string parent = tmp_->path() + "/p";
  ASSERT_EQ(::mkdir(parent.c_str(), 0755), 0);
  // The CLI runs under a subreaper, which waits for every descendant: the CLI and the
  // helper it leaves behind when killed. Built before fork: the test has threads.
  std::vector<std::string> args = {BinDir() + "/trybox", "cp", Vm() + ":/root/big",
                                   parent + "/out"};
  std::vector<std::string> env = h_->Env();
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  auto cli = cli::testing::Subreaper::Start([&] {
    int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  });
  ASSERT_TRUE(cli.ok()) << cli.status().ToString();
  // Mid-transfer: some directory under `parent` (the temporary one, or with the old CLI the
  // destination itself) holds 27 files.
  ASSERT_TRUE(cli::testing::WaitForADirectoryWith(parent, 27, std::chrono::seconds(300)))
      << "the copy never got going: " << ::testing::PrintToString(Entries(parent));
  ASSERT_EQ(::kill((*cli)->child(), SIGKILL), 0);
  ASSERT_TRUE((*cli)->WaitForAll().ok());  // the CLI and the helper it left behind
  EXPECT_EQ(Entries(parent), std::set<std::string>{}) << "a killed copy left something behind";
  // The VM is fine and the same copy, uninterrupted, completes.
  CliResult cp = h_->Cli({"cp", Vm() + ":/root/big", parent + "/out"});
  ASSERT_EQ(cp.code, 0) << cp.err;
  EXPECT_EQ(Entries(parent + "/out").size(), 200u);
  EXPECT_EQ(Entries(parent), std::set<std::string>{"out"});
}

TEST_F(CliHardeningE2E, SquattedRuntimeDirThatIsASymlinkIsRefused) {
  std::string theirs = tmp_->path() + "/theirs";
  ASSERT_EQ(::mkdir(theirs.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(theirs.c_str(), Runtime(tmp_->path()).c_str()), 0);
  Trap trap(theirs + "/tryboxd.sock");
  ExpectSquatRefused(tmp_->path(), trap, "it is a symbolic link");
}

TEST_F(CliHardeningE2E, SquattedRuntimeDirOfAnotherUserIsRefused) {
  ASSERT_EQ(::mkdir(Runtime(tmp_->path()).c_str(), 0700), 0);
  Trap trap(Runtime(tmp_->path()) + "/tryboxd.sock");
  ASSERT_EQ(::chown(Runtime(tmp_->path()).c_str(), 65534, 65534), 0);
  ExpectSquatRefused(tmp_->path(), trap, "it is owned by uid 65534");
}

TEST_F(CliHardeningE2E, SquattedRuntimeDirOpenToEveryoneIsRefused) {
  ASSERT_EQ(::mkdir(Runtime(tmp_->path()).c_str(), 0700), 0);
  ASSERT_EQ(::chmod(Runtime(tmp_->path()).c_str(), 0777), 0);
  Trap trap(Runtime(tmp_->path()) + "/tryboxd.sock");
  ExpectSquatRefused(tmp_->path(), trap, "its mode is 0777");
}

// The directory is ours, but the process on the socket runs as uid 65534 (it listened
// before the directory was ours, or it was handed the socket): refused, and it hears nothing.
TEST_F(CliHardeningE2E, SquattedDaemonOfAnotherUserIsRefusedAndHearsNothing) {
  ASSERT_EQ(::mkdir(Runtime(tmp_->path()).c_str(), 0700), 0);
  auto impostor =
      cli::testing::ForeignListener::Start(Runtime(tmp_->path()) + "/tryboxd.sock", 65534);
  ASSERT_TRUE(impostor.ok()) << impostor.status().ToString();
  CliResult r = RunProgram({BinDir() + "/trybox", "ls"}, XdgEnv(tmp_->path()));
  EXPECT_EQ(r.code, 125);
  EXPECT_NE(r.err.find("runs as uid 65534"), std::string::npos) << r.err;
  auto heard = (*impostor)->BytesHeard();
  ASSERT_TRUE(heard.ok()) << heard.status().ToString();
  EXPECT_EQ(*heard, 0) << "the impostor received the request";
}

// Secrets pass through tryboxd, so it makes itself non-dumpable (as ssh-agent does): a crash
// leaves no core file with whatever its heap held. TRYBOX_CORE_DUMPS=1 keeps dumps for
// debugging, and is also the control showing that this test sees a core file when there is
// one.
TEST(DaemonCoreDumpE2E, ACrashedDaemonLeavesNoCoreFileUnlessDumpsAreAskedFor) {
  auto pattern = ReadFileToString("/proc/sys/kernel/core_pattern");
  if (!pattern.ok() || *pattern != "core\n") {
    GTEST_SKIP() << "kernel.core_pattern is not 'core': the core file would not be in the "
                    "daemon's directory for this test to look at";
  }
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_CORE, &old), 0);
  rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
  if (::setrlimit(RLIMIT_CORE, &unlimited) != 0) {
    GTEST_SKIP() << "cannot raise RLIMIT_CORE here";
  }
  // A sanitized daemon (an e2e run from build-asan/) would catch the SIGSEGV itself and exit
  // without a core, as it disables dumps of its shadow memory: it leaves both to the kernel,
  // as a plain build does. Other builds ignore ASAN_OPTIONS.
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string asan_options =
      std::string("ASAN_OPTIONS=") + (asan ? asan : "") + ":handle_segv=0:disable_coredump=0";
  for (bool dumps : {false, true}) {
    SCOPED_TRACE(dumps ? "TRYBOX_CORE_DUMPS=1" : "default");
    auto h = Harness::Start(dumps ? std::vector<std::string>{"TRYBOX_CORE_DUMPS=1", asan_options}
                                  : std::vector<std::string>{asan_options});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    const pid_t pid = (*h)->daemon_pid();
    char cwd[4096];
    ssize_t n = ::readlink(("/proc/" + std::to_string(pid) + "/cwd").c_str(), cwd, sizeof cwd - 1);
    ASSERT_GT(n, 0);
    const std::string core = std::string(cwd, static_cast<size_t>(n)) + "/core";
    ::unlink(core.c_str());
    ASSERT_EQ(::kill(pid, SIGSEGV), 0);
    // The dump is written before the process becomes a zombie.
    for (int i = 0; i < 3000; ++i) {
      auto stat = ReadFileToString("/proc/" + std::to_string(pid) + "/stat");
      if (!stat.ok() || stat->find(") Z ") != std::string::npos) break;
      ::usleep(10000);
    }
    struct stat st {};
    bool found = ::stat(core.c_str(), &st) == 0;
    EXPECT_EQ(found, dumps) << core;
    ::unlink(core.c_str());
  }
  ::setrlimit(RLIMIT_CORE, &old);
}

}  // namespace
}  // namespace trybox::e2e
