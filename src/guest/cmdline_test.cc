#include "guest/cmdline.h"

#include <gtest/gtest.h>

namespace trybox::guest {
namespace {

TEST(KernelCmdlineTest, ReadsTryboxParameters) {
  KernelCmdline c = ParseKernelCmdline(
      "console=ttyS0 quiet trybox.hostname=box-1 "
      "trybox.machine_id=0123456789ABCDEF0123456789abcdef\n");
  EXPECT_FALSE(c.probe);
  EXPECT_EQ(c.hostname, "box-1");
  EXPECT_EQ(c.machine_id, "0123456789abcdef0123456789abcdef");
  EXPECT_TRUE(c.problems.empty());
}

TEST(KernelCmdlineTest, ProbeOnlyWhenOne) {
  EXPECT_TRUE(ParseKernelCmdline("trybox.probe=1").probe);
  EXPECT_FALSE(ParseKernelCmdline("trybox.probe=0").probe);
  EXPECT_FALSE(ParseKernelCmdline("trybox.probe").probe);
  EXPECT_FALSE(ParseKernelCmdline("xtrybox.probe=1").probe);
}

TEST(KernelCmdlineTest, InvalidHostnameIsRejectedAndReported) {
  KernelCmdline c = ParseKernelCmdline("trybox.hostname=-bad trybox.machine_id=123");
  EXPECT_EQ(c.hostname, "");
  EXPECT_EQ(c.machine_id, "");
  ASSERT_EQ(c.problems.size(), 2u);
  EXPECT_NE(c.problems[0].find("trybox.hostname"), std::string::npos);
}

TEST(KernelCmdlineTest, AllZeroMachineIdIsRejected) {
  EXPECT_EQ(ParseKernelCmdline("trybox.machine_id=00000000000000000000000000000000").machine_id,
            "");
}

TEST(KernelCmdlineTest, QuotesGroupAndStopAtDoubleDash) {
  KernelCmdline c = ParseKernelCmdline("a=\"b c\" d -- trybox.probe=1");
  ASSERT_EQ(c.params.size(), 2u);
  EXPECT_EQ(c.params[0], (std::pair<std::string, std::string>{"a", "b c"}));
  EXPECT_EQ(c.params[1], (std::pair<std::string, std::string>{"d", ""}));
  EXPECT_FALSE(c.probe);
}

TEST(KernelCmdlineTest, ModuleParamsCollectsOnlyThatModule) {
  KernelCmdline c = ParseKernelCmdline(
      "virtio_mmio.device=512@0xfeb00e00:12 virtio-mmio.device=512@0xfeb00c00:11 "
      "virtio_blk.queue_depth=4 foo.x=\"a b\" virtio_mmio");
  EXPECT_EQ(ModuleParams(c, "virtio_mmio"), "device=512@0xfeb00e00:12 device=512@0xfeb00c00:11");
  EXPECT_EQ(ModuleParams(c, "virtio-blk"), "queue_depth=4");
  EXPECT_EQ(ModuleParams(c, "foo"), "x=\"a b\"");
  EXPECT_EQ(ModuleParams(c, "ext4"), "");
}

TEST(KernelCmdlineTest, ModuleNameFromPath) {
  EXPECT_EQ(ModuleNameFromPath("kernel/drivers/char/hw_random/virtio-rng.ko"), "virtio_rng");
  EXPECT_EQ(ModuleNameFromPath("kernel/fs/ext4/ext4.ko.xz"), "ext4");
  EXPECT_EQ(ModuleNameFromPath("overlay.ko"), "overlay");
}

TEST(HostnameTest, Validation) {
  EXPECT_TRUE(ValidHostname("a"));
  EXPECT_TRUE(ValidHostname("vm-12.example"));
  EXPECT_FALSE(ValidHostname(""));
  EXPECT_FALSE(ValidHostname("a..b"));
  EXPECT_FALSE(ValidHostname("a-"));
  EXPECT_FALSE(ValidHostname("a_b"));
  EXPECT_FALSE(ValidHostname("a b"));
  EXPECT_FALSE(ValidHostname(std::string(65, 'a')));
}

TEST(KernelCmdlineTest, LayerCountFromOneToSixteen) {
  EXPECT_EQ(ParseKernelCmdline("quiet").layers, 0);
  EXPECT_EQ(ParseKernelCmdline("trybox.layers=2").layers, 2);
  EXPECT_EQ(ParseKernelCmdline("trybox.layers=16").layers, 16);
  for (const char* bad : {"trybox.layers=0", "trybox.layers=17", "trybox.layers=-1",
                          "trybox.layers=x", "trybox.layers=", "trybox.layers=001"}) {
    auto c = ParseKernelCmdline(bad);
    EXPECT_EQ(c.layers, 0) << bad;
    ASSERT_EQ(c.problems.size(), 1u) << bad;
    EXPECT_NE(c.problems[0].find("trybox.layers"), std::string::npos);
  }
}

TEST(KernelCmdlineTest, TemplateFlag) {
  EXPECT_TRUE(ParseKernelCmdline("quiet trybox.template=1").template_boot);
  EXPECT_FALSE(ParseKernelCmdline("quiet trybox.template=0").template_boot);
  EXPECT_FALSE(ParseKernelCmdline("quiet").template_boot);
}

TEST(KernelCmdlineTest, MachineIdNormalisation) {
  EXPECT_EQ(NormalizeMachineId("ABCDEF0123456789abcdef0123456789"),
            "abcdef0123456789abcdef0123456789");
  EXPECT_FALSE(NormalizeMachineId("00000000000000000000000000000000"));
  EXPECT_FALSE(NormalizeMachineId("abcdef0123456789abcdef012345678"));
  EXPECT_FALSE(NormalizeMachineId("abcdef0123456789abcdef012345678g"));
}

}  // namespace
}  // namespace trybox::guest
