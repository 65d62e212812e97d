// VmLauncher's acceleration choice, with the probe and its key injected: no VM boots.
#include "daemon/vm_launcher.h"

#include <gtest/gtest.h>

#include <optional>

#include "util/fd.h"

namespace trybox::daemon {
namespace {

class LauncherAccelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = TempDir::Make(::testing::TempDir(), "launcher_test");
    ASSERT_TRUE(d.ok());
    dir_.emplace(std::move(*d));
    templates_.emplace(dir_->path() + "/templates", dir_->path() + "/vms", std::chrono::seconds(5));
  }

  LauncherOptions Options() {
    LauncherOptions o;
    o.vms_dir = dir_->path() + "/vms";
    o.templates_dir = dir_->path() + "/templates";
    o.probe_dir = dir_->path();
    o.accel_file = dir_->path() + "/accel.json";
    o.pool.min_spares = 0;
    o.probe = [this](const std::string&) {
      ++probes_;
      return vmm::AccelChoice{"tcg", "the probe guest aborted"};
    };
    o.accel_key = [this](const std::string&) -> Result<Json> { return key_; };
    return o;
  }

  // A launcher as a fresh daemon makes it.
  std::string Choose(bool reprobe = false, std::vector<std::string>* stages = nullptr) {
    VmLauncher launcher(Options(), *templates_, uids_, background_);
    Progress progress = [&](const std::string& stage, const std::string&) {
      if (stages) stages->push_back(stage);
    };
    return reprobe ? launcher.Reprobe("img").reason : launcher.Accel("img", progress).reason;
  }

  std::optional<TempDir> dir_;
  std::optional<vmm::TemplateStore> templates_;
  UidPool uids_{false, 0};
  BackgroundQueue background_;
  int probes_ = 0;
  Json key_ = {{"host_kernel", "Linux 6.1"}, {"qemu_version", "7.2"}};
};

TEST_F(LauncherAccelTest, TheProbesAnswerIsKeptAcrossDaemonRestarts) {
  std::vector<std::string> stages;
  EXPECT_EQ(Choose(false, &stages), "the probe guest aborted");
  EXPECT_EQ(probes_, 1);
  EXPECT_EQ(stages, std::vector<std::string>{"probe"});  // the wait is announced
  stages.clear();
  std::string again = Choose(false, &stages);
  EXPECT_EQ(probes_, 1);
  EXPECT_TRUE(stages.empty());
  EXPECT_NE(again.find("the probe guest aborted"), std::string::npos);
  EXPECT_NE(again.find("earlier probe"), std::string::npos) << again;
}

TEST_F(LauncherAccelTest, AChangedKeyProbesAgain) {
  Choose();
  key_["qemu_version"] = "8.0";
  Choose();
  EXPECT_EQ(probes_, 2);
  Choose();
  EXPECT_EQ(probes_, 2);
}

TEST_F(LauncherAccelTest, DoctorProbeProbesWhateverIsKept) {
  Choose();
  Choose(/*reprobe=*/true);
  EXPECT_EQ(probes_, 2);
}

TEST_F(LauncherAccelTest, OneLauncherProbesOnce) {
  VmLauncher launcher(Options(), *templates_, uids_, background_);
  ::unlink((dir_->path() + "/accel.json").c_str());
  launcher.Accel("img");
  launcher.Accel("img");
  EXPECT_EQ(probes_, 1);
}

}  // namespace
}  // namespace trybox::daemon
