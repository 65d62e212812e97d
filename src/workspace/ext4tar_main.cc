// trybox-ext4tar: a guest's workspace image (ext4) read into a tar stream, in a process of
// its own because the image is hostile (workspace/ext4.h). tryboxd starts it with the image
// open read-only as fd 3 and reads the tar from its stdout, for ExtractTar. It sandboxes
// itself (agent/sandbox.h) before reading a byte of the image.
//
// Usage (by tryboxd only): trybox-ext4tar MAX_ENTRIES [--max-bytes N] [--uid UID]
// Exit 0 with the whole tar written; 1 with one line `trybox-ext4tar: <reason>` on stderr.
#include <ext2fs/ext2fs.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>

#include "agent/sandbox.h"
#include "util/fd.h"
#include "util/utf8.h"
#include "workspace/ext4.h"

namespace {

constexpr int kImageFd = 3;

std::optional<uint64_t> Number(const char* s) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || s[0] == '-') return std::nullopt;
  return v;
}

// A forged image can make libext2fs walk one block endlessly (an extent tree whose index
// entries all lead to the same nodes), and a guest can rewrite the disk while it is read,
// so no check up front bounds the work: the kernel does. A minute, plus a second per 32 MiB
// of image (reading runs at 500 MiB/s and more here).
void LimitCpu(int image_fd) {
  struct stat st;
  rlim_t secs = 60;
  if (::fstat(image_fd, &st) == 0 && st.st_size > 0) secs += st.st_size >> 25;
  rlimit lim{secs, secs + 5};  // SIGXCPU, then SIGKILL
  (void)::setrlimit(RLIMIT_CPU, &lim);
}

int Fail(const std::string& reason) {
  std::cerr << "trybox-ext4tar: " << reason << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The daemon dying takes this process with it; a daemon that stops reading is an error.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::signal(SIGPIPE, SIG_IGN);
  trybox::workspace::Ext4ReadLimits limits;
  std::optional<uid_t> uid;
  std::optional<uint64_t> max_entries = argc > 1 ? Number(argv[1]) : std::nullopt;
  bool usage_ok = max_entries.has_value();
  for (int i = 2; usage_ok && i < argc; i += 2) {
    std::optional<uint64_t> v = i + 1 < argc ? Number(argv[i + 1]) : std::nullopt;
    if (v && std::strcmp(argv[i], "--uid") == 0) {
      uid = static_cast<uid_t>(*v);
    } else if (v && std::strcmp(argv[i], "--max-bytes") == 0) {
      limits.max_bytes = *v;
    } else {
      usage_ok = false;
    }
  }
  if (!usage_ok) {
    std::cerr << "usage: trybox-ext4tar MAX_ENTRIES [--max-bytes N] [--uid UID] (started by "
                 "tryboxd, the image on fd 3)\n";
    return 2;
  }
  limits.max_entries = *max_entries;
  LimitCpu(kImageFd);
  // Loaded before the sandbox: nothing after it can open a file.
  initialize_ext2_error_table();
  auto sandbox = trybox::agent::EnterSandbox(uid);
  if (!sandbox.ok()) return Fail("sandbox: " + sandbox.status().ToString());

  trybox::workspace::Ext4ReadReport report;
  trybox::Status st = trybox::workspace::WriteTarFromExt4(
      kImageFd, limits, [](std::string_view s) { return trybox::WriteFull(1, s); }, &report);
  if (!st.ok()) return Fail(st.ToString());
  // Sockets, which a tar cannot hold, are named for the daemon's report: one line each,
  // the path's bytes in hex (docs/protocol/guest.md, "The workspace disk").
  for (const auto& skipped : report.skipped) {
    std::cerr << "skipped\t" << trybox::HexEncode(skipped.path) << "\n";
  }
  if (report.sockets > report.skipped.size()) {
    std::cerr << "skipped_more\t" << report.sockets - report.skipped.size() << "\n";
  }
  return 0;
}
