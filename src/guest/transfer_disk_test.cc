// The copies between the transfer disk and a file: every size lands byte for byte (direct
// I/O for the aligned part, buffered for a tail), each side's failure keeps its own name,
// and the descriptors' flags are as they were. A regular file stands in for the disk; /tmp
// (a disk file system) takes direct I/O, /dev/shm (tmpfs) does not, and both must copy alike.
#include "guest/transfer_disk.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>

#include "util/fd.h"

namespace trybox::guest {
namespace {

std::string RandomBytes(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

bool HasDirect(int fd) { return (::fcntl(fd, F_GETFL) & O_DIRECT) != 0; }

class TransferCopyTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    struct stat st;
    if (::stat(GetParam(), &st) != 0) GTEST_SKIP() << GetParam() << " is missing";
    auto dir = TempDir::Make(GetParam(), "transfer_disk_test-");
    ASSERT_TRUE(dir.ok()) << dir.status().message();
    tmp_.emplace(std::move(dir).value());
    if (std::string(GetParam()) == "/tmp") {
      // Else the direct path would go untested here.
      UniqueFd probe = Open("probe", O_RDWR | O_CREAT | O_DIRECT);
      ASSERT_TRUE(probe.valid()) << "/tmp refuses direct I/O";
    }
  }

  // A stand-in disk holding `content`, then junk up to the next sector (what a host's
  // announced size rounds up to), open read-write.
  std::unique_ptr<TransferDisk> Disk(const std::string& content, size_t room = 0) {
    std::string bytes = content;
    bytes.append((512 - bytes.size() % 512) % 512, 'J');
    if (bytes.size() < room) bytes.resize(room, 'J');
    EXPECT_TRUE(WriteFileAtomic(Path("disk"), bytes, 0600).ok());
    UniqueFd fd(::open(Path("disk").c_str(), O_RDWR | O_CLOEXEC));
    EXPECT_TRUE(fd.valid());
    return std::make_unique<TransferDisk>(std::move(fd));
  }
  UniqueFd Open(const std::string& name, int flags) {
    return UniqueFd(::open(Path(name).c_str(), flags | O_CLOEXEC, 0600));
  }
  std::string Path(const std::string& name) const { return tmp_->path() + "/" + name; }
  std::string Read(const std::string& name) {
    auto got = ReadFileToString(Path(name));
    EXPECT_TRUE(got.ok());
    return got.ok() ? *got : "";
  }

  std::optional<TempDir> tmp_;
};

// Sizes around the sector, the page and the copy's 4 MiB chunk.
const size_t kSizes[] = {
    0, 1, 511, 512, 4095, 4096, 4097, 123'457, 4u << 20, (4u << 20) + 1, (9u << 20) + 513};

TEST_P(TransferCopyTest, DiskToFileLandsEverySizeExactly) {
  for (size_t n : kSizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    const std::string content = RandomBytes(n, static_cast<unsigned>(n));
    auto disk = Disk(content);
    ::unlink(Path("out").c_str());
    UniqueFd out = Open("out", O_WRONLY | O_CREAT | O_EXCL);
    ASSERT_TRUE(out.valid());
    CopyErrors e = CopyDiskToFile(*disk, n, out.get());
    EXPECT_TRUE(e.ok()) << e.disk << " " << e.file;
    EXPECT_FALSE(HasDirect(out.get()));
    EXPECT_FALSE(HasDirect(disk->fd_for_io()));
    out.Reset();
    EXPECT_TRUE(Read("out") == content) << "the file differs from what the disk held";
  }
}

TEST_P(TransferCopyTest, FileToDiskLandsEverySizeExactly) {
  for (size_t n : kSizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    const std::string content = RandomBytes(n, static_cast<unsigned>(n) + 7);
    ASSERT_TRUE(WriteFileAtomic(Path("in"), content, 0600).ok());
    auto disk = Disk("", 16 << 20);
    UniqueFd in = Open("in", O_RDONLY);
    ASSERT_TRUE(in.valid());
    uint64_t bytes = 99;
    CopyErrors e = CopyFileToDisk(in.get(), *disk, 16 << 20, &bytes);
    EXPECT_TRUE(e.ok()) << e.disk << " " << e.file;
    EXPECT_EQ(bytes, n);
    EXPECT_FALSE(HasDirect(in.get()));
    EXPECT_FALSE(HasDirect(disk->fd_for_io()));
    EXPECT_TRUE(Read("disk").substr(0, n) == content) << "the disk differs from the file";
  }
}

TEST_P(TransferCopyTest, AFileLargerThanTheRoomIsTheDisksToRefuse) {
  const std::string content = RandomBytes((4u << 20) + 100, 1);
  ASSERT_TRUE(WriteFileAtomic(Path("in"), content, 0600).ok());
  auto disk = Disk("", 8 << 20);
  UniqueFd in = Open("in", O_RDONLY);
  uint64_t bytes = 0;
  CopyErrors e = CopyFileToDisk(in.get(), *disk, 4u << 20, &bytes);
  EXPECT_EQ(e.disk, ENOSPC);
  EXPECT_EQ(e.file, 0);
  EXPECT_LE(bytes, 4u << 20);
}

TEST_P(TransferCopyTest, ADiskShorterThanAnnouncedIsAnErrorOfTheDisk) {
  auto disk = Disk(RandomBytes(4096, 2));
  UniqueFd out = Open("out", O_WRONLY | O_CREAT | O_EXCL);
  CopyErrors e = CopyDiskToFile(*disk, 3u << 20, out.get());
  EXPECT_EQ(e.disk, EIO);
  EXPECT_EQ(e.file, 0);
}

TEST_P(TransferCopyTest, AFileThatCannotBeWrittenOrReadIsAnErrorOfTheFile) {
  ASSERT_TRUE(WriteFileAtomic(Path("ro"), "x", 0600).ok());
  auto disk = Disk(RandomBytes(8192, 3), 8192);
  UniqueFd ro = Open("ro", O_RDONLY);
  CopyErrors e = CopyDiskToFile(*disk, 8192, ro.get());
  EXPECT_EQ(e.disk, 0);
  EXPECT_EQ(e.file, EBADF);
  UniqueFd wo = Open("ro", O_WRONLY);
  uint64_t bytes = 0;
  e = CopyFileToDisk(wo.get(), *disk, 8192, &bytes);
  EXPECT_EQ(e.disk, 0);
  EXPECT_EQ(e.file, EBADF);
}

INSTANTIATE_TEST_SUITE_P(FileSystems, TransferCopyTest, ::testing::Values("/tmp", "/dev/shm"),
                         [](const auto& info) {
                           return std::string(info.param) == "/tmp" ? "DiskFileSystem" : "Tmpfs";
                         });

}  // namespace
}  // namespace trybox::guest
