#include "workspace/ext4.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "util/fd.h"
#include "util/process.h"
#include "workspace/tar.h"

namespace trybox::workspace {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

void WriteFileWithMode(const std::string& path, const std::string& data, mode_t mode) {
  ASSERT_TRUE(MakeDirs(path.substr(0, path.rfind('/')), 0755).ok());
  auto fd = OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  ASSERT_TRUE(WriteFull(fd->get(), data).ok());
  ASSERT_EQ(::fchmod(fd->get(), mode), 0);
}

void Symlink(const std::string& target, const std::string& path) {
  ASSERT_TRUE(MakeDirs(path.substr(0, path.rfind('/')), 0755).ok());
  ASSERT_EQ(::symlink(target.c_str(), path.c_str()), 0) << path;
}

std::function<Result<std::string>()> Chunks(std::string data) {
  auto d = std::make_shared<std::string>(std::move(data));
  auto done = std::make_shared<bool>(false);
  return [d, done]() -> Result<std::string> {
    if (*done) return std::string();
    *done = true;
    return *d;
  };
}

// The tar of an image, or the reader's error.
Result<std::string> TarOf(const std::string& image, const Ext4ReadLimits& limits = {},
                          Ext4ReadReport* report = nullptr) {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(image, O_RDONLY));
  std::string tar;
  RETURN_IF_ERROR(WriteTarFromExt4(
      fd.get(), limits,
      [&](std::string_view s) {
        tar.append(s);
        return Status::Ok();
      },
      report));
  return tar;
}

// Runs an e2fsprogs tool (debugfs, e2fsck, mke2fs, tune2fs; from /usr/sbin when PATH has
// no sbin) or cp, which must succeed, returning its output.
std::string RunTool(std::vector<std::string> argv) {
  if (!FindInPath(argv[0]) && ::access(("/usr/sbin/" + argv[0]).c_str(), X_OK) == 0) {
    argv[0] = "/usr/sbin/" + argv[0];
  }
  auto r = RunCommand(argv);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return "";
  EXPECT_TRUE(r->exit.exited && r->exit.code == 0) << argv[0] << ": " << r->output;
  return r->output;
}

// Runs debugfs commands on an image, in order (names are relative to its cwd, "/" at first).
void Debugfs(const std::string& image, const std::vector<std::string>& commands) {
  std::string script;
  for (const std::string& c : commands) script += c + "\n";
  std::string file = image + ".debugfs";
  ASSERT_TRUE(WriteFileAtomic(file, script, 0644, false).ok());
  std::string out = RunTool({"debugfs", "-w", "-f", file, image});
  ::unlink(file.c_str());
  // debugfs exits 0 whatever its commands did; a failure shows only in its output.
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    std::string line = out.substr(start, end == std::string::npos ? end : end - start);
    start = end == std::string::npos ? out.size() : end + 1;
    bool fine = line.empty() || line.rfind("debugfs", 0) == 0 ||
                line.rfind("Allocated inode", 0) == 0 || line.rfind("Filesystem features", 0) == 0;
    EXPECT_TRUE(fine) << "debugfs said: " << line;
  }
}

class Ext4ImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = TempDir::Make("/tmp", "ws-ext4-test-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
    src_ = tmp_->path() + "/src";
    image_ = tmp_->path() + "/ws.img";
    ASSERT_TRUE(MakeDirs(src_, 0755).ok());
  }

  Manifest TreeManifest(const std::string& root) {
    auto m = ManifestFromTree(root, ExcludeList());
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? *m : Manifest();
  }

  // A small workspace's image, checked by e2fsck.
  void MakeImage(const Manifest& m) {
    Status st = WriteExt4Image(src_, m, image_, Ext4GeometryFor(64 * kMiB, 1000));
    ASSERT_TRUE(st.ok()) << st.ToString();
    RunTool({"e2fsck", "-fn", image_});
  }

  std::optional<TempDir> tmp_;
  std::string src_, image_;
};

TEST_F(Ext4ImageTest, TreeSurvivesImageAndTarRoundTrip) {
  WriteFileWithMode(src_ + "/empty", "", 0644);
  WriteFileWithMode(src_ + "/one", "x", 0600);
  WriteFileWithMode(src_ + "/block", std::string(4096, 'b'), 0644);
  WriteFileWithMode(src_ + "/block+1", std::string(4097, 'c'), 0644);
  WriteFileWithMode(src_ + "/big.bin", RandomBytes(5 * kMiB + 123, 1), 0755);
  WriteFileWithMode(src_ + "/dir with space/caf\xe9 \xff.txt", "latin-1 name", 0644);
  WriteFileWithMode(src_ + "/a/b/c/d/e/deep.sh", "#!/bin/sh\n", 0755);
  Symlink("one", src_ + "/short-link");
  std::string long_target = "../" + std::string(120, 'l') + "/target";
  Symlink(long_target, src_ + "/a/long-link");
  Symlink("/nonexistent/absolute", src_ + "/a/b/dangling");
  // Enough names in one directory to fill several blocks: files, directories and symlinks
  // each grow it (ext2fs_link, ext2fs_mkdir and ext2fs_symlink report a full directory).
  for (int i = 0; i < 200; ++i) {
    std::string n = std::to_string(i) + std::string(40, 'n');
    WriteFileWithMode(src_ + "/many/f" + n, std::to_string(i), 0644);
    WriteFileWithMode(src_ + "/many/d" + n + "/x", "", 0644);
    Symlink("f" + n, src_ + "/many/l" + n);
  }
  Manifest m = TreeManifest(src_);
  ASSERT_EQ(m.size(), 610u);
  ASSERT_TRUE(m.count("dir with space/caf\xe9 \xff.txt"));
  MakeImage(m);

  Ext4ReadReport report;
  auto tar = TarOf(image_, {}, &report);
  ASSERT_TRUE(tar.ok()) << tar.status().ToString();
  EXPECT_EQ(report.sockets, 0u);
  std::string dest = tmp_->path() + "/dest";
  ExtractReport xr;
  Status st = ExtractTar(Chunks(*tar), dest, {}, &xr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(xr.skipped.empty());
  EXPECT_EQ(xr.files, 407u);
  struct stat lf;
  EXPECT_NE(::lstat((dest + "/lost+found").c_str(), &lf), 0) << "an empty lost+found is left out";

  Manifest back = TreeManifest(dest);
  EXPECT_EQ(back, m);
  EXPECT_EQ(back["a/long-link"].target, long_target);
  EXPECT_EQ(back["one"].mode, 0600u);
  EXPECT_EQ(back["big.bin"].mode, 0755u);
  for (const char* p : {"one", "big.bin", "a/b/c/d/e/deep.sh", "short-link"}) {
    struct stat a, b;
    ASSERT_EQ(::lstat((src_ + "/" + p).c_str(), &a), 0);
    ASSERT_EQ(::lstat((dest + "/" + p).c_str(), &b), 0);
    EXPECT_EQ(a.st_mtim.tv_sec, b.st_mtim.tv_sec) << p;
  }
}

TEST_F(Ext4ImageTest, ImageIsOwnedByRootWithDirectories0755) {
  WriteFileWithMode(src_ + "/d/f", "data", 0640);
  MakeImage(TreeManifest(src_));
  std::string out = RunTool({"debugfs", "-R", "stat /d", image_});
  EXPECT_NE(out.find("Mode:  0755"), std::string::npos) << out;
  EXPECT_NE(out.find("User:     0   Group:     0"), std::string::npos) << out;
  out = RunTool({"debugfs", "-R", "stat /d/f", image_});
  EXPECT_NE(out.find("Mode:  0640"), std::string::npos) << out;
  EXPECT_NE(out.find("User:     0   Group:     0"), std::string::npos) << out;
}

TEST_F(Ext4ImageTest, FileChangedAfterManifestIsNamedAndImageRemoved) {
  WriteFileWithMode(src_ + "/stable", "same", 0644);
  WriteFileWithMode(src_ + "/grows", "short", 0644);
  Manifest m = TreeManifest(src_);
  WriteFileWithMode(src_ + "/grows", "much longer now", 0644);
  Status st = WriteExt4Image(src_, m, image_, Ext4GeometryFor(kMiB, 100));
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("grows"), std::string::npos) << st.ToString();
  struct stat sb;
  EXPECT_NE(::stat(image_.c_str(), &sb), 0);
}

TEST_F(Ext4ImageTest, ExistingImageIsRefused) {
  WriteFileWithMode(image_, "precious", 0644);
  Status st = WriteExt4Image(src_, Manifest(), image_, Ext4GeometryFor(kMiB, 100));
  EXPECT_FALSE(st.ok());
  auto kept = ReadFileToString(image_);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, "precious");
}

TEST_F(Ext4ImageTest, ToFdReplacesWhatTheFileHeld) {
  WriteFileWithMode(src_ + "/f", "new", 0644);
  WriteFileWithMode(image_, RandomBytes(3 * kMiB, 7), 0644);
  auto fd = OpenFile(image_, O_RDWR);
  ASSERT_TRUE(fd.ok());
  Ext4Geometry geo = Ext4GeometryFor(kMiB, 100);
  Status st = WriteExt4ImageToFd(src_, TreeManifest(src_), fd->get(), geo);
  ASSERT_TRUE(st.ok()) << st.ToString();
  struct stat sb;
  ASSERT_EQ(::fstat(fd->get(), &sb), 0);
  EXPECT_EQ(static_cast<uint64_t>(sb.st_size), geo.bytes);
  RunTool({"e2fsck", "-fn", image_});

  // A failure leaves no file system behind for a guest to mount.
  Manifest stale = TreeManifest(src_);
  WriteFileWithMode(src_ + "/f", "x", 0644);
  st = WriteExt4ImageToFd(src_, stale, fd->get(), geo);
  EXPECT_FALSE(st.ok());
  ASSERT_EQ(::fstat(fd->get(), &sb), 0);
  EXPECT_EQ(sb.st_size, 0);
}

TEST(Ext4GeometryTest, RoomForQuotaAndEntries) {
  Ext4Geometry small = Ext4GeometryFor(0, 0);
  EXPECT_EQ(small.bytes, 64 * kMiB + 1024 * 256);
  EXPECT_EQ(small.inodes, 1024u);
  Ext4Geometry g = Ext4GeometryFor(1024 * kMiB, 100000);
  EXPECT_EQ(g.bytes % 4096, 0u);
  EXPECT_GE(g.bytes, 1024 * kMiB + 100000ull * 4096);
  EXPECT_EQ(g.inodes, 126024u);
}

// ---- Reading images a guest may have written -------------------------------------------

class Ext4ReadTest : public Ext4ImageTest {};

TEST_F(Ext4ReadTest, TooManyEntriesIsAnError) {
  for (int i = 0; i < 10; ++i) WriteFileWithMode(src_ + "/d/f" + std::to_string(i), "", 0644);
  MakeImage(TreeManifest(src_));
  Ext4ReadLimits limits;
  limits.max_entries = 11;  // d and its ten files; lost+found does not count
  EXPECT_TRUE(TarOf(image_, limits).ok());
  limits.max_entries = 10;
  auto tar = TarOf(image_, limits);
  EXPECT_EQ(tar.status().code(), Code::kResourceExhausted) << tar.status().ToString();
  EXPECT_NE(tar.status().message().find("more than 10 entries"), std::string::npos);
}

TEST_F(Ext4ReadTest, TooDeepOrTooManyBytesIsAnError) {
  WriteFileWithMode(src_ + "/1/2/3/4/f", std::string(1000, 'x'), 0644);
  MakeImage(TreeManifest(src_));
  Ext4ReadLimits limits;
  limits.max_depth = 4;
  auto tar = TarOf(image_, limits);
  EXPECT_EQ(tar.status().code(), Code::kResourceExhausted) << tar.status().ToString();
  EXPECT_NE(tar.status().message().find("deeper than 4"), std::string::npos);
  limits.max_depth = 5;
  limits.max_bytes = 999;
  tar = TarOf(image_, limits);
  EXPECT_EQ(tar.status().code(), Code::kResourceExhausted) << tar.status().ToString();
  limits.max_bytes = 1000;
  EXPECT_TRUE(TarOf(image_, limits).ok());
}

TEST_F(Ext4ReadTest, DirectoryCycleIsAnError) {
  WriteFileWithMode(src_ + "/a/b/f", "x", 0644);
  MakeImage(TreeManifest(src_));
  Debugfs(image_, {"ln /a /a/b/loop"});
  auto tar = TarOf(image_);
  ASSERT_FALSE(tar.ok());
  EXPECT_EQ(tar.status().code(), Code::kInvalidArgument);
  EXPECT_NE(tar.status().message().find("a/b/loop"), std::string::npos);
  EXPECT_NE(tar.status().message().find("cycle"), std::string::npos) << tar.status().ToString();
}

TEST_F(Ext4ReadTest, NameWithSlashIsAnError) {
  MakeImage(Manifest());
  Debugfs(image_, {"mknod /etc p"});  // debugfs takes the whole text as one name
  auto tar = TarOf(image_);
  EXPECT_EQ(tar.status().code(), Code::kInvalidArgument) << tar.status().ToString();
  EXPECT_NE(tar.status().message().find("'/'"), std::string::npos) << tar.status().ToString();
}

TEST_F(Ext4ReadTest, HardLinkedFilesAreWrittenEachTime) {
  WriteFileWithMode(src_ + "/f", "shared", 0644);
  MakeImage(TreeManifest(src_));
  Debugfs(image_, {"ln /f /g", "sif /f links_count 2"});
  auto tar = TarOf(image_);
  ASSERT_TRUE(tar.ok()) << tar.status().ToString();
  std::string dest = tmp_->path() + "/dest";
  ExtractReport xr;
  ASSERT_TRUE(ExtractTar(Chunks(*tar), dest, {}, &xr).ok());
  EXPECT_EQ(*ReadFileToString(dest + "/f"), "shared");
  EXPECT_EQ(*ReadFileToString(dest + "/g"), "shared");
}

TEST_F(Ext4ReadTest, SpecialFilesAreTypedAndSkippedSocketsCounted) {
  WriteFileWithMode(src_ + "/keep", "k", 0644);
  MakeImage(TreeManifest(src_));
  Debugfs(image_, {"mknod fifo p", "mknod null c 1 3", "mknod disk b 8 0", "mknod sock p",
                   "sif sock mode 0140755"});
  Ext4ReadReport report;
  auto tar = TarOf(image_, {}, &report);
  ASSERT_TRUE(tar.ok()) << tar.status().ToString();
  EXPECT_EQ(report.sockets, 1u);
  ASSERT_EQ(report.skipped.size(), 1u);
  EXPECT_EQ(report.skipped[0].path, "sock");
  std::string dest = tmp_->path() + "/dest";
  ExtractReport xr;
  ASSERT_TRUE(ExtractTar(Chunks(*tar), dest, {}, &xr).ok());
  std::map<std::string, std::string> skipped;
  for (const Skipped& s : xr.skipped) skipped[s.path] = s.reason;
  EXPECT_EQ(skipped["fifo"], "a fifo");
  EXPECT_EQ(skipped["null"], "a character device");
  EXPECT_EQ(skipped["disk"], "a block device");
  EXPECT_EQ(skipped.size(), 3u);
  EXPECT_EQ(*ReadFileToString(dest + "/keep"), "k");
}

TEST_F(Ext4ReadTest, NonEmptyLostFoundIsKept) {
  MakeImage(Manifest());
  Debugfs(image_, {"cd /lost+found", "write /dev/null x12"});
  auto tar = TarOf(image_);
  ASSERT_TRUE(tar.ok()) << tar.status().ToString();
  std::string dest = tmp_->path() + "/dest";
  ExtractReport xr;
  ASSERT_TRUE(ExtractTar(Chunks(*tar), dest, {}, &xr).ok());
  struct stat sb;
  EXPECT_EQ(::lstat((dest + "/lost+found/x12").c_str(), &sb), 0);
}

TEST_F(Ext4ReadTest, UnrecoveredJournalIsAnError) {
  WriteFileWithMode(src_ + "/f", "x", 0644);
  MakeImage(TreeManifest(src_));
  Debugfs(image_, {"feature needs_recovery"});
  auto tar = TarOf(image_);
  EXPECT_EQ(tar.status().code(), Code::kFailedPrecondition) << tar.status().ToString();
  EXPECT_NE(tar.status().message().find("journal"), std::string::npos);
}

TEST_F(Ext4ReadTest, TheCallersFdStaysOpen) {
  MakeImage(Manifest());
  auto fd = OpenFile(image_, O_RDONLY);
  ASSERT_TRUE(fd.ok());
  Status st = WriteTarFromExt4(fd->get(), {}, [](std::string_view) { return Status::Ok(); });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(::fcntl(fd->get(), F_GETFD), -1);
}

TEST_F(Ext4ReadTest, NotAFileSystemIsAnError) {
  WriteFileWithMode(image_, RandomBytes(4 * kMiB, 3), 0644);
  auto tar = TarOf(image_);
  EXPECT_EQ(tar.status().code(), Code::kInvalidArgument) << tar.status().ToString();
}

// Inline data (not in the images trybox makes, but a guest may turn it on): small files,
// directories and symlinks held in the inode itself.
TEST_F(Ext4ReadTest, InlineDataIsRead) {
  std::string fs = tmp_->path() + "/inline.img";
  WriteFileWithMode(fs, "", 0644);
  ASSERT_EQ(::truncate(fs.c_str(), 64 * kMiB), 0);
  RunTool({"mke2fs", "-q", "-F", "-t", "ext4", "-O", "inline_data", "-E", "root_owner=0:0", fs});
  WriteFileWithMode(src_ + "/small", "tiny content", 0644);
  WriteFileWithMode(src_ + "/medium", std::string(100, 'm'), 0644);
  std::string target(80, 't');
  Debugfs(fs, {"mkdir d", "cd d", "write " + src_ + "/small small",
               "write " + src_ + "/medium medium", "symlink link " + target});
  std::string stat = RunTool({"debugfs", "-R", "stat /d/medium", fs});
  EXPECT_NE(stat.find("Size of inline data"), std::string::npos) << stat;
  auto tar = TarOf(fs);
  ASSERT_TRUE(tar.ok()) << tar.status().ToString();
  std::string dest = tmp_->path() + "/dest";
  ExtractReport xr;
  ASSERT_TRUE(ExtractTar(Chunks(*tar), dest, {}, &xr).ok());
  EXPECT_EQ(*ReadFileToString(dest + "/d/small"), "tiny content");
  EXPECT_EQ(*ReadFileToString(dest + "/d/medium"), std::string(100, 'm'));
  char buf[200];
  ssize_t n = ::readlink((dest + "/d/link").c_str(), buf, sizeof buf);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), target);
}

// How a read of a corrupt image ended, run in a child so that a crash or a hang is seen
// as one: "ok", "error" or what killed it.
std::string ReadInChild(const std::string& image) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);
    auto tar = TarOf(image, {.max_entries = 100000});
    ::_exit(tar.ok() ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) return WEXITSTATUS(status) == 0 ? "ok" : "error";
  return "killed by signal " + std::to_string(WTERMSIG(status));
}

class Ext4CorruptTest : public Ext4ImageTest {
 protected:
  // File content is all 'A', so that metadata can be told from it.
  void MakeRichImage() {
    for (int i = 0; i < 60; ++i) {
      std::string d = src_ + "/d" + std::to_string(i % 7) + "/e" + std::to_string(i % 3);
      WriteFileWithMode(d + "/f" + std::to_string(i), std::string(i * 997, 'A'), 0644);
      Symlink(std::string(i * 3 + 1, 's'), d + "/l" + std::to_string(i));
    }
    MakeImage(TreeManifest(src_));
  }
  // The image's metadata blocks: neither zeros nor file content.
  static std::vector<uint64_t> MetadataBlocks(const std::string& image) {
    auto data = ReadFileToString(image);
    EXPECT_TRUE(data.ok());
    std::vector<uint64_t> blocks;
    for (uint64_t b = 0; data.ok() && (b + 1) * 4096 <= data->size(); ++b) {
      std::string_view block(data->data() + b * 4096, 4096);
      if (block.find_first_not_of('\0') != std::string_view::npos &&
          block.find_first_not_of('A') != std::string_view::npos) {
        blocks.push_back(b);
      }
    }
    return blocks;
  }
  // Damages a copy of `base` in one of the ways a guest (or a bad disk) could: flipped bits,
  // boundary values in fields, a metadata block copied over another, random runs.
  void Damage(const std::string& base, const std::string& copy, const std::vector<uint64_t>& blocks,
              uint32_t seed) {
    RunTool({"cp", "--sparse=always", base, copy});
    auto fd = OpenFile(copy, O_RDWR);
    ASSERT_TRUE(fd.ok());
    std::mt19937 rng(seed);
    const uint32_t values[] = {0,    1,    2,      11,     12,         60,        255,
                               4095, 4096, 0x7fff, 0xffff, 0x7fffffff, 0xffffffff};
    for (int k = 1 + rng() % 8; k > 0; --k) {
      uint64_t block = blocks[rng() % blocks.size()];
      off_t at = static_cast<off_t>(block * 4096 + rng() % 4096);
      std::string bytes;
      switch (rng() % 4) {
        case 0: {
          char c;
          ASSERT_EQ(::pread(fd->get(), &c, 1, at), 1);
          bytes.assign(1, static_cast<char>(c ^ (1 << rng() % 8)));
          break;
        }
        case 1: {
          uint32_t v = values[rng() % std::size(values)];
          bytes.assign(reinterpret_cast<const char*>(&v), 4);
          at &= ~3;
          break;
        }
        case 2: {
          bytes.resize(4096);
          uint64_t from = blocks[rng() % blocks.size()];
          ASSERT_EQ(::pread(fd->get(), bytes.data(), 4096, static_cast<off_t>(from * 4096)), 4096);
          at = static_cast<off_t>(block * 4096);
          break;
        }
        default:
          bytes = RandomBytes(1 + rng() % 64, rng());
      }
      ASSERT_EQ(::pwrite(fd->get(), bytes.data(), bytes.size(), at),
                static_cast<ssize_t>(bytes.size()));
    }
  }
};

TEST_F(Ext4CorruptTest, DamagedMetadataNeverCrashesOrHangs) {
  MakeRichImage();
  // Checksums stop most damage at the door; without them it reaches the parsers.
  std::string plain = tmp_->path() + "/plain.img";
  RunTool({"cp", "--sparse=always", image_, plain});
  RunTool({"tune2fs", "-O", "^metadata_csum", plain});
  std::map<std::string, int> outcomes;
  for (const std::string& base : {image_, plain}) {
    std::vector<uint64_t> blocks = MetadataBlocks(base);
    ASSERT_GT(blocks.size(), 20u);
    for (uint32_t seed = 1; seed <= 30; ++seed) {
      std::string copy = tmp_->path() + "/copy.img";
      Damage(base, copy, blocks, seed);
      std::string outcome = ReadInChild(copy);
      EXPECT_TRUE(outcome == "ok" || outcome == "error") << "seed " << seed << ": " << outcome;
      ++outcomes[outcome];
    }
  }
  for (const auto& [k, v] : outcomes) std::cout << "  " << k << ": " << v << "\n";
}

TEST_F(Ext4CorruptTest, DamagedDirectoryBlockIsAnError) {
  MakeRichImage();
  // The first block of /d3, as debugfs finds it.
  std::string blocks = RunTool({"debugfs", "-R", "blocks /d3", image_});
  uint64_t block = std::strtoull(blocks.c_str() + blocks.find('\n') + 1, nullptr, 10);
  ASSERT_GT(block, 0u) << blocks;
  RunTool({"tune2fs", "-O", "^metadata_csum", image_});
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    std::string copy = tmp_->path() + "/copy.img";
    RunTool({"cp", "--sparse=always", image_, copy});
    auto fd = OpenFile(copy, O_WRONLY);
    ASSERT_TRUE(fd.ok());
    std::string junk = RandomBytes(4096, seed);
    ASSERT_EQ(::pwrite(fd->get(), junk.data(), 4096, static_cast<off_t>(block * 4096)), 4096);
    std::string outcome = ReadInChild(copy);
    EXPECT_EQ(outcome, "error") << "seed " << seed;
  }
}

}  // namespace
}  // namespace trybox::workspace
