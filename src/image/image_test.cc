#include "image/image.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "image/derive.h"
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

// A rebuild that made the same image keeps the installed manifest byte for byte (so images
// derived from it, which record its SHA-256, stay current); any real change takes the new
// time.
TEST_F(ImageTest, ARebuildOfTheSameImageKeepsItsManifestBytes) {
  Manifest installed = MakeImage("debian-12");
  Manifest fresh = installed;
  fresh.created = "2026-12-03T19:37:12Z";
  fresh.created = CreatedFor(fresh, installed);
  EXPECT_EQ(fresh.created, installed.created);
  EXPECT_EQ(Sha256Hex(ManifestToJson(fresh)), Sha256Hex(ManifestToJson(installed)));
  for (auto change : std::vector<std::function<void(Manifest&)>>{
           [](Manifest& m) { m.init_sha256 = Sha256Hex("another init"); },
           [](Manifest& m) { m.files["rootfs.ext4"].sha256 = Sha256Hex("another rootfs"); },
           [](Manifest& m) { m.kernel_package += "+1"; },
           [](Manifest& m) { m.packages.push_back("curl"); },
           [](Manifest& m) { m.modules.pop_back(); }}) {
    Manifest other = installed;
    other.created = "2026-12-03T19:37:12Z";
    change(other);
    EXPECT_EQ(CreatedFor(other, installed), "2026-12-03T19:37:12Z");
  }
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
  j["format"] = 3;
  auto parsed = ParseManifest(j.dump());
  EXPECT_EQ(parsed.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(parsed.status().message().find("format 3 is not supported"), std::string::npos);
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

// ---- format 2: derived images ----

class DerivedImageTest : public ImageTest {
 protected:
  // Derives `name` from `parent` with a layer holding `content`.
  Result<Manifest> Derive(const std::string& parent, const std::string& name,
                          std::map<std::string, std::string> env = {}, bool replace = false,
                          const std::string& content = "layer bytes") {
    DeriveOptions o;
    o.images_root = root_;
    o.parent = parent;
    o.name = name;
    o.replace = replace;
    o.env = std::move(env);
    o.vm = "vm1";
    o.packages = {"git", "jq"};
    o.write_layer = [content](const std::string& path) {
      return WriteFileAtomic(path, content, 0644);
    };
    return DeriveImage(o);
  }

  std::vector<std::string> Listed() {
    std::vector<std::string> names;
    auto images = ListImages(root_);
    if (!images.ok()) return {"error: " + images.status().message()};
    for (const auto& e : images.value()) names.push_back(e.name);
    return names;
  }

  std::vector<std::string> DotEntries() {
    std::vector<std::string> out;
    DIR* d = ::opendir(root_.c_str());
    while (struct dirent* e = d ? ::readdir(d) : nullptr) {
      std::string n = e->d_name;
      if (n[0] == '.' && n != "." && n != ".." && n != ".lock") out.push_back(n);
    }
    if (d) ::closedir(d);
    return out;
  }
};

TEST(ImageEnvTest, MergeKeepsParentsAndChildWins) {
  auto env = MergeEnv({{"A", "1"}, {"B", "parent"}}, {{"B", "child"}, {"C", "3"}});
  EXPECT_EQ(env, (std::map<std::string, std::string>{{"A", "1"}, {"B", "child"}, {"C", "3"}}));
}

TEST_F(DerivedImageTest, DeriveLinksTheParentAndAddsAVerifiedLayer) {
  Manifest base = MakeImage("base");
  auto child = Derive("base", "child", {{"LANG", "C.UTF-8"}});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(child->format, kDerivedManifestFormat);
  EXPECT_EQ(child->base.name, "base");
  EXPECT_EQ(child->parent, child->base);
  EXPECT_EQ(child->base.manifest_sha256, *Sha256File(root_ + "/base/manifest.json"));
  ASSERT_EQ(child->layers.size(), 1u);
  EXPECT_EQ(child->layers[0], (LayerInfo{"child", "layer-1.ext4"}));
  EXPECT_EQ(child->env.at("LANG"), "C.UTF-8");
  EXPECT_EQ(child->vm, "vm1");
  EXPECT_EQ(child->packages, (std::vector<std::string>{"bash", "git", "jq"}));
  EXPECT_EQ(child->files.size(), 5u);
  EXPECT_TRUE(VerifyImage(root_ + "/child").ok());
  // The base's parts are shared, not copied.
  struct stat a, b;
  ASSERT_EQ(::stat((root_ + "/base/rootfs.ext4").c_str(), &a), 0);
  ASSERT_EQ(::stat((root_ + "/child/rootfs.ext4").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  // Frozen like a base build.
  ASSERT_EQ(::stat((root_ + "/child/layer-1.ext4").c_str(), &a), 0);
  EXPECT_EQ(a.st_mode & 07777, 0444u);
  ASSERT_EQ(::stat((root_ + "/child").c_str(), &a), 0);
  EXPECT_EQ(a.st_mode & 07777, 0555u);
  EXPECT_EQ(Listed(), (std::vector<std::string>{"base", "child"}));
  EXPECT_TRUE(DotEntries().empty());
}

TEST_F(DerivedImageTest, SecondLayerKeepsTheChainAndMergesEnv) {
  MakeImage("base");
  ASSERT_TRUE(Derive("base", "one", {{"A", "1"}, {"B", "one"}}).ok());
  auto two = Derive("one", "two", {{"B", "two"}});
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->base.name, "base");
  EXPECT_EQ(two->parent.name, "one");
  EXPECT_EQ(two->parent.manifest_sha256, *Sha256File(root_ + "/one/manifest.json"));
  ASSERT_EQ(two->layers.size(), 2u);
  EXPECT_EQ(two->layers[0], (LayerInfo{"one", "layer-1.ext4"}));
  EXPECT_EQ(two->layers[1], (LayerInfo{"two", "layer-2.ext4"}));
  EXPECT_EQ(two->env, (std::map<std::string, std::string>{{"A", "1"}, {"B", "two"}}));
  EXPECT_EQ(two->files.size(), 6u);
  EXPECT_TRUE(VerifyImage(root_ + "/two").ok());
  auto read = ReadManifest(root_ + "/two");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, *two);
}

TEST_F(DerivedImageTest, VerificationCoversEveryLayerOfTheChain) {
  MakeImage("base");
  ASSERT_TRUE(Derive("base", "one").ok());
  ASSERT_TRUE(Derive("one", "two").ok());
  // "two" boots "one"'s layer too, so that layer is checked with two's own.
  const std::string layer = root_ + "/two/layer-1.ext4";
  ASSERT_TRUE(WriteFileAtomic(root_ + "/tampered", "LAYER BYTES").ok());
  ASSERT_EQ(::chmod((root_ + "/two").c_str(), 0755), 0);
  ASSERT_EQ(::rename((root_ + "/tampered").c_str(), layer.c_str()), 0);
  Status st = VerifyImage(root_ + "/two");
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("layer-1.ext4 does not match"), std::string::npos) << st.message();
}

TEST_F(DerivedImageTest, ExistingNameIsRefusedUnlessReplaced) {
  MakeImage("base");
  ASSERT_TRUE(Derive("base", "child", {{"V", "1"}}).ok());
  auto again = Derive("base", "child", {{"V", "2"}});
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists);
  EXPECT_EQ(ReadManifest(root_ + "/child")->env.at("V"), "1");
  auto replaced = Derive("base", "child", {{"V", "2"}}, /*replace=*/true);
  ASSERT_TRUE(replaced.ok()) << replaced.status().ToString();
  EXPECT_EQ(ReadManifest(root_ + "/child")->env.at("V"), "2");
  EXPECT_EQ(Listed(), (std::vector<std::string>{"base", "child"}));
  EXPECT_TRUE(DotEntries().empty());
}

TEST_F(DerivedImageTest, FailedLayerLeavesNothingBehind) {
  MakeImage("base");
  DeriveOptions o;
  o.images_root = root_;
  o.parent = "base";
  o.name = "broken";
  o.write_layer = [](const std::string& path) {
    (void)WriteFileAtomic(path, "half");
    return ResourceExhausted("no space left for the layer");
  };
  auto r = DeriveImage(o);
  EXPECT_EQ(r.status().code(), Code::kResourceExhausted);
  EXPECT_EQ(Listed(), (std::vector<std::string>{"base"}));
  EXPECT_TRUE(DotEntries().empty());
  EXPECT_EQ(Derive("base", "bad/name").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Derive("nope", "x").status().code(), Code::kNotFound);
  EXPECT_EQ(Listed(), (std::vector<std::string>{"base"}));
}

TEST_F(DerivedImageTest, ChainDepthIsCapped) {
  MakeImage("base");
  std::string parent = "base";
  for (int k = 1; k <= kMaxLayers; ++k) {
    std::string name = "l" + std::to_string(k);
    ASSERT_TRUE(Derive(parent, name).ok()) << k;
    parent = name;
  }
  auto deeper = Derive(parent, "deeper");
  EXPECT_EQ(deeper.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(deeper.status().message().find("layers"), std::string::npos);
}

TEST_F(DerivedImageTest, MalformedChainNamesTheProblem) {
  MakeImage("base");
  ASSERT_TRUE(Derive("base", "one").ok());
  Manifest two = *Derive("one", "two");
  auto parse = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto j = nlohmann::json::parse(ManifestToJson(two));
    edit(j);
    return ParseManifest(j.dump()).status();
  };
  struct Case {
    std::string mutate;
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  };
  std::vector<Case> cases = {
      {"no layers", [](auto& j) { j["layers"] = nlohmann::json::array(); }, "'layers' must hold"},
      {"layer part out of order", [](auto& j) { j["layers"][0]["part"] = "layer-2.ext4"; },
       "layers[0].part must be layer-1.ext4"},
      {"foreign top layer", [](auto& j) { j["layers"][1]["image"] = "one"; },
       "not this image's own"},
      {"parent not below", [](auto& j) { j["parent"]["name"] = "base"; }, "is not the image below"},
      {"missing layer part", [](auto& j) { j["files"].erase("layer-2.ext4"); },
       "no entry for layer-2.ext4"},
      {"extra layer part", [](auto& j) { j["files"]["layer-3.ext4"] = j["files"]["vmlinux"]; },
       "unknown part 'layer-3.ext4'"},
      {"bad parent sha", [](auto& j) { j["parent"]["manifest_sha256"] = "x"; },
       "parent.manifest_sha256"},
      {"no base", [](auto& j) { j.erase("base"); }, "missing field 'base'"},
      {"env not strings", [](auto& j) { j["env"]["A"] = 1; }, "env.A is not a string"},
      {"recipe not object", [](auto& j) { j["recipe"] = "x"; }, "'recipe'"},
      {"bad recipe sha", [](auto& j) { j["recipe_sha256"] = "AB"; }, "recipe_sha256"},
      {"no vm", [](auto& j) { j.erase("vm"); }, "missing field 'vm'"},
      {"format 1 with a layer", [](auto& j) { j["format"] = 1; }, "unknown part 'layer-"},
  };
  for (const Case& c : cases) {
    Status st = parse(c.edit);
    EXPECT_EQ(st.code(), Code::kFailedPrecondition) << c.mutate;
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << c.mutate << ": " << st.message();
  }
}

}  // namespace
}  // namespace trybox::image

namespace trybox::image {
namespace {

// Issue 51.3: a recipe build's staged image carries checks_pending, which survives its
// manifest and is never inherited by an image committed from it.
TEST_F(DerivedImageTest, ChecksPendingIsRecordedAndNeverInherited) {
  MakeImage("base");
  DeriveOptions o;
  o.images_root = root_;
  o.parent = "base";
  o.name = "staged";
  o.vm = "vm1";
  o.checks_pending = true;
  o.write_layer = [](const std::string& path) { return WriteFileAtomic(path, "layer", 0644); };
  auto staged = DeriveImage(o);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  EXPECT_TRUE(staged->checks_pending);
  auto read = ReadManifest(root_ + "/staged");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(read->checks_pending);
  EXPECT_NE(ReadFileToString(root_ + "/staged/manifest.json")->find("\"checks_pending\": true"),
            std::string::npos);
  o.parent = "staged";
  o.name = "child";
  o.checks_pending = false;
  auto child = DeriveImage(o);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_FALSE(child->checks_pending);
  // Written only when true: other manifests keep their bytes.
  EXPECT_EQ(ReadFileToString(root_ + "/child/manifest.json")->find("checks_pending"),
            std::string::npos);
  auto bad = ReadFileToString(root_ + "/staged/manifest.json");
  std::string text = *bad;
  text.replace(text.find("\"checks_pending\": true"), 22, "\"checks_pending\": 1");
  auto parsed = ParseManifest(text);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("checks_pending"), std::string::npos);
}

}  // namespace
}  // namespace trybox::image
