#include "image/image.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "image/hash_cache.h"
#include "util/fd.h"
#include "util/sha256.h"

namespace trybox::image {
namespace {

class ImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::Make("/tmp", "image_test-");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    tmp_.emplace(std::move(dir).value());
    root_ = tmp_->path() + "/images";
    ASSERT_TRUE(MakeDirs(root_).ok());
  }

  // A small but complete image: each part holds a few distinct bytes.
  Manifest MakeImage(const std::string& name) {
    std::string dir = root_ + "/" + name;
    EXPECT_TRUE(MakeDirs(dir).ok());
    Manifest m;
    m.name = name;
    m.created = "2025-11-30T05:13:00Z";
    m.suite = "bookworm";
    m.kernel_version = "6.1.0-57-amd64";
    m.kernel_package = "linux-image-6.1.0-57-amd64=6.1.192-3";
    m.packages = {"bash", "git"};
    m.modules = {"kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko"};
    m.init_sha256 = Sha256Hex("init");
    for (const char* part : kPartNames) {
      std::string data = std::string("contents of ") + part;
      EXPECT_TRUE(WriteFileAtomic(dir + "/" + part, data).ok());
      m.files[part] = PartInfo{Sha256Hex(data), data.size()};
    }
    EXPECT_TRUE(WriteFileAtomic(dir + "/manifest.json", ManifestToJson(m)).ok());
    return m;
  }

  void WriteManifestText(const std::string& name, const std::string& text) {
    ASSERT_TRUE(MakeDirs(root_ + "/" + name).ok());
    ASSERT_TRUE(WriteFileAtomic(root_ + "/" + name + "/manifest.json", text).ok());
  }

  std::optional<TempDir> tmp_;
  std::string root_;
};

TEST_F(ImageTest, ManifestSurvivesJsonRoundTrip) {
  Manifest m = MakeImage("debian-12");
  auto parsed = ParseManifest(ManifestToJson(m));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, m);
  auto read = ReadManifest(root_ + "/debian-12/");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, m);
}

TEST_F(ImageTest, MissingManifestIsNotFound) {
  ASSERT_TRUE(MakeDirs(root_ + "/empty").ok());
  auto m = ReadManifest(root_ + "/empty");
  EXPECT_EQ(m.status().code(), Code::kNotFound);
  EXPECT_NE(m.status().message().find("has no manifest.json"), std::string::npos);
}

TEST_F(ImageTest, MalformedManifestNamesTheProblem) {
  Manifest good = MakeImage("x");
  struct Case {
    std::string mutate;  // what the JSON edit does, for the failure message
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  };
  auto parse = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto j = nlohmann::json::parse(ManifestToJson(good));
    edit(j);
    return ParseManifest(j.dump());
  };
  std::vector<Case> cases = {
      {"drop name", [](auto& j) { j.erase("name"); }, "missing field 'name'"},
      {"name not string", [](auto& j) { j["name"] = 7; }, "field 'name' is not a string"},
      {"bad name", [](auto& j) { j["name"] = "../etc"; }, "may contain only"},
      {"modules not list", [](auto& j) { j["modules"] = "x"; }, "'modules' is not an array"},
      {"short sha", [](auto& j) { j["files"]["vmlinux"]["sha256"] = "abc"; },
       "files.vmlinux.sha256 is not 64"},
      {"negative size", [](auto& j) { j["files"]["vmlinux"]["size"] = -1; }, "files.vmlinux.size"},
      {"missing part", [](auto& j) { j["files"].erase("rootfs.ext4"); },
       "no entry for rootfs.ext4"},
      {"path as part", [](auto& j) { j["files"]["../../etc/shadow"] = j["files"]["vmlinux"]; },
       "unknown part '../../etc/shadow'"},
      {"bad init hash", [](auto& j) { j["init_sha256"] = "zz"; }, "init_sha256"},
  };
  for (const Case& c : cases) {
    auto m = parse(c.edit);
    EXPECT_EQ(m.status().code(), Code::kFailedPrecondition) << c.mutate;
    EXPECT_NE(m.status().message().find(c.expect), std::string::npos)
        << c.mutate << ": " << m.status().message();
  }
  EXPECT_NE(ParseManifest("{not json").status().message().find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(ParseManifest("[1]").status().message().find("not a JSON object"), std::string::npos);
}

TEST_F(ImageTest, UnknownManifestFormatAsksForRebuild) {
  Manifest m = MakeImage("x");
  auto j = nlohmann::json::parse(ManifestToJson(m));
  j["format"] = 2;
  auto parsed = ParseManifest(j.dump());
  EXPECT_EQ(parsed.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(parsed.status().message().find("format 2 is not supported"), std::string::npos);
}

TEST_F(ImageTest, ManifestNamingAnotherImageIsRejected) {
  Manifest m = MakeImage("a");
  ASSERT_EQ(::rename((root_ + "/a").c_str(), (root_ + "/b").c_str()), 0);
  auto read = ReadManifest(root_ + "/b");
  EXPECT_EQ(read.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(read.status().message().find("names image 'a' but the directory is 'b'"),
            std::string::npos);
}

TEST_F(ImageTest, VerifyAcceptsIntactImage) {
  MakeImage("debian-12");
  Status st = VerifyImage(root_ + "/debian-12");
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_F(ImageTest, VerifyNamesTamperedPartWithSameSize) {
  MakeImage("debian-12");
  std::string path = root_ + "/debian-12/rootfs.ext4";
  ASSERT_TRUE(VerifyImage(root_ + "/debian-12").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "CONTENTS OF rootfs.ext4").ok());
  Status st = VerifyImage(root_ + "/debian-12");
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(
      st.message().find("image 'debian-12': rootfs.ext4 does not match its manifest (sha256 "),
      std::string::npos)
      << st.message();
}

TEST_F(ImageTest, VerifyReportsSizeMismatchWithoutHashing) {
  MakeImage("debian-12");
  ASSERT_TRUE(WriteFileAtomic(root_ + "/debian-12/vmlinux", "short").ok());
  Status st = VerifyImage(root_ + "/debian-12");
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("vmlinux does not match its manifest (size 5 != " +
                              std::to_string(std::string("contents of vmlinux").size()) + ")"),
            std::string::npos)
      << st.message();
}

TEST_F(ImageTest, VerifyReportsMissingPartAsNotFound) {
  MakeImage("debian-12");
  ASSERT_EQ(::unlink((root_ + "/debian-12/scratch.qcow2").c_str()), 0);
  Status st = VerifyImage(root_ + "/debian-12");
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_NE(st.message().find("image 'debian-12': scratch.qcow2 is missing"), std::string::npos)
      << st.message();
}

TEST_F(ImageTest, VerifyRejectsSymlinkedPart) {
  MakeImage("debian-12");
  std::string part = root_ + "/debian-12/initrd.cpio";
  ASSERT_EQ(::rename(part.c_str(), (root_ + "/elsewhere").c_str()), 0);
  ASSERT_EQ(::symlink((root_ + "/elsewhere").c_str(), part.c_str()), 0);
  Status st = VerifyImage(root_ + "/debian-12");
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("initrd.cpio is not a regular file"), std::string::npos);
}

TEST_F(ImageTest, HashCacheSkipsUnchangedFilesAndRehashesChangedOnes) {
  HashCache cache(std::chrono::nanoseconds(0));
  std::string path = tmp_->path() + "/f";
  ASSERT_TRUE(WriteFileAtomic(path, "one").ok());
  EXPECT_EQ(*cache.Sha256(path), Sha256Hex("one"));
  EXPECT_EQ(*cache.Sha256(path), Sha256Hex("one"));
  EXPECT_EQ(cache.hashes(), 1u);

  // Same size, new inode (rename over): identity changes.
  ASSERT_TRUE(WriteFileAtomic(path, "two").ok());
  EXPECT_EQ(*cache.Sha256(path), Sha256Hex("two"));
  EXPECT_EQ(cache.hashes(), 2u);

  // Same inode, appended to: size changes. (A same-size rewrite within one timestamp tick
  // is what the settle time guards against; see the next test.)
  {
    std::ofstream f(path, std::ios::app);
    f << "!";
  }
  EXPECT_EQ(*cache.Sha256(path), Sha256Hex("two!"));
  EXPECT_EQ(cache.hashes(), 3u);
}

TEST_F(ImageTest, HashCacheDoesNotTrustFreshlyWrittenFiles) {
  HashCache cache(std::chrono::hours(1));
  std::string path = tmp_->path() + "/f";
  ASSERT_TRUE(WriteFileAtomic(path, "one").ok());
  EXPECT_EQ(*cache.Sha256(path), Sha256Hex("one"));
  EXPECT_EQ(*cache.Sha256(path), Sha256Hex("one"));
  EXPECT_EQ(cache.hashes(), 2u);
}

TEST_F(ImageTest, HashCacheReportsMissingFile) {
  HashCache cache;
  EXPECT_EQ(cache.Sha256(tmp_->path() + "/nope").status().code(), Code::kNotFound);
}

TEST_F(ImageTest, ListShowsImagesAndIgnoresBuildsInProgress) {
  MakeImage("b-image");
  MakeImage("a-image");
  WriteManifestText("broken", "{");
  WriteManifestText(".build-c-123", "{}");  // a build in progress
  ASSERT_TRUE(MakeDirs(root_ + "/no-manifest").ok());
  ASSERT_TRUE(WriteFileAtomic(root_ + "/stray-file", "x").ok());

  auto list = ListImages(root_);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].name, "a-image");
  EXPECT_TRUE((*list)[0].valid);
  EXPECT_EQ((*list)[0].dir, root_ + "/a-image");
  EXPECT_EQ((*list)[0].manifest.suite, "bookworm");
  EXPECT_EQ((*list)[1].name, "b-image");
  EXPECT_TRUE((*list)[1].valid);
  EXPECT_EQ((*list)[2].name, "broken");
  EXPECT_FALSE((*list)[2].valid);
  EXPECT_NE((*list)[2].problem.find("not valid JSON"), std::string::npos);
}

TEST_F(ImageTest, ListOfMissingRootIsEmpty) {
  auto list = ListImages(root_ + "/absent");
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
}

TEST_F(ImageTest, ImageDirResolvesBuiltImages) {
  MakeImage("debian-12");
  auto dir = ImageDir(root_, "debian-12");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_EQ(*dir, root_ + "/debian-12");

  auto absent = ImageDir(root_, "alpine");
  EXPECT_EQ(absent.status().code(), Code::kNotFound);
  EXPECT_EQ(absent.status().message(),
            "image 'alpine' is not built (run: trybox image build alpine)");

  EXPECT_EQ(ImageDir(root_, "../debian-12").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ImageDir(root_, "").status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace trybox::image
