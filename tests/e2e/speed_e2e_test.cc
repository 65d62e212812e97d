// End to end, issue 20 ("speed as users feel it"): what the speed work promises, checked
// for function, never for time. Real tryboxd, real CLI, real guests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tests/e2e/harness.h"
#include "util/fd.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

// The nice value of process `pid` (field 19 of /proc/PID/stat), or -100 if it is gone.
int NiceOf(pid_t pid) {
  auto stat = ReadFileToString("/proc/" + std::to_string(pid) + "/stat");
  if (!stat.ok()) return -100;
  std::istringstream fields(stat->substr(stat->rfind(')') + 2));
  std::string f;
  for (int i = 3; i <= 19 && fields >> f; ++i) {
  }
  return std::stoi(f);
}

std::string CreateVm(Harness& h, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"create"};
  args.insert(args.end(), extra.begin(), extra.end());
  CliResult r = h.Cli(args);
  EXPECT_EQ(r.code, 0) << r.err;
  return r.out.substr(0, r.out.find('\n'));
}

// A create that waits shows what it waits for: the template build of a fresh daemon, a cold
// boot. --quiet shows nothing. (The CLI prints only to a terminal unless TRYBOX_PROGRESS
// says otherwise, as here.)
TEST(SpeedE2E, ProgressIsPrintedForLongStepsAndNotWithQuiet) {
  auto h = Harness::Start({"TRYBOX_PROGRESS=always", "TRYBOX_SPARES=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult first = (*h)->Cli({"run", "--", "true"});
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.err.find("trybox: building the debian-12 template"), std::string::npos)
      << first.err;
  CliResult cold = (*h)->Cli({"run", "--cold", "--", "true"});
  ASSERT_EQ(cold.code, 0) << cold.err;
  EXPECT_NE(cold.err.find("trybox: booting the kernel"), std::string::npos) << cold.err;
  CliResult quiet = (*h)->Cli({"run", "--cold", "--quiet", "--", "true"});
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
}

// The acceleration probe runs once per host, QEMU, CPU and kernel: a restarted daemon
// reuses its answer, and `doctor --probe` asks again.
TEST(SpeedE2E, TheProbesAnswerOutlivesTheDaemon) {
  auto h = Harness::Start();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  auto first = (*h)->Call({{"verb", "doctor"}});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string reason = (*first)["accel"]["reason"];
  EXPECT_EQ(reason.find("earlier probe"), std::string::npos) << reason;
  auto kept = ReadFileToString((*h)->home() + "/state/accel.json");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  Json file = Json::parse(*kept, nullptr, false);
  ASSERT_TRUE(file.is_object());
  EXPECT_EQ(file["accel"], (*first)["accel"]["accel"]);
  EXPECT_TRUE(file["key"].contains("qemu_version")) << file.dump();

  ASSERT_TRUE((*h)->StopDaemon().ok());
  ASSERT_TRUE((*h)->RestartDaemon().ok());
  auto again = (*h)->Call({{"verb", "doctor"}});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)["accel"]["accel"], (*first)["accel"]["accel"]);
  EXPECT_NE((*again)["accel"]["reason"].get<std::string>().find("earlier probe"),
            std::string::npos);

  CliResult probe = (*h)->Cli({"doctor", "--probe"});
  ASSERT_EQ(probe.code, 0) << probe.err;
  EXPECT_EQ(probe.out.find("earlier probe"), std::string::npos) << probe.out;
  EXPECT_NE(probe.out.find("acceleration: " + (*first)["accel"]["accel"].get<std::string>()),
            std::string::npos)
      << probe.out;
}

// Three creates ask for three spares (within the budget); they are prepared at a lower CPU
// priority, and a spare handed out runs at normal priority. doctor shows the pool.
TEST(SpeedE2E, TheSparePoolGrowsWithDemandAndHandsOutSparesAtNormalPriority) {
  auto h = Harness::Start({"TRYBOX_SPARE_MEMORY_MIB=1024"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(CreateVm(**h, {"--memory", "256"}));
  ASSERT_TRUE((*h)->WaitForSparePoolIdle().ok());
  auto d = (*h)->Call({{"verb", "doctor"}});
  ASSERT_TRUE(d.ok());
  const Json& pool = (*d)["spare_pool"];
  ASSERT_EQ(pool["shapes"].size(), 1u) << pool.dump();
  const Json& shape = pool["shapes"].begin().value();
  EXPECT_EQ(shape["recent_creates"], 3);
  EXPECT_EQ(shape["target"], 3);
  EXPECT_EQ(shape["ready"], 3) << pool.dump();
  EXPECT_EQ(pool["used_mib"], 3 * 256);
  CliResult text = (*h)->Cli({"doctor"});
  EXPECT_NE(text.out.find("3 ready, 0 refilling, target 3"), std::string::npos) << text.out;

  // The VMs' QEMUs, and the spares' (the others).
  CliResult ls = (*h)->Cli({"ls", "--json"});
  std::vector<pid_t> vm_pids;
  for (const auto& v : Json::parse(ls.out)) vm_pids.push_back(v["pid"].get<pid_t>());
  ASSERT_EQ(vm_pids.size(), 3u);
  int spares = 0;
  const int refill_nice = pool["refill_nice"];
  for (pid_t p : (*h)->QemuPids()) {
    bool is_vm = std::find(vm_pids.begin(), vm_pids.end(), p) != vm_pids.end();
    EXPECT_EQ(NiceOf(p), is_vm ? 0 : refill_nice) << (is_vm ? "VM " : "spare ") << p;
    spares += !is_vm;
  }
  EXPECT_EQ(spares, 3);
  // The first create took no spare; the next ones may have. A VM made from a spare that was
  // prepared at low priority runs at normal priority now (checked above for all three).
  for (const auto& id : ids) EXPECT_EQ((*h)->Cli({"rm", id}).code, 0);
}

}  // namespace
}  // namespace trybox::e2e
