// The host-wide disk budget (issue 18, "bounded growth"; docs/security.md, "Disk"): a VM
// whose disk grows past it is destroyed, a create past the free-space reserve is refused,
// and neither touches another VM.
#include <gtest/gtest.h>

#include <string>

#include "tests/e2e/harness.h"

namespace trybox::e2e {
namespace {

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

TEST(DiskBudgetE2E, AVmWritingPastTheBudgetIsDestroyedAndItsNeighbourCarriesOn) {
  auto h = Harness::Start({"TRYBOX_DISK_BUDGET_MIB=96"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult a = (*h)->Cli({"create"});
  ASSERT_EQ(a.code, 0) << a.err;
  CliResult b = (*h)->Cli({"create"});
  ASSERT_EQ(b.code, 0) << b.err;
  const std::string big = FirstLine(a.out), small = FirstLine(b.out);

  // Under the budget together: both keep running.
  CliResult w =
      (*h)->Cli({"exec", small, "--", "sh", "-c", "head -c 8M /dev/urandom > /root/s && sync"});
  ASSERT_EQ(w.code, 0) << w.err;
  // Past it: the exec itself ends as it ended (its result is the guest's), then its VM goes.
  w = (*h)->Cli({"exec", big, "--", "sh", "-c", "head -c 120M /dev/urandom > /root/b && sync"});
  EXPECT_EQ(w.code, 0) << w.err;
  CliResult again = (*h)->Cli({"exec", big, "--", "true"});
  EXPECT_EQ(again.code, 125);
  EXPECT_NE(again.err.find("disk budget of 96.0 MiB"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("--disk-budget"), std::string::npos) << again.err;
  CliResult ls = (*h)->Cli({"ls"});
  EXPECT_EQ(ls.out.find(big), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find(small), std::string::npos) << ls.out;
  // The neighbour still works, and its file is intact; a new VM fits again.
  CliResult s = (*h)->Cli({"exec", small, "--", "stat", "-c", "%s", "/root/s"});
  EXPECT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(s.out, std::to_string(8 << 20) + "\n");
  CliResult c = (*h)->Cli({"run", "--", "true"});
  EXPECT_EQ(c.code, 0) << c.err;
  (void)(*h)->Cli({"rm", small});
}

TEST(DiskBudgetE2E, ACreateBelowTheFreeSpaceReserveIsRefusedBeforeAnythingBoots) {
  // More free space than any disk has: every create is refused, naming the reserve.
  auto h = Harness::Start({"TRYBOX_DISK_RESERVE_MIB=1073741824"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  CliResult r = (*h)->Cli({"run", "--", "true"});
  EXPECT_EQ(r.code, 125);
  EXPECT_NE(r.err.find("--disk-reserve"), std::string::npos) << r.err;
  CliResult ls = (*h)->Cli({"ls", "--json"});
  EXPECT_EQ(ls.out, "[]\n") << ls.out;
}

}  // namespace
}  // namespace trybox::e2e
