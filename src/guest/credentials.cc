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

struct CapSets {
  uint64_t permitted = 0, effective = 0, inheritable = 0;
};

int CapGet(CapSets* out) {
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  if (::syscall(SYS_capget, &header, d) != 0) return errno;
  auto join = [](uint32_t lo, uint32_t hi) { return lo | uint64_t{hi} << 32; };
  out->permitted = join(d[0].permitted, d[1].permitted);
  out->effective = join(d[0].effective, d[1].effective);
  out->inheritable = join(d[0].inheritable, d[1].inheritable);
  return 0;
}

// Also clears the ambient set of whatever is no longer both permitted and inheritable.
int CapSet(const CapSets& c) {
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2] = {
      {static_cast<uint32_t>(c.effective), static_cast<uint32_t>(c.permitted),
       static_cast<uint32_t>(c.inheritable)},
      {static_cast<uint32_t>(c.effective >> 32), static_cast<uint32_t>(c.permitted >> 32),
       static_cast<uint32_t>(c.inheritable >> 32)}};
  return ::syscall(SYS_capset, &header, d) == 0 ? 0 : errno;
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

int LimitBoundingSetForChildren() {
  CapSets now;
  if (int e = CapGet(&now)) return e;
  // Before the bounding set shrinks: the inheritable set may only hold what it allows.
  now.inheritable = now.permitted;
  if (int e = CapSet(now)) return e;
  return DropBounding(kCommandCapabilities);
}

int DropPrivileges(const Credentials& c) {
  switch (c.kind) {
    case Credentials::Kind::kPrivileged:
      // Root execs with its bounding set plus its inheritable set: with the parent prepared
      // by LimitBoundingSetForChildren, that is the parent's whole permitted set.
      return 0;
    case Credentials::Kind::kRootCommand: {
      // Each drop from the bounding set is a credential copy and commit; trybox-init made
      // them once, for all children, in LimitBoundingSetForChildren. A parent that did not
      // still holds CAP_SYS_ADMIN there (they go together), and the child drops them itself.
      if (::prctl(PR_CAPBSET_READ, CAP_SYS_ADMIN, 0, 0, 0) != 0) {
        if (int e = DropBounding(kCommandCapabilities)) return e;
      }
      // Empty inheritable (and so ambient) set: root then execs with the bounding set alone.
      CapSets now;
      if (int e = CapGet(&now)) return e;
      return CapSet(
          {now.permitted & kCommandCapabilities, now.effective & kCommandCapabilities, 0});
    }
    case Credentials::Kind::kAccount: {
      // While we still hold CAP_SETPCAP and CAP_SETUID: first the bounding set, then the
      // ids (which clear the permitted and effective sets), then the inheritable and ambient
      // sets that setuid leaves.
      if (int e = DropBounding(0)) return e;
      if (::syscall(SYS_setgroups, c.groups.size(), c.groups.data()) != 0) return errno;
      if (::syscall(SYS_setresgid, c.gid, c.gid, c.gid) != 0) return errno;
      if (::syscall(SYS_setresuid, c.uid, c.uid, c.uid) != 0) return errno;
      if (int e = CapSet({})) return e;
      if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno;
      return 0;
    }
  }
  return EINVAL;
}

}  // namespace trybox::guest
