#include "image/debs.h"

#include <gtest/gtest.h>

namespace trybox::image {
namespace {

TEST(DebsTest, SimulationGivesThePackagesAndTheirFileNamesInAptsOrder) {
  const std::string out =
      "Reading package lists...\n"
      "The following NEW packages will be installed:\n"
      "  jq libjq1 libonig5\n"
      "Inst libonig5 (6.9.8-1 Debian:12.5/stable [amd64])\n"
      "Inst libjq1 (1.6-2.1 Debian:12.5/stable [amd64])\n"
      "Inst jq (1.6-2.1 Debian:12.5/stable [amd64])\n"
      "Inst tzdata [2024a-0+deb12u1] (1:2025b-0+deb12u1 Debian-Security:12/stable-security "
      "[all])\n"
      "Conf libonig5 (6.9.8-1 Debian:12.5/stable [amd64])\n";
  auto r = ParseAptSimulation(out);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[0].package, "libonig5");
  EXPECT_EQ((*r)[0].file, "libonig5_6.9.8-1_amd64.deb");
  EXPECT_EQ((*r)[2].file, "jq_1.6-2.1_amd64.deb");
  // An upgrade names the new version; an epoch's ':' is %3a in the file name.
  EXPECT_EQ((*r)[3].version, "1:2025b-0+deb12u1");
  EXPECT_EQ((*r)[3].file, "tzdata_1%3a2025b-0+deb12u1_all.deb");
}

TEST(DebsTest, ATrailingBracketPairAfterTheParenthesesIsNotTheArch) {
  // Seen building debian-12-dev: apt appends " []" to some Inst lines.
  auto r = ParseAptSimulation(
      "Inst node-acorn (8.8.1+ds+~cs25.17.7-2 Debian:12.15/oldstable [all]) []\n");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].file, "node-acorn_8.8.1+ds+~cs25.17.7-2_all.deb");
}

TEST(DebsTest, NothingToInstallIsAnEmptyList) {
  auto r = ParseAptSimulation("0 upgraded, 0 newly installed, 0 to remove and 0 not upgraded.\n");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

TEST(DebsTest, AMalformedOrUnsafeInstLineIsAnError) {
  EXPECT_FALSE(ParseAptSimulation("Inst jq\n").ok());
  EXPECT_FALSE(ParseAptSimulation("Inst ../jq (1.6 Debian [amd64])\n").ok());
  EXPECT_FALSE(ParseAptSimulation("Inst jq (1.6/x Debian [amd64])\n").ok());
}

}  // namespace
}  // namespace trybox::image
