#include "guest/credentials.h"

#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "util/fd.h"
#include "util/names.h"

namespace trybox::guest {
namespace {

// Reasons for each, and for what is dropped: docs/security.md, "Inside the guest".
constexpr uint64_t kKept[] = {
    CapBit(CAP_CHOWN),         CapBit(CAP_DAC_OVERRIDE), CapBit(CAP_FOWNER),
    CapBit(CAP_FSETID),        CapBit(CAP_KILL),         CapBit(CAP_SETGID),
    CapBit(CAP_SETUID),        CapBit(CAP_SETPCAP),      CapBit(CAP_NET_BIND_SERVICE),
    CapBit(CAP_NET_BROADCAST), CapBit(CAP_NET_RAW),      CapBit(CAP_IPC_OWNER),
    CapBit(CAP_SYS_CHROOT),    CapBit(CAP_LEASE),        CapBit(CAP_AUDIT_WRITE),
    CapBit(CAP_SETFCAP),       CapBit(CAP_AUDIT_READ),
};

constexpr uint64_t Union() {
  uint64_t m = 0;
  for (uint64_t b : kKept) m |= b;
  return m;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

// A decimal id below 2^32 - 1 ((uid_t)-1 means "unchanged" to the set*id calls).
std::optional<uint32_t> ParseId(std::string_view s) {
  if (s.empty() || s.size() > 10) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v >= 0xffffffffu) return std::nullopt;
  return static_cast<uint32_t>(v);
}

bool ValidName(std::string_view name) { return !name.empty() && name[0] != '+' && name[0] != '-'; }

template <typename Fn>
void ForEachLine(const std::string& text, Fn&& fn) {
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    fn(std::string_view(text).substr(start, nl - start));
    start = nl + 1;
  }
}

Result<std::string> ReadAccountFile(const std::string& path) {
  auto text = ReadFileToString(path);
  // Not kNotFound: that would read as "no such account".
  if (!text.ok()) return FailedPrecondition("cannot read " + path + ": " + text.status().message());
  return text;
}

int CapSet(uint32_t permitted_lo, uint32_t permitted_hi, uint32_t effective_lo,
           uint32_t effective_hi) {
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2] = {{effective_lo, permitted_lo, 0},
                                           {effective_hi, permitted_hi, 0}};
  return ::syscall(SYS_capset, &header, data) == 0 ? 0 : errno;
}

// Drops every capability outside `keep` from the bounding set. Stops at the first number
// the kernel does not know (EINVAL), so capabilities newer than this code are dropped too.
int DropBounding(uint64_t keep) {
  for (int cap = 0; cap < 64; ++cap) {
    if (keep & CapBit(cap)) continue;
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
      if (errno == EINVAL) return 0;
      return errno;
    }
  }
  return 0;
}

}  // namespace

const uint64_t kCommandCapabilities = Union();

std::optional<PasswdEntry> ParsePasswdLine(std::string_view line) {
  std::vector<std::string_view> f = Split(line, ':');
  if (f.size() != 7 || !ValidName(f[0])) return std::nullopt;
  auto uid = ParseId(f[2]);
  auto gid = ParseId(f[3]);
  if (!uid || !gid) return std::nullopt;
  return PasswdEntry{std::string(f[0]), *uid, *gid, std::string(f[5]), std::string(f[6])};
}

std::optional<GroupEntry> ParseGroupLine(std::string_view line) {
  std::vector<std::string_view> f = Split(line, ':');
  if (f.size() != 4 || !ValidName(f[0])) return std::nullopt;
  auto gid = ParseId(f[2]);
  if (!gid) return std::nullopt;
  GroupEntry g{std::string(f[0]), *gid, {}};
  if (!f[3].empty()) {
    for (std::string_view m : Split(f[3], ',')) {
      if (!m.empty()) g.members.emplace_back(m);
    }
  }
  return g;
}

Result<Account> LookupAccount(const std::string& name, const AccountFiles& files) {
  ASSIGN_OR_RETURN(std::string passwd, ReadAccountFile(files.passwd));
  std::optional<PasswdEntry> entry;
  ForEachLine(passwd, [&](std::string_view line) {
    if (entry) return;
    auto e = ParsePasswdLine(line);
    if (e && e->name == name) entry = std::move(e);
  });
  if (!entry) {
    return NotFound("no account " + QuoteForMessage(name) + " in " + files.passwd);
  }
  ASSIGN_OR_RETURN(std::string group, ReadAccountFile(files.group));
  Account a{entry->name, entry->uid, entry->gid, {entry->gid}, entry->home};
  if (a.home.empty()) a.home = "/";
  ForEachLine(group, [&](std::string_view line) {
    auto g = ParseGroupLine(line);
    if (!g || std::find(g->members.begin(), g->members.end(), name) == g->members.end()) return;
    if (std::find(a.groups.begin(), a.groups.end(), g->gid) == a.groups.end()) {
      a.groups.push_back(g->gid);
    }
  });
  return a;
}

int DropPrivileges(const Credentials& c) {
  switch (c.kind) {
    case Credentials::Kind::kPrivileged:
      return 0;
    case Credentials::Kind::kRootCommand: {
      if (int e = DropBounding(kCommandCapabilities)) return e;
      if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) return errno;
      // execve would already limit a root process to its bounding set; dropping here too
      // also empties the inheritable set, which execve would otherwise carry over.
      struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
      struct __user_cap_data_struct now[2];
      if (::syscall(SYS_capget, &header, now) != 0) return errno;
      const auto lo = static_cast<uint32_t>(kCommandCapabilities);
      const auto hi = static_cast<uint32_t>(kCommandCapabilities >> 32);
      return CapSet(now[0].permitted & lo, now[1].permitted & hi, now[0].effective & lo,
                    now[1].effective & hi);
    }
    case Credentials::Kind::kAccount: {
      // While we still hold CAP_SETPCAP and CAP_SETUID: first the bounding set, then the
      // ids (which clear the permitted and effective sets), then what setuid leaves.
      if (int e = DropBounding(0)) return e;
      if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) return errno;
      if (::syscall(SYS_setgroups, c.groups.size(), c.groups.data()) != 0) return errno;
      if (::syscall(SYS_setresgid, c.gid, c.gid, c.gid) != 0) return errno;
      if (::syscall(SYS_setresuid, c.uid, c.uid, c.uid) != 0) return errno;
      if (int e = CapSet(0, 0, 0, 0)) return e;
      if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno;
      return 0;
    }
  }
  return EINVAL;
}

}  // namespace trybox::guest
