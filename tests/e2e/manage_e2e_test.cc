// A daemon you can manage, admission, and no debris (issue 19): `trybox daemon
// status|stop|reload`, the VM cap and the memory check, the acceleration probe of a killed
// daemon, and an interrupted copy out.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/process.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Pids of processes whose command line has both `a` and `b` (zombies have none).
std::vector<pid_t> ProcessesNaming(const std::string& a, const std::string& b) {
  std::vector<pid_t> out;
  for (pid_t p : FindProcesses(a)) {
    if (ProcessCmdline(p).find(b) != std::string::npos) out.push_back(p);
  }
  return out;
}

size_t CountEntries(const std::string& dir) {
  size_t n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ++n;
    }
    ::closedir(d);
  }
  return n;
}

void WriteEgressConfig(const Harness& h, const Json& config) {
  ASSERT_TRUE(MakeDirs(h.home() + "/config", 0700).ok());
  ASSERT_TRUE(WriteFileAtomic(h.home() + "/config/egress.json", config.dump()).ok());
}

// The first response line and reason the guest's egress proxy gives for CONNECT host:80.
CliResult ConnectFrom(const Harness& h, const std::string& vm, const std::string& host) {
  std::string script = "exec 3<>/dev/tcp/127.0.0.1/3128; printf 'CONNECT " + host +
                       ":80 HTTP/1.1\\r\\nHost: " + host +
                       ":80\\r\\n\\r\\n' >&3; timeout 20 cat <&3 | tr -d '\\r' | head -5";
  return h.Cli({"exec", vm, "--", "bash", "-c", script});
}

TEST(ManageE2E, StatusNamesPidVersionUptimeVmsSparesAndStore) {
  auto h = Harness::Start({"TRYBOX_MAX_VMS=7"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult r = (*h)->Cli({"daemon", "status", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  Json s = Json::parse(r.out);
  EXPECT_EQ(s["pid"], (*h)->daemon_pid());
  CliResult v = (*h)->Cli({"--version"});
  ASSERT_EQ(v.code, 0);
  EXPECT_EQ("trybox " + s["version"].get<std::string>(), FirstLine(v.out));
  EXPECT_GE(s["uptime_s"].get<int64_t>(), 0);
  EXPECT_EQ(s["vms"], 0);
  EXPECT_TRUE(s["spares"].is_object());
  EXPECT_EQ(s["store"]["path"], (*h)->home() + "/state/trybox.db");
  EXPECT_GT(s["store"]["bytes"].get<int64_t>(), 0);
  EXPECT_EQ(s["limits"]["max_vms"], 7);
  CliResult text = (*h)->Cli({"daemon", "status"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("tryboxd: pid " + std::to_string((*h)->daemon_pid())), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("at most 7 VMs"), std::string::npos) << text.out;
  CliResult doctor = (*h)->Cli({"doctor"});
  EXPECT_NE(doctor.out.find("version " + s["version"].get<std::string>()), std::string::npos)
      << doctor.out;
}

TEST(ManageE2E, ReloadGivesNewVmsTheNewProfileAndRunningOnesKeepTheirs) {
  auto h = Harness::Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  // Both names resolve to an address egress refuses: a VM allowed the name is refused for
  // the address, one not allowed it for the name.
  Json resolve = {{"one.test", {"127.0.0.1"}}, {"two.test", {"127.0.0.1"}}};
  WriteEgressConfig(**h, {{"resolve", resolve}, {"profiles", {{"p", {"one.test:80"}}}}});
  CliResult reload = (*h)->Cli({"daemon", "reload"});
  ASSERT_EQ(reload.code, 0) << reload.err;
  EXPECT_NE(reload.out.find("profiles.p"), std::string::npos) << reload.out;
  CliResult a = (*h)->Cli({"create", "--profile", "p"});
  ASSERT_EQ(a.code, 0) << a.err;
  const std::string old_vm = FirstLine(a.out);

  WriteEgressConfig(**h, {{"resolve", resolve}, {"profiles", {{"p", {"two.test:80"}}}}});
  reload = (*h)->Cli({"daemon", "reload"});
  ASSERT_EQ(reload.code, 0) << reload.err;
  EXPECT_NE(reload.out.find("changed profiles.p"), std::string::npos) << reload.out;
  EXPECT_NE(reload.out.find("the 1 running VM keep"), std::string::npos) << reload.out;
  CliResult b = (*h)->Cli({"create", "--profile", "p"});
  ASSERT_EQ(b.code, 0) << b.err;
  const std::string new_vm = FirstLine(b.out);

  // The running VM was not touched, and still has the old list.
  CliResult old_two = ConnectFrom(**h, old_vm, "two.test");
  EXPECT_EQ(old_two.code, 0) << old_two.err;
  EXPECT_NE(old_two.out.find("403"), std::string::npos) << old_two.out;
  EXPECT_EQ(old_two.out.find("refused addresses"), std::string::npos) << old_two.out;
  CliResult old_one = ConnectFrom(**h, old_vm, "one.test");
  EXPECT_NE(old_one.out.find("refused addresses"), std::string::npos) << old_one.out;
  // The new VM has the new one.
  CliResult new_two = ConnectFrom(**h, new_vm, "two.test");
  EXPECT_NE(new_two.out.find("refused addresses"), std::string::npos) << new_two.out;
  CliResult new_one = ConnectFrom(**h, new_vm, "one.test");
  EXPECT_EQ(new_one.out.find("refused addresses"), std::string::npos) << new_one.out;

  // A broken file is refused and the settings in force stay.
  ASSERT_TRUE(WriteFileAtomic((*h)->home() + "/config/egress.json", "{\"profiles\": 3}").ok());
  reload = (*h)->Cli({"daemon", "reload"});
  EXPECT_NE(reload.code, 0);
  EXPECT_NE(reload.err.find("egress.json"), std::string::npos) << reload.err;
  CliResult c = (*h)->Cli({"create", "--profile", "p"});
  EXPECT_EQ(c.code, 0) << c.err;
}

TEST(ManageE2E, StopDestroysEveryVmAndLeavesNoQemu) {
  auto h = Harness::Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult a = (*h)->Cli({"create"});
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_FALSE((*h)->QemuPids().empty());
  CliResult stop = (*h)->Cli({"daemon", "stop"});
  ASSERT_EQ(stop.code, 0) << stop.err;
  EXPECT_NE(stop.out.find("1 VM destroyed"), std::string::npos) << stop.out;
  // `stop` returns once the daemon has exited: nothing of it is left.
  EXPECT_TRUE((*h)->QemuPids().empty());
  EXPECT_NE(::access((*h)->socket().c_str(), F_OK), 0);
  CliResult status = (*h)->Cli({"daemon", "status"});
  EXPECT_EQ(status.code, 3) << status.out << status.err;
  EXPECT_NE(status.err.find("not running"), std::string::npos) << status.err;
}

TEST(ManageE2E, TheVmCapRefusesACreateWithTooManyVms) {
  auto h = Harness::Start({"TRYBOX_MAX_VMS=1", "TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult a = (*h)->Cli({"create"});
  ASSERT_EQ(a.code, 0) << a.err;
  CliResult b = (*h)->Cli({"create"});
  EXPECT_EQ(b.code, 125);
  EXPECT_NE(b.err.find("too_many_vms"), std::string::npos) << b.err;
  auto reply = (*h)->Call({{"verb", "create"}});
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), Code::kResourceExhausted);
  // Nothing half-booted: one VM, one QEMU.
  EXPECT_EQ((*h)->QemuPids().size(), 1u);
  CliResult rm = (*h)->Cli({"rm", FirstLine(a.out)});
  ASSERT_EQ(rm.code, 0) << rm.err;
  CliResult c = (*h)->Cli({"create"});
  EXPECT_EQ(c.code, 0) << c.err;
}

TEST(ManageE2E, TooLittleMemoryRefusesACreateWithInsufficientMemory) {
  // A reserve larger than any host's MemAvailable.
  auto h = Harness::Start({"TRYBOX_MEMORY_RESERVE_MIB=1073741824"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult a = (*h)->Cli({"create"});
  EXPECT_EQ(a.code, 125);
  EXPECT_NE(a.err.find("insufficient_memory"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("TRYBOX_MEMORY_RESERVE_MIB"), std::string::npos) << a.err;
  EXPECT_TRUE((*h)->QemuPids().empty());
  CliResult ls = (*h)->Cli({"ls", "--json"});
  EXPECT_EQ(Json::parse(ls.out).size(), 0u) << ls.out;
}

TEST(ManageE2E, AProbeLeftByAKilledDaemonIsReapedByTheNextOne) {
  int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "no usable /dev/kvm: the probe boots nothing";
  ::close(fd);
  auto dir = TempDir::Make("/tmp", "tbx-probe");
  ASSERT_TRUE(dir.ok());
  // A QEMU whose probe never ends (a hung KVM); anything else goes to the real one.
  std::string qemu = dir->path() + "/hang-qemu";
  ASSERT_TRUE(WriteFileAtomic(qemu,
                              "#!/bin/sh\ncase \"$*\" in *trybox.probe=1*) while :; do sleep 1; "
                              "done;; esac\nexec qemu-system-x86_64 \"$@\"\n",
                              0755)
                  .ok());
  auto h = Harness::Start({"TRYBOX_QEMU=" + qemu});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  std::thread doctor([&] { (void)(*h)->Cli({"doctor", "--probe"}); });
  std::vector<pid_t> probes;
  for (int i = 0; i < 3000 && probes.empty(); ++i) {
    probes = ProcessesNaming("trybox.probe=1", (*h)->home());
    if (probes.empty()) ::usleep(10000);
  }
  // The wrapper's shell may be caught forking its `sleep` (the child names the probe too until
  // it execs), so one or more; and the doctor thread is joined before any failure returns.
  (*h)->CrashDaemon();
  doctor.join();
  ASSERT_FALSE(probes.empty()) << "no probe started";
  // The probe dies with its daemon (SpawnOptions::die_with_process, issue 51.10); a probe
  // that did not (a daemon from before) is reaped by the next daemon before it listens.
  for (int i = 0; i < 300 && !ProcessesNaming("trybox.probe=1", (*h)->home()).empty(); ++i) {
    ::usleep(100000);
  }
  EXPECT_TRUE(ProcessesNaming("trybox.probe=1", (*h)->home()).empty())
      << "the probe outlived its killed daemon";
  ASSERT_TRUE((*h)->RestartDaemon().ok());
  auto left = ProcessesNaming("trybox.probe=1", (*h)->home());
  EXPECT_TRUE(left.empty());
  for (pid_t p : left) ::kill(-p, SIGKILL);
}

TEST(ManageE2E, CollectStagingLeftByAKilledDaemonIsRemovedAtStart) {
  auto h = Harness::Start();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  (*h)->CrashDaemon();
  // What a daemon killed mid-collect leaves: its staging tree under state/collect.
  std::string staging = (*h)->home() + "/state/collect/vm1-abc123";
  ASSERT_TRUE(MakeDirs(staging + "/src", 0700).ok());
  ASSERT_TRUE(WriteFileAtomic(staging + "/src/main.c", "int main() {}\n").ok());
  ASSERT_TRUE((*h)->RestartDaemon().ok());
  EXPECT_NE(::access(staging.c_str(), F_OK), 0) << staging << " is still there";
}

// A daemon killed while a collect builds its commit: the commit's objects were kept in a
// quarantine inside the user's repository, named by a marker in state/collect. The next
// daemon removes both: the repository gains no object, no branch and no directory.
TEST(ManageE2E, ACollectKilledWhileItCommitsLeavesNothingInTheRepository) {
  auto h = Harness::Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  auto tmp = TempDir::Make("/tmp", "tbx-collect-kill-");
  ASSERT_TRUE(tmp.ok());
  const std::string home = tmp->path() + "/home", repo = tmp->path() + "/repo";
  ASSERT_TRUE(MakeDirs(home).ok());
  auto git = [&](const std::string& script) {
    auto r = RunCommand({"env", "HOME=" + home, "sh", "-c", "cd '" + repo + "' && " + script},
                        std::chrono::seconds(60));
    EXPECT_TRUE(r.ok() && r->exit.exited && r->exit.code == 0)
        << script << ": " << (r.ok() ? r->output : r.status().ToString());
    return r.ok() ? r->output : "";
  };
  ASSERT_TRUE(MakeDirs(repo).ok());
  git("git init -q -b main . && git config user.email t@t && git config user.name t && "
      "echo one > a.txt && git add -A && git commit -qm init");
  const std::string objects_before = git("git count-objects -v | grep -E '^(count|in-pack):'");
  CliResult c = (*h)->Cli({"create", "--workspace", repo});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = FirstLine(c.out);
  // Enough new files that writing their blobs takes a while.
  CliResult w = (*h)->Cli({"exec", vm, "--", "sh", "-c",
                           "cd /workspace && mkdir d && i=0; while [ $i -lt 3000 ]; do "
                           "echo \"file $i\" > d/f$i.txt; i=$((i+1)); done"});
  ASSERT_EQ(w.code, 0) << w.err;

  const std::string collect_dir = (*h)->home() + "/state/collect";
  std::thread collect([&] { (void)(*h)->Cli({"collect", vm}); });
  std::string marker;
  for (int i = 0; i < 120000 && marker.empty(); ++i) {
    auto names = ListDir(collect_dir);
    for (const auto& n : names.ok() ? *names : std::vector<std::string>{}) {
      if (n.size() > 11 && n.compare(n.size() - 11, 11, ".quarantine") == 0) {
        marker = collect_dir + "/" + n;
      }
    }
    if (marker.empty()) ::usleep(1000);
  }
  (*h)->CrashDaemon();
  collect.join();
  ASSERT_FALSE(marker.empty()) << "the collect never reached its commit";
  auto named = ReadFileToString(marker);
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  const std::string quarantine = named->substr(0, named->find('\n'));
  EXPECT_EQ(quarantine.rfind(repo + "/.git/objects/incoming-trybox-", 0), 0u) << quarantine;

  ASSERT_TRUE((*h)->RestartDaemon().ok());
  EXPECT_NE(::access(marker.c_str(), F_OK), 0) << marker;
  EXPECT_NE(::access(quarantine.c_str(), F_OK), 0) << quarantine;
  EXPECT_EQ(git("ls .git/objects | grep -c incoming || true"), "0\n");
  EXPECT_EQ(git("git count-objects -v | grep -E '^(count|in-pack):'"), objects_before);
  EXPECT_EQ(git("git fsck --no-reflogs --unreachable 2>&1"), "");
  EXPECT_EQ(git("git branch --list 'trybox/*'"), "");
  EXPECT_EQ(git("git status --porcelain"), "");
  // The collect cut off by the crash has its row, named (issue 51.15).
  auto diff = (*h)->Call({{"verb", "diff"}, {"vm", vm}});
  ASSERT_TRUE(diff.ok()) << diff.status().ToString();
  EXPECT_EQ((*diff)["collect"]["outcome"], "interrupted") << diff->dump(2);
  EXPECT_NE((*diff)["collect"]["error"].get<std::string>().find("daemon ended"), std::string::npos)
      << diff->dump(2);
}

// A template build on a nearly full disk died of SIGBUS (QEMU's sparse memory file).
TEST(ManageE2E, ATemplateBuildOnANearlyFullDiskSaysNoSpace) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  auto h = Harness::Start({"TRYBOX_SPARES=0", "TRYBOX_DISK_RESERVE_MIB=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE((*h)->StopDaemon().ok());
  // Room for the store and a cold VM's layer, not for a 512 MiB template.
  std::string state = (*h)->home() + "/state";
  ASSERT_TRUE(RemoveTree(state).ok());
  ASSERT_TRUE(MakeDirs(state, 0700).ok());
  if (::mount("tmpfs", state.c_str(), "tmpfs", 0, "size=200m,mode=0700") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{state};
  ASSERT_TRUE((*h)->RestartDaemon().ok());
  auto r = (*h)->Call({{"verb", "create"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::string note = (*r)["vm"]["start"].value("note", "");
  EXPECT_EQ((*r)["vm"]["start"]["mode"], "cold") << r->dump();
  EXPECT_NE(note.find("no_space"), std::string::npos) << note;
  // Once there is room, the same daemon builds the template and restores from it.
  ASSERT_TRUE((*h)->Call({{"verb", "destroy"}, {"vm", (*r)["vm"]["id"]}}).ok());
  ASSERT_EQ(::mount("tmpfs", state.c_str(), "tmpfs", MS_REMOUNT, "size=3g,mode=0700"), 0)
      << std::strerror(errno);
  auto room = (*h)->Call({{"verb", "create"}});
  ASSERT_TRUE(room.ok()) << room.status().ToString();
  EXPECT_EQ((*room)["vm"]["start"]["mode"], "restored") << room->dump();
  EXPECT_EQ((*room)["vm"]["start"]["template"]["built"], true) << room->dump();
  EXPECT_TRUE((*h)->StopDaemon().ok());
}

TEST(ManageE2E, AnInterruptedCopyOutLeavesNoPartialTree) {
  auto h = Harness::Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult a = (*h)->Cli({"create"});
  ASSERT_EQ(a.code, 0) << a.err;
  const std::string vm = FirstLine(a.out);
  CliResult fill = (*h)->Cli(
      {"exec", vm, "--", "sh", "-c",
       "mkdir /root/tree && for i in $(seq 200); do head -c 1M /dev/urandom > /root/tree/f$i; "
       "done"});
  ASSERT_EQ(fill.code, 0) << fill.err;
  auto out = TempDir::Make("/tmp", "tbx-cpout");
  ASSERT_TRUE(out.ok());
  const std::string dst = out->path() + "/tree";
  SpawnOptions o;
  o.argv = {BinDir() + "/trybox", "cp", vm + ":/root/tree", dst};
  o.env = (*h)->Env();
  auto cp = ChildProcess::Spawn(o);
  ASSERT_TRUE(cp.ok());
  // Killed as soon as anything of the copy shows in the destination's directory.
  auto entries = [&] { return CountEntries(out->path()); };
  for (int i = 0; i < 6000 && entries() == 0; ++i) ::usleep(5000);
  (void)cp->Signal(SIGKILL);
  (void)cp->Wait();
  // The cleaner the CLI left behind removes its temporary tree; nothing ever lands at dst.
  for (int i = 0; i < 1000 && entries() > 0; ++i) ::usleep(10000);
  EXPECT_NE(::access(dst.c_str(), F_OK), 0) << "a partial tree was left at " << dst;
  EXPECT_EQ(entries(), 0u);
}

}  // namespace
}  // namespace trybox::e2e
