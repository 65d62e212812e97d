#include "image/kernel.h"

#include <archive.h>
#include <archive_entry.h>
#include <elf.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstring>
#include <map>
#include <optional>

#include "util/fd.h"

namespace trybox::image {
namespace {

// A minimal ELF64 executable of `size` bytes whose one PT_LOAD segment spans the file.
std::string FakeElf(size_t size, bool with_interp = false) {
  std::string out(size, '\0');
  for (size_t i = sizeof(Elf64_Ehdr) + 2 * sizeof(Elf64_Phdr); i < size; ++i) {
    out[i] = static_cast<char>(i * 7);
  }
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_type = ET_EXEC;
  eh.e_phoff = sizeof eh;
  eh.e_phentsize = sizeof(Elf64_Phdr);
  eh.e_phnum = with_interp ? 2 : 1;
  std::memcpy(out.data(), &eh, sizeof eh);
  Elf64_Phdr load{};
  load.p_type = PT_LOAD;
  load.p_filesz = size;
  std::memcpy(out.data() + sizeof eh, &load, sizeof load);
  if (with_interp) {
    Elf64_Phdr interp{};
    interp.p_type = PT_INTERP;
    std::memcpy(out.data() + sizeof eh + sizeof load, &interp, sizeof interp);
  }
  return out;
}

std::string Compress(const std::string& data, int (*add_filter)(archive*)) {
  std::string buf(data.size() + 65536, '\0');
  size_t used = 0;
  archive* a = archive_write_new();
  archive_write_set_format_raw(a);
  add_filter(a);
  archive_write_open_memory(a, buf.data(), buf.size(), &used);
  archive_entry* e = archive_entry_new();
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
  archive_write_header(a, e);
  archive_write_data(a, data.data(), data.size());
  archive_write_close(a);
  archive_entry_free(e);
  archive_write_free(a);
  buf.resize(used);
  return buf;
}

TEST(ModuleLoadOrderTest, DependenciesComeFirstAndOnce) {
  const std::string dep =
      "kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko\n"
      "kernel/fs/jbd2/jbd2.ko:\n"
      "kernel/fs/mbcache.ko:\n"
      "kernel/lib/crc16.ko:\n"
      "kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko\n"
      "kernel/drivers/virtio/virtio_ring.ko:\n"
      "kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko "
      "kernel/drivers/virtio/virtio_ring.ko\n"
      "kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko "
      "kernel/drivers/virtio/virtio_ring.ko\n"
      "kernel/fs/overlayfs/overlay.ko:\n"
      "kernel/sound/unrelated.ko: kernel/lib/crc16.ko\n";
  auto order = ModuleLoadOrder(dep, {"virtio_mmio", "virtio_blk", "ext4", "overlay"});
  ASSERT_TRUE(order.ok()) << order.status().ToString();
  EXPECT_EQ(*order, (std::vector<std::string>{
                        "kernel/drivers/virtio/virtio_ring.ko",
                        "kernel/drivers/virtio/virtio.ko",
                        "kernel/drivers/virtio/virtio_mmio.ko",
                        "kernel/drivers/block/virtio_blk.ko",
                        "kernel/fs/jbd2/jbd2.ko",
                        "kernel/fs/mbcache.ko",
                        "kernel/lib/crc16.ko",
                        "kernel/fs/ext4/ext4.ko",
                        "kernel/fs/overlayfs/overlay.ko",
                    }));
}

TEST(ModuleLoadOrderTest, OrderHoldsEvenWhenDependencyListIsUnsorted) {
  // virtio.ko is listed before the virtio_ring.ko it needs; its own line says so.
  const std::string dep =
      "a/virtio_mmio.ko: a/virtio_ring.ko a/virtio.ko\n"
      "a/virtio.ko: a/virtio_ring.ko\n"
      "a/virtio_ring.ko:\n";
  auto order = ModuleLoadOrder(dep, {"virtio_mmio"});
  ASSERT_TRUE(order.ok());
  EXPECT_EQ(*order,
            (std::vector<std::string>{"a/virtio_ring.ko", "a/virtio.ko", "a/virtio_mmio.ko"}));
}

TEST(ModuleLoadOrderTest, DashAndUnderscoreMatchAndCompressedNamesWork) {
  const std::string dep =
      "kernel/drivers/char/hw_random/virtio-rng.ko.xz: kernel/drivers/virtio/virtio.ko.zst\n"
      "kernel/drivers/virtio/virtio.ko.zst:\n";
  auto order = ModuleLoadOrder(dep, {"virtio_rng", "virtio-rng"});
  ASSERT_TRUE(order.ok()) << order.status().ToString();
  EXPECT_EQ(*order, (std::vector<std::string>{"kernel/drivers/virtio/virtio.ko.zst",
                                              "kernel/drivers/char/hw_random/virtio-rng.ko.xz"}));
  EXPECT_EQ(StoredModulePath((*order)[1]), "kernel/drivers/char/hw_random/virtio-rng.ko");
  EXPECT_EQ(StoredModulePath("kernel/fs/ext4/ext4.ko"), "kernel/fs/ext4/ext4.ko");
}

TEST(ModuleLoadOrderTest, UnknownModuleIsNotFoundByName) {
  auto order = ModuleLoadOrder("a/x.ko:\n", {"x", "virtio_gpu"});
  EXPECT_EQ(order.status().code(), Code::kNotFound);
  EXPECT_NE(order.status().message().find("'virtio_gpu'"), std::string::npos);
}

TEST(ModuleLoadOrderTest, CycleIsAnError) {
  auto order = ModuleLoadOrder("a/x.ko: a/y.ko\na/y.ko: a/x.ko\n", {"x"});
  EXPECT_EQ(order.status().code(), Code::kInvalidArgument);
  EXPECT_NE(order.status().message().find("cycle"), std::string::npos);
}

TEST(ModuleLoadOrderTest, LineWithoutColonIsAnError) {
  auto order = ModuleLoadOrder("a/x.ko\n", {"x"});
  EXPECT_EQ(order.status().code(), Code::kInvalidArgument);
  EXPECT_NE(order.status().message().find("line 1"), std::string::npos);
}

TEST(ExtractVmlinuxTest, FindsXzElfAfterFalseMagicAndIgnoresTrailingBytes) {
  std::string elf = FakeElf(200000);
  std::string bz = std::string(5000, 'x') +
                   std::string(
                       "\xFD"
                       "7zXZ\0garbage",
                       13) +
                   std::string(100, 'y') + Compress(elf, archive_write_add_filter_xz) +
                   "trailing bytes of the bzImage";
  auto out = ExtractVmlinux(bz);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, elf);
}

TEST(ExtractVmlinuxTest, TruncatedStreamIsAnError) {
  std::string xz = Compress(FakeElf(200000), archive_write_add_filter_xz);
  auto out = ExtractVmlinux(xz.substr(0, xz.size() / 2));
  EXPECT_EQ(out.status().code(), Code::kFailedPrecondition);
}

TEST(ExtractVmlinuxTest, NonElfPayloadIsAnError) {
  auto out = ExtractVmlinux(Compress(std::string(1000, 'z'), archive_write_add_filter_xz));
  EXPECT_EQ(out.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(out.status().message().find("not an ELF"), std::string::npos);
  EXPECT_EQ(ExtractVmlinux("no magic here").status().code(), Code::kFailedPrecondition);
}

TEST(DecompressTest, ReadsZstdAndXzModules) {
  std::string ko = FakeElf(4096);
  for (auto filter : {archive_write_add_filter_xz, archive_write_add_filter_zstd}) {
    std::string out;
    Status st = Decompress(Compress(ko, filter), &out);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(out, ko);
  }
}

TEST(CheckStaticElfTest, AcceptsStaticRejectsDynamicAndNonElf) {
  EXPECT_TRUE(CheckStaticElf(FakeElf(4096), "init").ok());
  Status dynamic = CheckStaticElf(FakeElf(4096, /*with_interp=*/true), "init binary /x");
  EXPECT_EQ(dynamic.code(), Code::kFailedPrecondition);
  EXPECT_NE(dynamic.message().find("init binary /x is dynamically linked"), std::string::npos);
  EXPECT_EQ(CheckStaticElf("#!/bin/sh\n", "init").code(), Code::kFailedPrecondition);
}

struct CpioEntry {
  mode_t type = 0;
  mode_t perm = 0;
  dev_t rdev = 0;
  std::string data;
};

std::vector<std::pair<std::string, CpioEntry>> ReadCpio(const std::string& path) {
  std::vector<std::pair<std::string, CpioEntry>> out;
  archive* a = archive_read_new();
  archive_read_support_format_cpio(a);
  EXPECT_EQ(archive_read_open_filename(a, path.c_str(), 65536), ARCHIVE_OK);
  archive_entry* e;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    CpioEntry c;
    c.type = archive_entry_filetype(e);
    c.perm = archive_entry_perm(e);
    c.rdev = archive_entry_rdev(e);
    char buf[8192];
    for (la_ssize_t n; (n = archive_read_data(a, buf, sizeof buf)) > 0;) c.data.append(buf, n);
    out.emplace_back(archive_entry_pathname(e), c);
  }
  archive_read_free(a);
  return out;
}

TEST(WriteInitramfsTest, HasInitModulesLoadListAndDeviceNodes) {
  auto tmp = TempDir::Make("/tmp", "kernel_test-");
  ASSERT_TRUE(tmp.ok());
  InitramfsSpec spec;
  spec.kernel_version = "6.1.0-57-amd64";
  spec.init = FakeElf(8192);
  spec.modules = {{"kernel/drivers/virtio/virtio_ring.ko", "ring"},
                  {"kernel/fs/ext4/ext4.ko", "ext4"}};
  std::string path = tmp->path() + "/initrd.cpio";
  ASSERT_TRUE(WriteInitramfs(spec, path).ok());

  auto entries = ReadCpio(path);
  std::map<std::string, CpioEntry> by_path(entries.begin(), entries.end());
  ASSERT_EQ(by_path.size(), entries.size()) << "duplicate entries";

  EXPECT_EQ(by_path["init"].type, AE_IFREG);
  EXPECT_EQ(by_path["init"].perm, 0755u);
  EXPECT_EQ(by_path["init"].data, spec.init);
  EXPECT_EQ(by_path["dev/console"].type, AE_IFCHR);
  EXPECT_EQ(by_path["dev/console"].rdev, makedev(5, 1));
  EXPECT_EQ(by_path["dev/null"].rdev, makedev(1, 3));
  EXPECT_EQ(by_path["tmp"].perm, 01777u);
  EXPECT_EQ(by_path["etc/trybox/kernel_version"].data, "6.1.0-57-amd64\n");
  EXPECT_EQ(by_path["etc/trybox/modules.load"].data,
            "kernel/drivers/virtio/virtio_ring.ko\nkernel/fs/ext4/ext4.ko\n");
  EXPECT_EQ(by_path["lib/modules/6.1.0-57-amd64/kernel/fs/ext4/ext4.ko"].data, "ext4");
  EXPECT_EQ(by_path["lib/modules/6.1.0-57-amd64/kernel/fs/ext4/ext4.ko"].perm, 0644u);
  for (const char* d : {"proc", "sys", "run", "mnt", "lib/modules/6.1.0-57-amd64/kernel/fs"}) {
    EXPECT_EQ(by_path[d].type, AE_IFDIR) << d;
  }

  // Every entry's parent directory comes before it.
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < entries.size(); ++i) index[entries[i].first] = i;
  for (size_t i = 0; i < entries.size(); ++i) {
    size_t slash = entries[i].first.rfind('/');
    if (slash == std::string::npos) continue;
    std::string parent = entries[i].first.substr(0, slash);
    ASSERT_TRUE(index.count(parent)) << parent;
    EXPECT_LT(index[parent], i) << entries[i].first;
  }
}

}  // namespace
}  // namespace trybox::image
