#include "image/kernel.h"

#include <archive.h>
#include <archive_entry.h>
#include <elf.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>

namespace trybox::image {
namespace {

struct ReadDeleter {
  void operator()(archive* a) const { archive_read_free(a); }
};
struct WriteDeleter {
  void operator()(archive* a) const { archive_write_free(a); }
};
struct EntryDeleter {
  void operator()(archive_entry* e) const { archive_entry_free(e); }
};

Status ArchiveError(archive* a, const std::string& what) {
  const char* msg = archive_error_string(a);
  return Internal(what + ": " + (msg ? msg : "libarchive error"));
}

bool ReadElfHeader(std::string_view d, Elf64_Ehdr* eh) {
  if (d.size() < sizeof(Elf64_Ehdr) || std::memcmp(d.data(), ELFMAG, SELFMAG) != 0 ||
      d[EI_CLASS] != ELFCLASS64) {
    return false;
  }
  std::memcpy(eh, d.data(), sizeof *eh);
  return true;
}

// Program headers, if they lie within `d`.
std::vector<Elf64_Phdr> ProgramHeaders(std::string_view d, const Elf64_Ehdr& eh) {
  std::vector<Elf64_Phdr> out;
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phoff > d.size() ||
      (d.size() - eh.e_phoff) / sizeof(Elf64_Phdr) < eh.e_phnum) {
    return out;
  }
  out.resize(eh.e_phnum);
  std::memcpy(out.data(), d.data() + eh.e_phoff, eh.e_phnum * sizeof(Elf64_Phdr));
  return out;
}

// How many bytes the ELF at the start of `d` spans by its own headers. 0 if `d` does not
// start with an ELF64 header; more than d.size() if `d` is cut short.
uint64_t ElfExtent(std::string_view d) {
  Elf64_Ehdr eh;
  if (!ReadElfHeader(d, &eh)) return 0;
  // Offsets past 1 TiB are nonsense; capping them keeps the sums below from overflowing.
  constexpr uint64_t kMax = uint64_t{1} << 40;
  auto end_of = [&](uint64_t off, uint64_t len) {
    return std::min(off, kMax) + std::min(len, kMax);
  };
  uint64_t end = sizeof eh;
  end = std::max(end, end_of(eh.e_phoff, uint64_t{eh.e_phnum} * eh.e_phentsize));
  end = std::max(end, end_of(eh.e_shoff, uint64_t{eh.e_shnum} * eh.e_shentsize));
  for (const Elf64_Phdr& ph : ProgramHeaders(d, eh))
    end = std::max(end, end_of(ph.p_offset, ph.p_filesz));
  return end;
}

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

// "kernel/drivers/char/hw_random/virtio-rng.ko.xz" -> "virtio_rng".
std::string ModuleName(std::string_view path) {
  size_t slash = path.rfind('/');
  std::string name(slash == std::string_view::npos ? path : path.substr(slash + 1));
  size_t ko = name.find(".ko");
  if (ko != std::string::npos) name.resize(ko);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

class CpioWriter {
 public:
  static Result<CpioWriter> Open(const std::string& path) {
    std::unique_ptr<archive, WriteDeleter> a(archive_write_new());
    if (!a) return Internal("archive_write_new failed");
    if (archive_write_set_format_cpio_newc(a.get()) != ARCHIVE_OK ||
        archive_write_add_filter_none(a.get()) != ARCHIVE_OK ||
        // No padding to a 10 KiB block: the kernel does not need it.
        archive_write_set_bytes_in_last_block(a.get(), 1) != ARCHIVE_OK ||
        archive_write_open_filename(a.get(), path.c_str()) != ARCHIVE_OK) {
      return ArchiveError(a.get(), "write " + path);
    }
    return CpioWriter(std::move(a), path);
  }

  Status Dir(const std::string& path, mode_t perm = 0755) {
    return Add(path, AE_IFDIR, perm, "", 0);
  }
  Status File(const std::string& path, std::string_view data, mode_t perm) {
    return Add(path, AE_IFREG, perm, data, 0);
  }
  Status CharDev(const std::string& path, mode_t perm, unsigned major, unsigned minor) {
    return Add(path, AE_IFCHR, perm, "", makedev(major, minor));
  }

  Status Close() {
    if (archive_write_close(a_.get()) != ARCHIVE_OK)
      return ArchiveError(a_.get(), "write " + path_);
    return Status::Ok();
  }

 private:
  CpioWriter(std::unique_ptr<archive, WriteDeleter> a, std::string path)
      : a_(std::move(a)), path_(std::move(path)) {}

  Status Add(const std::string& name, unsigned type, mode_t perm, std::string_view data,
             dev_t rdev) {
    std::unique_ptr<archive_entry, EntryDeleter> e(archive_entry_new());
    archive_entry_set_pathname(e.get(), name.c_str());
    archive_entry_set_filetype(e.get(), type);
    archive_entry_set_perm(e.get(), perm);
    archive_entry_set_uid(e.get(), 0);
    archive_entry_set_gid(e.get(), 0);
    archive_entry_set_mtime(e.get(), 0, 0);
    // Distinct inode numbers and nlink 1: the kernel treats entries sharing (ino, nlink > 1)
    // as hard links.
    archive_entry_set_ino(e.get(), ++ino_);
    archive_entry_set_nlink(e.get(), type == AE_IFDIR ? 2 : 1);
    if (type == AE_IFCHR) archive_entry_set_rdev(e.get(), rdev);
    archive_entry_set_size(e.get(), static_cast<la_int64_t>(data.size()));
    if (archive_write_header(a_.get(), e.get()) != ARCHIVE_OK) {
      return ArchiveError(a_.get(), "cpio entry " + name);
    }
    if (!data.empty() && archive_write_data(a_.get(), data.data(), data.size()) !=
                             static_cast<la_ssize_t>(data.size())) {
      return ArchiveError(a_.get(), "cpio data " + name);
    }
    return Status::Ok();
  }

  std::unique_ptr<archive, WriteDeleter> a_;
  std::string path_;
  unsigned ino_ = 0;
};

}  // namespace

Status Decompress(std::string_view data, std::string* out) {
  out->clear();
  std::unique_ptr<archive, ReadDeleter> a(archive_read_new());
  if (!a) return Internal("archive_read_new failed");
  archive_read_support_filter_all(a.get());
  archive_read_support_format_raw(a.get());
  if (archive_read_open_memory(a.get(), data.data(), data.size()) != ARCHIVE_OK) {
    return ArchiveError(a.get(), "decompress");
  }
  archive_entry* entry;
  if (archive_read_next_header(a.get(), &entry) != ARCHIVE_OK) {
    return ArchiveError(a.get(), "decompress");
  }
  std::vector<char> buf(1 << 20);
  for (;;) {
    la_ssize_t n = archive_read_data(a.get(), buf.data(), buf.size());
    if (n == 0) return Status::Ok();
    if (n < 0) return ArchiveError(a.get(), "decompress");
    out->append(buf.data(), static_cast<size_t>(n));
  }
}

Result<std::string> ExtractVmlinux(std::string_view bzimage) {
  static constexpr std::string_view kXzMagic(
      "\xFD"
      "7zXZ\0",
      6);
  constexpr size_t kHeaderSize = 12, kFooterSize = 12;
  std::string last_problem = "no XZ stream in it";
  // The magic can occur by chance before the payload; try each occurrence.
  for (size_t pos = bzimage.find(kXzMagic); pos != std::string_view::npos;
       pos = bzimage.find(kXzMagic, pos + 1)) {
    std::string_view rest = bzimage.substr(pos);
    if (rest.size() < kHeaderSize + kFooterSize) break;
    // libarchive drops the last decoded block when bytes follow the stream (here the rest
    // of the bzImage), so cut the stream at its end: the footer ends with the header's two
    // flag bytes and "YZ". A false match fails to decode and the next one is tried.
    std::string footer_end = std::string(rest.substr(6, 2)) + "YZ";
    for (size_t f = rest.find(footer_end, kHeaderSize + kFooterSize - footer_end.size());
         f != std::string_view::npos; f = rest.find(footer_end, f + 1)) {
      std::string out;
      Status st = Decompress(rest.substr(0, f + footer_end.size()), &out);
      if (!st.ok()) {
        last_problem = "the XZ stream at offset " + std::to_string(pos) + " does not decode (" +
                       st.message() + ")";
        continue;
      }
      uint64_t extent = ElfExtent(out);
      if (extent == 0) {
        last_problem = "the XZ stream at offset " + std::to_string(pos) + " is not an ELF kernel";
      } else if (out.size() < extent) {
        last_problem = "the ELF at offset " + std::to_string(pos) + " is cut short (" +
                       std::to_string(out.size()) + " of " + std::to_string(extent) + " bytes)";
      } else {
        return out;
      }
      break;
    }
  }
  return FailedPrecondition("cannot extract vmlinux from the bzImage: " + last_problem +
                            " (is the kernel built with CONFIG_KERNEL_XZ?)");
}

Status CheckStaticElf(std::string_view data, const std::string& what) {
  Elf64_Ehdr eh;
  if (!ReadElfHeader(data, &eh) || (eh.e_type != ET_EXEC && eh.e_type != ET_DYN)) {
    return FailedPrecondition(what + " is not a 64-bit ELF executable");
  }
  std::vector<Elf64_Phdr> phdrs = ProgramHeaders(data, eh);
  if (phdrs.empty()) return FailedPrecondition(what + " has no program headers");
  for (const Elf64_Phdr& ph : phdrs) {
    if (ph.p_type == PT_INTERP) {
      return FailedPrecondition(what +
                                " is dynamically linked; the initramfs has no shared "
                                "libraries, so it must be static");
    }
  }
  return Status::Ok();
}

Result<std::vector<std::string>> ModuleLoadOrder(const std::string& modules_dep_text,
                                                 const std::vector<std::string>& wanted_names) {
  std::map<std::string, std::vector<std::string>> deps;  // path -> its dependencies
  std::map<std::string, std::string> by_name;            // ModuleName -> path
  std::istringstream in(modules_dep_text);
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (Trim(line).empty()) continue;
    size_t colon = line.find(':');
    std::string path = colon == std::string::npos ? "" : Trim(line.substr(0, colon));
    if (path.empty()) {
      return InvalidArgument("modules.dep line " + std::to_string(lineno) +
                             " is not 'module: deps...'");
    }
    std::vector<std::string> list;
    std::istringstream rest(line.substr(colon + 1));
    for (std::string dep; rest >> dep;) list.push_back(dep);
    // The first entry wins for a name, as with modprobe (updates/ is listed first).
    by_name.emplace(ModuleName(path), path);
    deps.emplace(path, std::move(list));
  }

  std::vector<std::string> order;
  std::map<std::string, int> state;  // 1 = visiting, 2 = done
  std::function<Status(const std::string&)> visit = [&](const std::string& path) -> Status {
    int& s = state[path];
    if (s == 2) return Status::Ok();
    if (s == 1) return InvalidArgument("modules.dep has a dependency cycle through " + path);
    s = 1;
    auto it = deps.find(path);
    if (it != deps.end()) {
      // modprobe loads a dependency list from its end; keep its order where it is free.
      for (auto dep = it->second.rbegin(); dep != it->second.rend(); ++dep) {
        RETURN_IF_ERROR(visit(*dep));
      }
    }
    state[path] = 2;
    order.push_back(path);
    return Status::Ok();
  };
  for (const std::string& w : wanted_names) {
    auto it = by_name.find(ModuleName(w));
    if (it == by_name.end()) return NotFound("kernel module '" + w + "' is not in modules.dep");
    RETURN_IF_ERROR(visit(it->second));
  }
  return order;
}

std::string StoredModulePath(const std::string& module_path) {
  size_t ko = module_path.rfind(".ko");
  if (ko == std::string::npos) return module_path;
  return module_path.substr(0, ko + 3);
}

Status WriteInitramfs(const InitramfsSpec& spec, const std::string& path) {
  const std::string mod_root = "lib/modules/" + spec.kernel_version;
  // A set sorts every directory after its parent, which cpio extraction needs.
  std::set<std::string> dirs = {"dev", "proc", "sys", "run", "mnt", "etc", "etc/trybox", "lib"};
  std::string load_list;
  for (const auto& [rel, data] : spec.modules) {
    std::string full = mod_root + "/" + rel;
    for (size_t slash = full.find('/'); slash != std::string::npos;
         slash = full.find('/', slash + 1)) {
      dirs.insert(full.substr(0, slash));
    }
    load_list += rel + "\n";
  }
  for (size_t slash = mod_root.find('/'); slash != std::string::npos;
       slash = mod_root.find('/', slash + 1)) {
    dirs.insert(mod_root.substr(0, slash));
  }
  dirs.insert(mod_root);

  ASSIGN_OR_RETURN(CpioWriter w, CpioWriter::Open(path));
  for (const std::string& d : dirs) RETURN_IF_ERROR(w.Dir(d));
  RETURN_IF_ERROR(w.Dir("tmp", 01777));
  RETURN_IF_ERROR(w.CharDev("dev/console", 0600, 5, 1));
  RETURN_IF_ERROR(w.CharDev("dev/null", 0666, 1, 3));
  RETURN_IF_ERROR(w.File("init", spec.init, 0755));
  RETURN_IF_ERROR(w.File("etc/trybox/kernel_version", spec.kernel_version + "\n", 0644));
  RETURN_IF_ERROR(w.File("etc/trybox/modules.load", load_list, 0644));
  for (const auto& [rel, data] : spec.modules) {
    RETURN_IF_ERROR(w.File(mod_root + "/" + rel, data, 0644));
  }
  return w.Close();
}

}  // namespace trybox::image
