// Who a command runs as. An exec names an account ("user"); trybox-init looks it up in the
// guest's own /etc/passwd and /etc/group (it is static: there is no NSS) and the forked
// child takes on that account, with the capabilities its kind of run keeps. Which
// capabilities and why: docs/security.md, "Inside the guest".
//
// Three kinds of run:
//   - a root command (the default): uid 0, every capability outside kCommandCapabilities
//     dropped from the bounding set, so no setuid binary or file capability brings one back;
//   - a privileged root command: the full set, as trybox-init itself has;
//   - any other account (even one whose uid is 0): its uid, gid and groups, an empty
//     bounding set, no ambient capabilities and no_new_privs.
//
// The lookup is pure parsing plus two file reads, for any thread. DropPrivileges() runs in
// the forked child before execve and makes only raw system calls.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trybox::guest {

inline constexpr const char* kRootUser = "root";

// Where accounts are looked up; tests point these at files of their own.
struct AccountFiles {
  std::string passwd = "/etc/passwd";
  std::string group = "/etc/group";
};

struct PasswdEntry {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string home;
  std::string shell;
};

struct GroupEntry {
  std::string name;
  gid_t gid = 0;
  std::vector<std::string> members;
};

// One line of passwd(5) ("name:password:uid:gid:gecos:home:shell") or group(5)
// ("name:password:gid:member,member"). nullopt for a malformed line: the wrong number of
// fields, an empty name, an NIS "+"/"-" entry, or an id that is not a decimal number below
// 2^32 - 1. Blank lines and '#' comments are malformed too (callers skip them).
std::optional<PasswdEntry> ParsePasswdLine(std::string_view line);
std::optional<GroupEntry> ParseGroupLine(std::string_view line);

struct Account {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // the primary gid, then every group that lists the name
  std::string home;           // "/" if the entry has none
};

// The first well-formed passwd entry named `name`, with its groups. Malformed lines are
// skipped. kNotFound: no such account; kFailedPrecondition: a file could not be read.
Result<Account> LookupAccount(const std::string& name, const AccountFiles& files);

// The capabilities a root command keeps (an allow-list: any capability the kernel knows
// and this does not name is dropped, including ones newer than this code).
inline constexpr uint64_t CapBit(int cap) { return uint64_t{1} << cap; }
extern const uint64_t kCommandCapabilities;

// What a child takes on before execve. Built in the parent: the child must not allocate.
struct Credentials {
  enum class Kind { kRootCommand, kPrivileged, kAccount };
  Kind kind = Kind::kRootCommand;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;

  static Credentials RootCommand() { return {}; }
  static Credentials Privileged() { return {Kind::kPrivileged, 0, 0, {}}; }
  static Credentials Of(const Account& a) { return {Kind::kAccount, a.uid, a.gid, a.groups}; }
};

// For trybox-init's main(), before any thread exists (the bounding set is per thread):
// drops every capability outside kCommandCapabilities from its own bounding set, which
// every child inherits, and copies its permitted set into its inheritable set, so that a
// privileged child still execs with all of them. Its own permitted and effective sets are
// unchanged. Saves each root command the dozens of credential commits of dropping them
// itself (measured under TCG: about 0.1 ms of every exec). 0 or an errno.
int LimitBoundingSetForChildren();

// Applies `c` to the calling thread: async-signal-safe, raw system calls only (glibc's
// set*id wrappers would signal every thread of PID 1 from a child sharing its memory).
// Correct with or without LimitBoundingSetForChildren in the parent, faster with it.
// Returns 0 or the errno of the step that failed.
int DropPrivileges(const Credentials& c);

}  // namespace trybox::guest
