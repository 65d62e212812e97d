// The CLI's side of trybox-tar (cli/tree_tar.h): in a file of its own, so that linking it
// does not bring libarchive into the CLI (a static library's object comes whole).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include "cli/tree_tar.h"
#include "util/fd.h"

namespace trybox::cli {
namespace {

constexpr size_t kMaxVerdictBytes = 64 * 1024;

}  // namespace

mode_t GuestPermissionMask(mode_t umask) { return 0777 & ~(umask | 022); }

mode_t GuestPermissionMask() {
  // "Umask:\t0022" (Linux 4.7 on); if it cannot be read, the strictest common choice.
  mode_t umask = 077;
  if (auto status = ReadFileToString("/proc/self/status"); status.ok()) {
    size_t at = status->find("\nUmask:");
    if (at != std::string::npos) {
      umask = static_cast<mode_t>(std::strtoul(status->c_str() + at + 7, nullptr, 8)) & 0777;
    }
  }
  return GuestPermissionMask(umask);
}

std::string TreeTarFailureLine(const Status& st) {
  std::string msg = st.message();
  for (char& c : msg) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  return std::string("trybox-tar: ") + CodeName(st.code()) + "\t" + msg + "\n";
}

Result<TreeTar> StartTreeTar(const std::string& verb, const std::string& dir) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoError("socketpair for trybox-tar");
  }
  UniqueFd ours(sv[0]), theirs(sv[1]);
  int ep[2];
  if (::pipe2(ep, O_CLOEXEC) != 0) return ErrnoError("pipe for trybox-tar");
  UniqueFd err_read(ep[0]), err_write(ep[1]);
  // The helper's end is only read (unpack) or only written (pack); ours the other way.
  (void)::shutdown(ours.get(), verb == "pack" ? SHUT_WR : SHUT_RD);
  SpawnOptions o;
  o.argv = {BinaryBesideSelf("trybox-tar"), verb, dir};
  (verb == "pack" ? o.stdout_fd : o.stdin_fd) = theirs.get();
  o.stderr_fd = err_write.get();
  // Killed with us: a copy's helper never outlives the command that wanted it.
  o.die_with_parent = true;
  ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Spawn(o));
  return TreeTar{std::move(child), std::move(ours), std::move(err_read)};
}

Status FinishTreeTar(TreeTar& t) {
  t.io.Reset();
  std::string text;
  char buf[4096];
  for (;;) {
    auto n = ReadSome(t.err.get(), buf, sizeof buf);
    if (!n.ok() || *n == 0) break;
    if (text.size() < kMaxVerdictBytes) text.append(buf, *n);
  }
  ASSIGN_OR_RETURN(ExitInfo info, t.child.Wait());
  if (info.exited && info.code == 0) return Status::Ok();
  // The last line that is a verdict: "trybox-tar: CODE\tmessage".
  constexpr std::string_view kPrefix = "trybox-tar: ";
  size_t at = text.rfind(kPrefix);
  if (info.exited && info.code == 1 && at != std::string::npos) {
    std::string line = text.substr(at + kPrefix.size());
    if (!line.empty() && line.back() == '\n') line.pop_back();
    size_t tab = line.find('\t');
    if (tab != std::string::npos) {
      return Status(CodeFromName(line.substr(0, tab)), line.substr(tab + 1));
    }
  }
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return Internal("trybox-tar " + info.Describe() + (text.empty() ? "" : ": " + text));
}

}  // namespace trybox::cli
