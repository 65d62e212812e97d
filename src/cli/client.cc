#include "cli/client.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cstring>
#include <string_view>
#include <thread>

#include "cli/reply.h"
#include "util/private_dir.h"
#include "util/process.h"
#include "util/socket.h"

namespace trybox::cli {
namespace {

std::string DaemonBinary() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    std::string self(buf, static_cast<size_t>(n));
    std::string beside = self.substr(0, self.rfind('/')) + "/tryboxd";
    if (::access(beside.c_str(), X_OK) == 0) return beside;
  }
  return FindInPath("tryboxd").value_or("tryboxd");
}

// The runtime directory, checked (and with `autostart` created) before anything is
// connected to inside it.
Status PrepareRuntimeDir(const Paths& paths, bool autostart) {
  Status st = autostart ? MakePrivateDir(paths.runtime) : CheckPrivateDir(paths.runtime);
  if (st.ok()) return st;
  if (st.code() == Code::kNotFound) return DaemonUnreachable(paths.socket(), st.message());
  if (st.code() == Code::kPermissionDenied) {
    return PermissionDenied(
        "refusing to use the runtime directory, which holds tryboxd's socket: " + st.message() +
        " (or point XDG_RUNTIME_DIR or TRYBOX_HOME elsewhere)");
  }
  return st.Annotate("runtime directory");
}

}  // namespace

std::vector<std::string> DaemonEnvironment(const char* const* env) {
  static const char* const kNames[] = {"PATH",  "HOME",   "USER", "LOGNAME",
                                       "SHELL", "TMPDIR", "LANG", "TZ"};
  static const char* const kPrefixes[] = {"TRYBOX_", "XDG_", "LC_"};
  std::vector<std::string> out;
  for (; env && *env; ++env) {
    std::string_view kv(*env);
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    std::string_view name = kv.substr(0, eq);
    bool keep = false;
    for (const char* n : kNames) keep |= name == n;
    for (const char* p : kPrefixes) keep |= name.substr(0, std::strlen(p)) == p;
    if (keep) out.emplace_back(kv);
  }
  return out;
}

Status CheckDaemonPeer(int fd, const std::string& socket) {
  ASSIGN_OR_RETURN(PeerCred cred, GetPeerCred(fd));
  uid_t me = ::geteuid();
  if (cred.uid == me || cred.uid == 0) return Status::Ok();
  return PermissionDenied("refusing to talk to the process listening on " + socket +
                          ": it runs as uid " + std::to_string(cred.uid) + ", not as you (uid " +
                          std::to_string(me) +
                          ") or root, so it is not your tryboxd. Nothing was sent to it");
}

Status StatusFromReply(const Json& reply) {
  ReplyView r(reply);
  ASSIGN_OR_RETURN(bool ok, r.BoolOr("ok", false));
  if (ok) return Status::Ok();
  ASSIGN_OR_RETURN(auto error, r.OptionalObject("error"));
  if (!error) return MalformedReply("ok", "is not true and there is no 'error' object");
  ASSIGN_OR_RETURN(std::string code, error->StringOr("code", "INTERNAL"));
  ASSIGN_OR_RETURN(std::string message, error->StringOr("message", "unknown error"));
  const Code c = CodeFromName(code);
  // An error that names no error ("OK") is still an error, never a success.
  return Status(c == Code::kOk ? Code::kInternal : c, message);
}

Result<std::unique_ptr<Client>> Client::Connect(const Paths& paths, bool autostart) {
  RETURN_IF_ERROR(PrepareRuntimeDir(paths, autostart));
  auto fd = ConnectUnix(paths.socket());
  if (!fd.ok() && autostart &&
      (fd.status().code() == Code::kNotFound || fd.status().code() == Code::kUnavailable)) {
    RETURN_IF_ERROR(MakeDirs(paths.state, 0700));
    std::string log_path = paths.state + "/tryboxd.log";
    ASSIGN_OR_RETURN(UniqueFd log,
                     OpenFile(log_path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0600));
    SpawnOptions opts;
    // The daemon owns its log from here (rotated at a size cap); what it prints before
    // that still lands in the same file.
    opts.argv = {DaemonBinary(), "--log-file", log_path};
    opts.env = DaemonEnvironment(environ);
    opts.stdout_fd = log.get();
    opts.stderr_fd = log.get();
    opts.new_session = true;
    ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Spawn(opts));
    // Poll for the socket; the daemon exits at once if another one won the race, which is
    // fine: that one will answer.
    for (int i = 0; i < 1000; ++i) {
      fd = ConnectUnix(paths.socket());
      if (fd.ok()) break;
      if (child.running()) {
        auto done = child.TryWait();
        // Exit code 3: another daemon won the race for the lock; it will answer.
        if (done.ok() && done->has_value() && !((*done)->exited && (*done)->code == 3)) break;
      }
      ::usleep(10000);
    }
    if (child.running()) child.Release();  // the daemon lives on, detached
    if (!fd.ok()) {
      // A daemon that refused to start (a damaged store, say) said why as its last line.
      std::string why;
      if (auto text = ReadFileToString(log_path); text.ok()) {
        size_t at = text->rfind("tryboxd: ");
        while (at != std::string::npos && at > 0 && (*text)[at - 1] != '\n') {
          at = text->rfind("tryboxd: ", at - 1);
        }
        if (at != std::string::npos) why = ": " + text->substr(at, text->find('\n', at) - at);
      }
      return DaemonUnreachable(paths.socket(),
                               "started it, but it did not answer (see " + log_path + ")" + why);
    }
  }
  if (!fd.ok()) return DaemonUnreachable(paths.socket(), fd.status().message());
  RETURN_IF_ERROR(CheckDaemonPeer(fd->get(), paths.socket()));
  auto mux = std::make_unique<channel::Mux>(std::move(*fd), channel::Role::kHost);
  mux->Start();
  return std::unique_ptr<Client>(new Client(std::move(mux), paths.socket()));
}

Status DaemonUnreachable(const std::string& socket, const std::string& detail) {
  return Unavailable("cannot reach tryboxd at " + socket + ": " + detail);
}

Status Client::Explain(const Status& st) const {
  if (st.ok() || mux_->alive()) return st;
  return DaemonUnreachable(socket_,
                           "it went away during the request (" + mux_->death_reason() + ")");
}

Result<std::shared_ptr<channel::Stream>> Client::Open(const Json& request) {
  auto s = mux_->Open(request);
  if (!s.ok()) return Explain(s.status());
  return s;
}

Result<Json> Client::Call(const Json& request) {
  ASSIGN_OR_RETURN(auto s, Open(request));
  for (;;) {
    auto next = s->Next();
    if (!next.ok()) return Explain(next.status());
    auto& m = *next;
    if (m.kind == channel::Stream::Message::Kind::kEnd) {
      RETURN_IF_ERROR(StatusFromReply(m.body));
      return m.body;
    }
    if (m.kind == channel::Stream::Message::Kind::kReset) {
      return StatusFromReset(m.body, "the request");
    }
  }
}

}  // namespace trybox::cli
