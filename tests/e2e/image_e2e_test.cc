// End to end: images made from running VMs (docs/images.md, "Derived images"). A commit
// freezes what a VM wrote (files, deletions as whiteouts, directories) into a layer over its
// image; new VMs of the result see exactly that, restore from its own template, and get its
// env; a commit of a commit stacks a second layer; rm refuses while a VM or a derived image
// needs the image; a bad or taken name leaves nothing listed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <set>

#include "tests/e2e/harness.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

std::string Line(const std::string& s) { return s.substr(0, s.find('\n')); }

class ImageE2E : public SharedHarness<ImageE2E> {
 protected:
  // A name of this run's own: the image directory may be shared with other runs.
  static std::string Name(const std::string& what) {
    return "e2e-" + what + "-" + std::to_string(::getpid());
  }

  std::string Create(const std::string& image) {
    CliResult c = h_->Cli({"create", "--image", image});
    EXPECT_EQ(c.code, 0) << c.err;
    return Line(c.out);
  }

  // The create verb's reply, for how the VM started.
  Json CreateVerb(const std::string& image) {
    auto r = h_->Call({{"verb", "create"}, {"image", image}});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? (*r)["vm"] : Json();
  }

  CliResult Sh(const std::string& vm, const std::string& script) {
    return h_->Cli({"exec", vm, "--", "sh", "-c", script});
  }

  std::set<std::string> Listed() {
    std::set<std::string> names;
    CliResult c = h_->Cli({"image", "ls", "--json"});
    EXPECT_EQ(c.code, 0) << c.err;
    Json j = Json::parse(c.out, nullptr, false);
    if (!j.is_array()) return names;
    for (const Json& im : j) names.insert(im["name"].get<std::string>());
    return names;
  }

  Json ListedImage(const std::string& name) {
    CliResult c = h_->Cli({"image", "ls", "--json"});
    Json j = Json::parse(c.out, nullptr, false);
    if (j.is_array()) {
      for (const Json& im : j) {
        if (im["name"] == name) return im;
      }
    }
    return Json();
  }
};

TEST_F(ImageE2E, CommitFreezesFilesDeletionsAndDirsAndStacksASecondLayer) {
  const std::string one = Name("one"), two = Name("two");
  const std::string a = Create("debian-12");
  ASSERT_FALSE(a.empty());
  CliResult w = Sh(a,
                   "echo made > /root/made.txt && rm /etc/motd && mkdir -p /opt/tool/bin && "
                   "echo '#!/bin/sh' > /opt/tool/bin/t && chmod 755 /opt/tool/bin/t && "
                   "ln -s /root/made.txt /root/link");
  ASSERT_EQ(w.code, 0) << w.err;
  CliResult c = h_->Cli({"commit", a, one});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(Line(c.out), one);

  // A new VM of the image: the first builds its template, the next is restored from it.
  Json first = CreateVerb(one);
  ASSERT_TRUE(first.is_object());
  const std::string b = first["id"];
  EXPECT_EQ(first["image"], one);
  CliResult seen = Sh(b,
                      "cat /root/made.txt; test -e /etc/motd && echo motd-back; "
                      "test -x /opt/tool/bin/t && echo tool; readlink /root/link; "
                      "test -e /etc/hostname && echo base-still-there");
  ASSERT_EQ(seen.code, 0) << seen.err;
  EXPECT_EQ(seen.out, "made\ntool\n/root/made.txt\nbase-still-there\n");
  Json second = CreateVerb(one);
  ASSERT_TRUE(second.is_object());
  EXPECT_EQ(second["start"]["mode"], "restored") << second.dump();
  if (second["start"].contains("template")) {
    EXPECT_EQ(second["start"]["template"]["built"], false) << second.dump();
  }
  CliResult clone = Sh(second["id"], "cat /root/made.txt; test -e /etc/motd || echo no-motd");
  EXPECT_EQ(clone.out, "made\nno-motd\n") << clone.err;

  Json listed = ListedImage(one);
  ASSERT_TRUE(listed.is_object());
  EXPECT_EQ(listed["parent"], "debian-12");
  EXPECT_EQ(listed["base"], "debian-12");
  EXPECT_EQ(listed["in_use"], 2);
  EXPECT_GT(listed["own_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(listed["total_bytes"].get<uint64_t>(), listed["own_bytes"].get<uint64_t>());

  // In use: refused, and still listed.
  CliResult busy = h_->Cli({"image", "rm", one});
  EXPECT_NE(busy.code, 0);
  EXPECT_NE(busy.err.find("in use"), std::string::npos) << busy.err;
  EXPECT_TRUE(Listed().count(one));

  // A commit of a commit, with env: two layers, the newer one's changes on top.
  ASSERT_EQ(Sh(b, "echo second > /root/second.txt && rm /root/made.txt").code, 0);
  auto r = h_->Call({{"verb", "commit"},
                     {"vm", b},
                     {"name", two},
                     {"env", {{"LAYER_ENV", "from-image"}, {"OTHER", "x"}}}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["image"]["parent"]["name"], one);
  EXPECT_EQ((*r)["image"]["layer"], "layer-2.ext4");
  const std::string d = Create(two);
  CliResult stacked = Sh(d,
                         "cat /root/second.txt; test -e /root/made.txt || echo made-gone; "
                         "test -e /etc/motd || echo no-motd; test -x /opt/tool/bin/t && echo tool; "
                         "echo \"$LAYER_ENV\"");
  EXPECT_EQ(stacked.out, "second\nmade-gone\nno-motd\ntool\nfrom-image\n") << stacked.err;
  CliResult mine = h_->Cli(
      {"exec", "--env", "LAYER_ENV=mine", d, "--", "sh", "-c", "echo \"$LAYER_ENV $OTHER\""});
  EXPECT_EQ(mine.out, "mine x\n") << mine.err;

  // A parent with a derived image stays until the derived one goes.
  ASSERT_EQ(h_->Cli({"rm", a, b, second["id"], d}).code, 0);
  CliResult parent = h_->Cli({"image", "rm", one});
  EXPECT_NE(parent.code, 0);
  EXPECT_NE(parent.err.find(two), std::string::npos) << parent.err;
  CliResult rm2 = h_->Cli({"image", "rm", two});
  EXPECT_EQ(rm2.code, 0) << rm2.err;
  CliResult rm1 = h_->Cli({"image", "rm", one});
  EXPECT_EQ(rm1.code, 0) << rm1.err;
  auto names = Listed();
  EXPECT_FALSE(names.count(one));
  EXPECT_FALSE(names.count(two));
  EXPECT_TRUE(names.count("debian-12"));
}

TEST_F(ImageE2E, BadOrTakenNamesAndDeadVmsLeaveNothingListed) {
  const std::string vm = Create("debian-12");
  ASSERT_FALSE(vm.empty());
  const auto before = Listed();
  CliResult bad = h_->Cli({"commit", vm, "no/such name"});
  EXPECT_NE(bad.code, 0);
  auto r = h_->Call({{"verb", "commit"}, {"vm", vm}, {"name", "../escape"}});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
  CliResult taken = h_->Cli({"commit", vm, "debian-12"});
  EXPECT_NE(taken.code, 0);
  EXPECT_NE(taken.err.find("exists"), std::string::npos) << taken.err;
  ASSERT_EQ(h_->Cli({"rm", vm}).code, 0);
  CliResult dead = h_->Cli({"commit", vm, Name("dead")});
  EXPECT_NE(dead.code, 0);
  EXPECT_NE(dead.err.find("not running"), std::string::npos) << dead.err;
  EXPECT_EQ(Listed(), before);
}

}  // namespace
}  // namespace trybox::e2e
