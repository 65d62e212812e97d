#include "guest/credentials.h"

#include <gtest/gtest.h>
#include <linux/capability.h>

#include <optional>

#include "util/fd.h"

namespace trybox::guest {
namespace {

TEST(PasswdLineTest, ReadsTheFields) {
  auto e = ParsePasswdLine("user:x:1000:1001:A User,,,:/home/user:/bin/bash");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->name, "user");
  EXPECT_EQ(e->uid, 1000u);
  EXPECT_EQ(e->gid, 1001u);
  EXPECT_EQ(e->home, "/home/user");
  EXPECT_EQ(e->shell, "/bin/bash");
  auto empty_home = ParsePasswdLine("daemon:*:1:1:::");
  ASSERT_TRUE(empty_home.has_value());
  EXPECT_EQ(empty_home->home, "");
  EXPECT_EQ(ParsePasswdLine("big:x:4294967294:0::/:/bin/sh")->uid, 4294967294u);
}

TEST(PasswdLineTest, MalformedLinesAreRefused) {
  for (const char* line : {
           "",
           "# a comment",
           "user:x:1000:1000:/home/user:/bin/sh",         // 6 fields
           "user:x:1000:1000::/home/user:/bin/sh:extra",  // 8 fields
           ":x:1000:1000::/home/user:/bin/sh",            // no name
           "+user:x:1000:1000::/home/user:/bin/sh",       // NIS compat entries
           "-user:x:1000:1000::/home/user:/bin/sh",
           "user:x::1000::/home/user:/bin/sh",  // empty uid
           "user:x:10a0:1000::/home/user:/bin/sh",
           "user:x:-1:1000::/home/user:/bin/sh",
           "user:x:+1:1000::/home/user:/bin/sh",
           "user:x: 1:1000::/home/user:/bin/sh",
           "user:x:1000:1e3::/home/user:/bin/sh",
           "user:x:4294967295:1000::/home/user:/bin/sh",  // (uid_t)-1
           "user:x:99999999999:1000::/home/user:/bin/sh",
       }) {
    EXPECT_FALSE(ParsePasswdLine(line).has_value()) << line;
  }
}

TEST(GroupLineTest, ReadsMembersAndRefusesMalformedLines) {
  auto g = ParseGroupLine("dev:x:1500:user,,other");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->gid, 1500u);
  EXPECT_EQ(g->members, (std::vector<std::string>{"user", "other"}));
  EXPECT_TRUE(ParseGroupLine("empty:x:7:")->members.empty());
  for (const char* line : {"", "dev:x:1500", "dev:x:1500:a:b", ":x:1:a", "dev:x:x:a", "+:::"}) {
    EXPECT_FALSE(ParseGroupLine(line).has_value()) << line;
  }
}

class LookupAccountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::Make(::testing::TempDir(), "accounts_test");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir).value());
    files_ = {dir_->path() + "/passwd", dir_->path() + "/group"};
  }
  void Write(const std::string& passwd, const std::string& group) {
    ASSERT_TRUE(WriteFileAtomic(files_.passwd, passwd).ok());
    ASSERT_TRUE(WriteFileAtomic(files_.group, group).ok());
  }
  std::optional<TempDir> dir_;
  AccountFiles files_;
};

TEST_F(LookupAccountTest, SkipsMalformedLinesAndCollectsGroups) {
  Write(
      "root:x:0:0:root:/root:/bin/bash\n"
      "user:x:1000\n"                     // malformed: skipped, not fatal
      "user:x:10o0:1000::/bad:/bin/sh\n"  // malformed too
      "user:x:1000:1000:User:/home/user:/bin/bash\n"
      "user:x:2000:2000::/second:/bin/sh\n"  // a later duplicate does not win
      "nohome:x:1001:1001:::/bin/sh",        // no trailing newline
      "root:x:0:\n"
      "user:x:1000:\n"
      "garbage line\n"
      "audio:x:29:user\n"
      "dev:x:1500:other,user\n"
      "again:x:1000:user\n"  // the primary gid is not repeated
      "others:x:1600:other\n");
  auto a = LookupAccount("user", files_);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->name, "user");
  EXPECT_EQ(a->uid, 1000u);
  EXPECT_EQ(a->gid, 1000u);
  EXPECT_EQ(a->home, "/home/user");
  EXPECT_EQ(a->groups, (std::vector<gid_t>{1000, 29, 1500}));
  auto n = LookupAccount("nohome", files_);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->home, "/");
  EXPECT_EQ(n->groups, (std::vector<gid_t>{1001}));
}

TEST_F(LookupAccountTest, UnknownUserIsNotFound) {
  Write("root:x:0:0:root:/root:/bin/bash\nbroken:x:1:\n", "root:x:0:\n");
  for (const char* name : {"nobody", "broken", "ro", "root:x"}) {
    auto a = LookupAccount(name, files_);
    ASSERT_FALSE(a.ok()) << name;
    EXPECT_EQ(a.status().code(), Code::kNotFound) << a.status().ToString();
  }
}

TEST_F(LookupAccountTest, UnreadableFilesAreNotMistakenForAnUnknownUser) {
  auto a = LookupAccount("user", files_);  // neither file exists
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Code::kFailedPrecondition) << a.status().ToString();
  ASSERT_TRUE(WriteFileAtomic(files_.passwd, "user:x:1000:1000::/home/user:/bin/sh\n").ok());
  a = LookupAccount("user", files_);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Code::kFailedPrecondition) << a.status().ToString();
  EXPECT_NE(a.status().message().find(files_.group), std::string::npos);
}

TEST(CommandCapabilitiesTest, NoneThatReachesAnotherProcessOrTheKernel) {
  for (int cap :
       {CAP_DAC_READ_SEARCH, CAP_LINUX_IMMUTABLE, CAP_NET_ADMIN,  CAP_IPC_LOCK,
        CAP_SYS_MODULE,      CAP_SYS_RAWIO,       CAP_SYS_PTRACE, CAP_SYS_PACCT,
        CAP_SYS_ADMIN,       CAP_SYS_BOOT,        CAP_SYS_NICE,   CAP_SYS_RESOURCE,
        CAP_SYS_TIME,        CAP_SYS_TTY_CONFIG,  CAP_MKNOD,      CAP_AUDIT_CONTROL,
        CAP_MAC_OVERRIDE,    CAP_MAC_ADMIN,       CAP_SYSLOG,     CAP_WAKE_ALARM,
        CAP_BLOCK_SUSPEND,   CAP_PERFMON,         CAP_BPF,        CAP_CHECKPOINT_RESTORE}) {
    EXPECT_EQ(kCommandCapabilities & CapBit(cap), 0u) << "capability " << cap;
  }
  // Whatever a later kernel adds is dropped too: the kept set is an allow-list.
  EXPECT_EQ(kCommandCapabilities >> (CAP_LAST_CAP + 1), 0u);
}

}  // namespace
}  // namespace trybox::guest
