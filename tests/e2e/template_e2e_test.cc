// End to end: templates. The first create of a shape saves a template; later VMs are
// clones restored from it, each a machine of its own; a changed image, a different QEMU,
// a corrupt or incomplete template are never used, and a create never fails because of
// them. Timing is the bench's business (bench/lifecycle_bench.cc), not these tests'.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/e2e/harness.h"
#include "util/fd.h"
#include "util/paths.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

std::string Line(const std::string& s) { return s.substr(0, s.find('\n')); }

struct Clone {
  std::string id, boot_id, machine_id, hostname, random, cmdline;
};

// Creates a VM and reads what makes a machine itself.
Clone CreateAndInspect(Harness& h, const std::vector<std::string>& flags = {}) {
  std::vector<std::string> args = {"create"};
  args.insert(args.end(), flags.begin(), flags.end());
  CliResult c = h.Cli(args);
  EXPECT_EQ(c.code, 0) << c.err;
  Clone out;
  out.id = Line(c.out);
  CliResult r = h.Cli({"exec", out.id, "--", "sh", "-c",
                       "cat /proc/sys/kernel/random/boot_id /etc/machine-id; hostname; "
                       "head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; "
                       "cat /proc/cmdline"});
  EXPECT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < r.out.size()) {
    size_t nl = r.out.find('\n', start);
    if (nl == std::string::npos) nl = r.out.size();
    lines.push_back(r.out.substr(start, nl - start));
    start = nl + 1;
  }
  EXPECT_EQ(lines.size(), 5u) << r.out;
  if (lines.size() == 5) {
    out.boot_id = lines[0];
    out.machine_id = lines[1];
    out.hostname = lines[2];
    out.random = lines[3];
    out.cmdline = lines[4];
  }
  return out;
}

bool Restored(const Clone& c) { return c.cmdline.find("trybox.template=1") != std::string::npos; }

Json TemplateOf(Harness& h) {
  CliResult r = h.Cli({"image", "ls", "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  Json list = Json::parse(r.out, nullptr, false);
  for (const auto& im : list) {
    if (im.value("name", "") == "debian-12") return im["template"];
  }
  ADD_FAILURE() << "debian-12 not listed: " << r.out;
  return Json();
}

// Polls `image ls` until the template is valid (a background rebuild), up to two minutes.
bool WaitForValidTemplate(Harness& h) {
  for (int i = 0; i < 240; ++i) {
    if (TemplateOf(h).value("state", "") == "valid") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return false;
}

std::string TemplateDir(Harness& h) { return h.home() + "/state/templates/debian-12-512m-1c-tcg"; }

class TemplateE2E : public ::testing::Test {
 protected:
  void TearDown() override {
    if (h_) {
      Status st = h_->StopDaemon();
      EXPECT_TRUE(st.ok()) << st.ToString();
      EXPECT_TRUE(h_->QemuPids().empty()) << "QEMU left running";
    }
  }
  void Start(std::vector<std::string> env = {}) {
    auto h = Harness::Start(std::move(env));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    h_ = std::move(*h);
  }
  std::unique_ptr<Harness> h_;
};

TEST_F(TemplateE2E, FirstCreateBuildsTheTemplateAndEveryCloneIsItsOwnMachine) {
  Start();
  // Before the daemon has chosen an accelerator the template's key cannot be known.
  EXPECT_EQ(TemplateOf(*h_).value("state", ""), "unknown");
  ASSERT_EQ(h_->Cli({"doctor"}).code, 0);
  EXPECT_EQ(TemplateOf(*h_).value("state", ""), "none");

  Clone a = CreateAndInspect(*h_);
  ASSERT_TRUE(Restored(a)) << "first VM was not restored: " << a.cmdline;
  EXPECT_EQ(TemplateOf(*h_).value("state", ""), "valid");
  CliResult doctor = h_->Cli({"doctor"});
  EXPECT_NE(doctor.out.find("template (512 MiB, 1 cpu): valid"), std::string::npos) << doctor.out;

  // The second comes from the spare pool or a fresh restore; both must be unique.
  Clone b = CreateAndInspect(*h_);
  Clone c = CreateAndInspect(*h_);
  for (const Clone* x : {&b, &c}) ASSERT_TRUE(Restored(*x)) << x->cmdline;
  const Clone* all[] = {&a, &b, &c};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(all[i]->hostname, "trybox-" + all[i]->id);
    EXPECT_EQ(all[i]->boot_id.size(), 36u) << all[i]->boot_id;
    EXPECT_EQ(all[i]->machine_id.size(), 32u) << all[i]->machine_id;
    EXPECT_EQ(all[i]->random.size(), 128u) << all[i]->random;
    for (int j = i + 1; j < 3; ++j) {
      EXPECT_NE(all[i]->boot_id, all[j]->boot_id);
      EXPECT_NE(all[i]->machine_id, all[j]->machine_id);
      EXPECT_NE(all[i]->hostname, all[j]->hostname);
      EXPECT_NE(all[i]->random, all[j]->random);
    }
  }

  // Disks: a file written in one clone is absent in another, and in a later one.
  ASSERT_EQ(h_->Cli({"exec", a.id, "--", "sh", "-c", "echo mine > /root/marker && sync"}).code, 0);
  CliResult in_b = h_->Cli({"exec", b.id, "--", "test", "-e", "/root/marker"});
  EXPECT_EQ(in_b.code, 1) << "a clone sees another clone's file";
  Clone d = CreateAndInspect(*h_);
  EXPECT_EQ(h_->Cli({"exec", d.id, "--", "test", "-e", "/root/marker"}).code, 1);
  EXPECT_EQ(h_->Cli({"exec", a.id, "--", "cat", "/root/marker"}).out, "mine\n");

  // The guest's clock is the host's, not the template's.
  CliResult date = h_->Cli({"exec", d.id, "--", "date", "+%s"});
  long guest = std::atol(date.out.c_str());
  long host = static_cast<long>(::time(nullptr));
  EXPECT_LT(std::labs(guest - host), 30) << date.out;
}

// A spare gets its identity when it is made; handing it out only sets its clock again, and
// says how far off the clock was.
TEST_F(TemplateE2E, ASpareIsHandedOutIdentifiedWithTheHostsClock) {
  Start();
  auto first = h_->Call({{"verb", "create"}});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(h_->WaitForSparePoolIdle().ok());
  auto r = h_->Call({{"verb", "create"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Json& vm = (*r)["vm"];
  ASSERT_EQ(vm["start"].value("spare", false), true) << vm.dump();
  const Json& phases = vm["phases_ms"];
  // Identified before the create (when the spare was made), the clock set at the hand-out.
  EXPECT_TRUE(phases.contains("identity_ms")) << phases.dump();
  EXPECT_TRUE(phases.contains("clock_ms")) << phases.dump();
  // What making it cost its QEMU in CPU, growing from phase to phase (template_bench).
  ASSERT_TRUE(phases.contains("cpu_at_hello_ms")) << phases.dump();
  ASSERT_TRUE(phases.contains("cpu_at_identified_ms")) << phases.dump();
  ASSERT_TRUE(phases.contains("cpu_at_ready_ms")) << phases.dump();
  EXPECT_GT(phases["cpu_at_hello_ms"].get<double>(), 0) << phases.dump();
  EXPECT_LE(phases["cpu_at_hello_ms"].get<double>(), phases["cpu_at_identified_ms"].get<double>());
  EXPECT_LE(phases["cpu_at_identified_ms"].get<double>(), phases["cpu_at_ready_ms"].get<double>())
      << phases.dump();
  ASSERT_TRUE(phases.contains("clock_offset_ms")) << phases.dump();
  EXPECT_LT(std::fabs(phases["clock_offset_ms"].get<double>()), 2000) << phases.dump();
  EXPECT_EQ(vm.value("boot_id", "").size(), 36u) << vm.dump();
  const std::string id = vm["id"];
  // Its QEMU's malloc asked for huge pages (QemuEnvironment): the tunable is in its
  // environment, and where the host's THP mode is madvise, glibc advised its heap (VmFlags
  // "hg"). Under "always" or "never" glibc advises nothing, so only the first is checked.
  auto pid = ReadFileToString(h_->vms_dir() + "/" + id + "/qemu.pid");
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();
  const std::string proc = "/proc/" + std::string(pid->c_str()) + "/";
  auto environ_text = ReadFileToString(proc + "environ");
  ASSERT_TRUE(environ_text.ok()) << environ_text.status().ToString();
  EXPECT_NE(environ_text->find(std::string("GLIBC_TUNABLES=glibc.malloc.hugetlb=1\0", 38)),
            std::string::npos);
  auto thp = ReadFileToString("/sys/kernel/mm/transparent_hugepage/enabled");
  if (thp.ok() && thp->find("[madvise]") != std::string::npos) {
    auto smaps = ReadFileToString(proc + "smaps");
    ASSERT_TRUE(smaps.ok()) << smaps.status().ToString();
    // The heap may be split where later growth was advised apart; any part will do.
    bool advised = false;
    for (size_t heap = smaps->find("[heap]"); heap != std::string::npos && !advised;
         heap = smaps->find("[heap]", heap + 1)) {
      size_t flags = smaps->find("VmFlags:", heap);
      if (flags == std::string::npos) break;
      advised =
          smaps->substr(flags, smaps->find('\n', flags) - flags).find(" hg") != std::string::npos;
    }
    EXPECT_TRUE(advised) << "QEMU's heap was not advised for huge pages";
  }
  EXPECT_EQ(h_->Cli({"exec", id, "--", "hostname"}).out, "trybox-" + id + "\n");
  struct timespec before, after;
  ::clock_gettime(CLOCK_REALTIME, &before);
  CliResult date = h_->Cli({"exec", id, "--", "date", "+%s.%N"});
  ::clock_gettime(CLOCK_REALTIME, &after);
  ASSERT_EQ(date.code, 0) << date.err;
  double guest = std::atof(date.out.c_str());
  EXPECT_GT(guest, before.tv_sec + before.tv_nsec / 1e9 - 1) << date.out;
  EXPECT_LT(guest, after.tv_sec + after.tv_nsec / 1e9 + 1) << date.out;
}

TEST_F(TemplateE2E, ColdFlagBootsTheKernel) {
  Start();
  Clone cold = CreateAndInspect(*h_, {"--cold"});
  EXPECT_FALSE(Restored(cold)) << cold.cmdline;
  EXPECT_NE(cold.cmdline.find("trybox.vmid=" + cold.id), std::string::npos) << cold.cmdline;
  EXPECT_EQ(cold.hostname, "trybox-" + cold.id);
  // --cold neither needs nor builds a template.
  EXPECT_EQ(TemplateOf(*h_).value("state", ""), "none");
  CliResult run = h_->Cli({"run", "--cold", "--", "cat", "/proc/cmdline"});
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(run.out.find("trybox.template"), std::string::npos) << run.out;
}

TEST_F(TemplateE2E, ImageChangeAndQemuChangeRebuildTheTemplate) {
  // A private copy of the image (hard links: image files are frozen, never written).
  auto dir = TempDir::Make("/tmp", "tbx-img-");  // removed however the test ends
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const std::string images = dir->path();
  // QEMU may run as a uid of its own (root daemon): it must be able to run the wrapper.
  ASSERT_EQ(::chmod(images.c_str(), 0755), 0);
  const std::string shared = Paths::FromEnvironment().images + "/debian-12";
  ASSERT_TRUE(RunChecked({"cp", "-al", shared, images + "/debian-12"}).ok());
  // A QEMU that reports another version: a wrapper the test can switch.
  const std::string qemu = images + "/qemu";
  const std::string version_file = images + "/version";
  ASSERT_TRUE(WriteFileAtomic(version_file, "QEMU emulator version 7.2.22 (trybox test A)\n").ok());
  ASSERT_TRUE(WriteFileAtomic(qemu,
                              "#!/bin/sh\n"
                              "if [ \"$1\" = --version ]; then cat " +
                                  version_file +
                                  "; exit 0; fi\n"
                                  "exec qemu-system-x86_64 \"$@\"\n",
                              0755)
                  .ok());
  Start({"TRYBOX_IMAGES=" + images, "TRYBOX_SPARES=0", "TRYBOX_QEMU=" + qemu});

  ASSERT_TRUE(Restored(CreateAndInspect(*h_)));
  Json meta =
      Json::parse(ReadFileToString(TemplateDir(*h_) + "/meta.json").value_or(""), nullptr, false);
  ASSERT_TRUE(meta.is_object());
  const std::string first_key = meta.value("key", "");

  // The image is rebuilt: a new manifest (same parts, so it still verifies).
  const std::string manifest = images + "/debian-12/manifest.json";
  Json m = Json::parse(ReadFileToString(manifest).value_or(""), nullptr, false);
  m["created"] = "2030-01-01T00:00:00Z";
  ASSERT_EQ(::unlink(manifest.c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(manifest, m.dump(2), 0444).ok());
  Json t = TemplateOf(*h_);
  EXPECT_EQ(t.value("state", ""), "stale");
  EXPECT_EQ(t.value("reason", ""), "the image changed");
  ASSERT_TRUE(Restored(CreateAndInspect(*h_)));
  meta =
      Json::parse(ReadFileToString(TemplateDir(*h_) + "/meta.json").value_or(""), nullptr, false);
  const std::string second_key = meta.value("key", "");
  EXPECT_NE(second_key, first_key);

  // QEMU is upgraded under the running daemon.
  ASSERT_TRUE(WriteFileAtomic(version_file, "QEMU emulator version 7.2.23 (trybox test B)\n").ok());
  // An upgrade replaces the binary: a new file, a new mtime.
  ASSERT_TRUE(WriteFileAtomic(qemu, ReadFileToString(qemu).value_or(""), 0755).ok());
  CliResult doctor = h_->Cli({"doctor"});
  EXPECT_NE(doctor.out.find("stale (QEMU changed"), std::string::npos) << doctor.out;
  ASSERT_TRUE(Restored(CreateAndInspect(*h_)));
  meta =
      Json::parse(ReadFileToString(TemplateDir(*h_) + "/meta.json").value_or(""), nullptr, false);
  EXPECT_NE(meta.value("key", ""), second_key);
  EXPECT_EQ(meta["inputs"].value("qemu_version", ""),
            "QEMU emulator version 7.2.23 (trybox test B)");
  EXPECT_TRUE(h_->StopDaemon().ok());
  EXPECT_TRUE(h_->QemuPids().empty());
  h_.reset();
}

TEST_F(TemplateE2E, CorruptStateFallsBackToColdAndIsRebuilt) {
  Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(Restored(CreateAndInspect(*h_)));
  const std::string state = TemplateDir(*h_) + "/state";
  struct stat st;
  ASSERT_EQ(::stat(state.c_str(), &st), 0);
  ASSERT_TRUE(WriteFileAtomic(state, std::string(static_cast<size_t>(st.st_size), 'x')).ok());

  CliResult c = h_->Cli({"create"});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.err.find("the template failed to restore"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("booted cold"), std::string::npos) << c.err;
  const std::string id = Line(c.out);
  CliResult cmdline = h_->Cli({"exec", id, "--", "cat", "/proc/cmdline"});
  EXPECT_EQ(cmdline.code, 0);
  EXPECT_EQ(cmdline.out.find("trybox.template"), std::string::npos) << "fell back, yet restored?";

  // Discarded and rebuilt in the background; the next create restores again.
  ASSERT_TRUE(WaitForValidTemplate(*h_));
  EXPECT_TRUE(Restored(CreateAndInspect(*h_)));
}

TEST_F(TemplateE2E, MissingDiskLayerIsRebuiltNotUsed) {
  Start({"TRYBOX_SPARES=0"});
  ASSERT_TRUE(Restored(CreateAndInspect(*h_)));
  ASSERT_EQ(::unlink((TemplateDir(*h_) + "/disk.qcow2").c_str()), 0);
  Json t = TemplateOf(*h_);
  EXPECT_EQ(t.value("state", ""), "stale");
  EXPECT_EQ(t.value("reason", ""), "its disk layer is missing");
  CliResult c = h_->Cli({"create"});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(c.err, "") << "a missing layer is rebuilt before use, with nothing to report";
  CliResult cmdline = h_->Cli({"exec", Line(c.out), "--", "cat", "/proc/cmdline"});
  EXPECT_NE(cmdline.out.find("trybox.template=1"), std::string::npos) << cmdline.out;
  EXPECT_EQ(TemplateOf(*h_).value("state", ""), "valid");
}

}  // namespace
}  // namespace trybox::e2e
