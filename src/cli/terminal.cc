#include "cli/terminal.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "cli/reply.h"
#include "util/fd.h"
#include "util/names.h"
#include "util/utf8.h"

namespace trybox::cli {
namespace {

using Kind = channel::Stream::Message::Kind;
constexpr int kTryboxFailed = 125;

// For the signal handler: the settings to put back, and where. Set while raw.
std::atomic<int> g_raw_fd{-1};
termios g_saved;
// SIGWINCH is turned into a byte on this pipe, read by the input thread.
int g_winch_pipe[2] = {-1, -1};

void RestoreFromSignal(int sig) {
  int fd = g_raw_fd.exchange(-1);
  if (fd >= 0) ::tcsetattr(fd, TCSAFLUSH, &g_saved);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void OnWinch(int) {
  int saved = errno;
  if (g_winch_pipe[1] >= 0) (void)!::write(g_winch_pipe[1], "w", 1);
  errno = saved;
}

Json ExecRequest(const std::string& vm, const std::vector<std::string>& argv,
                 const ExecOptions& ex) {
  Json req = {{"verb", "exec"},
              {"vm", vm},
              {"argv", argv},
              {"env", EnvObject(ex.env)},
              {"timeout_ms", ex.timeout_ms}};
  if (!ex.workdir.empty()) req["cwd"] = ex.workdir;
  return req;
}

// Terminal input and window changes to the exec stream, until the stream is done. Runs
// detached: a read blocked on a terminal must not hold the exit.
void PumpInput(std::shared_ptr<channel::Stream> s) {
  std::string buf(16 * 1024, '\0');
  for (;;) {
    pollfd p[2] = {{0, POLLIN, 0}, {g_winch_pipe[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents & POLLIN) {
      char drain[64];
      (void)!::read(g_winch_pipe[0], drain, sizeof drain);
      if (auto size = WindowSize(0)) {
        if (!s->SendEvent({{"type", "resize"}, {"rows", size->first}, {"cols", size->second}})
                 .ok()) {
          return;
        }
      }
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      auto n = ReadSome(0, buf.data(), buf.size());
      if (!n.ok() || *n == 0) {
        (void)s->CloseWrite(channel::kChanIn);
        return;
      }
      if (!s->Write(channel::kChanIn, std::string_view(buf.data(), *n)).ok()) return;
    }
  }
}

}  // namespace

int Failed(const Status& st) {
  std::cerr << "trybox: " << OneLine(st.message()) << "\n";
  return kTryboxFailed;
}

Result<std::unique_ptr<RawTerminal>> RawTerminal::Enter(int fd) {
  termios saved;
  if (!::isatty(fd) || ::tcgetattr(fd, &saved) != 0) {
    return FailedPrecondition("descriptor " + std::to_string(fd) + " is not a terminal");
  }
  std::unique_ptr<RawTerminal> t(new RawTerminal(fd, saved));
  g_saved = saved;
  g_raw_fd = fd;
  struct sigaction sa = {};
  sa.sa_handler = RestoreFromSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGHUP, SIGINT, SIGQUIT}) ::sigaction(sig, &sa, nullptr);
  termios raw = saved;
  ::cfmakeraw(&raw);
  if (::tcsetattr(fd, TCSAFLUSH, &raw) != 0) {
    g_raw_fd = -1;
    return ErrnoError("put the terminal in raw mode");
  }
  return t;
}

void RawTerminal::Restore() {
  if (restored_) return;
  restored_ = true;
  g_raw_fd = -1;
  ::tcsetattr(fd_, TCSAFLUSH, &saved_);
  for (int sig : {SIGTERM, SIGHUP, SIGINT, SIGQUIT}) ::signal(sig, SIG_DFL);
}

RawTerminal::~RawTerminal() { Restore(); }

std::optional<std::pair<int, int>> WindowSize(int fd) {
  winsize ws = {};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_row == 0 || ws.ws_col == 0) return std::nullopt;
  return std::make_pair(static_cast<int>(ws.ws_row), static_cast<int>(ws.ws_col));
}

Status CheckTtyOnStdin() {
  if (::isatty(0)) return Status::Ok();
  return FailedPrecondition(
      "-t needs a terminal, and standard input is not one (a pipe or a file?); use -i to "
      "pass input without a terminal");
}

std::vector<std::string> ShellCommand() {
  return {"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"};
}

int RunOnTerminal(Client& client, const std::string& vm, const std::vector<std::string>& argv,
                  const ExecOptions& ex) {
  ExecOptions opts = ex;
  // The guest's programs draw for our terminal: its type goes with them, unless -e set it.
  const char* term = std::getenv("TERM");
  bool term_set = false;
  for (const auto& kv : opts.env) term_set |= kv.rfind("TERM=", 0) == 0;
  if (term && *term && !term_set) opts.env.push_back(std::string("TERM=") + term);
  Json req = ExecRequest(vm, argv, opts);
  auto size = WindowSize(0).value_or(std::make_pair(24, 80));
  req["tty"] = {{"rows", size.first}, {"cols", size.second}};

  if (g_winch_pipe[0] < 0 && ::pipe2(g_winch_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Failed(ErrnoError("pipe2"));
  }
  struct sigaction sa = {};
  sa.sa_handler = OnWinch;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGWINCH, &sa, nullptr);

  auto s = client.Open(req);
  if (!s.ok()) return Failed(s.status());
  auto raw = RawTerminal::Enter(0);
  if (!raw.ok()) {
    (void)(*s)->Reset("no terminal");
    return Failed(raw.status());
  }
  // A resize that came between our first look and raw mode is not lost.
  (void)!::write(g_winch_pipe[1], "w", 1);
  std::thread(PumpInput, *s).detach();
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) {
      (*raw)->Restore();
      return Failed(client.Explain(m.status()));
    }
    if (m->kind == Kind::kData) {
      if (!WriteFull(1, m->data).ok()) {
        (void)(*s)->Reset("output closed");
        return kTryboxFailed;
      }
    } else if (m->kind == Kind::kEnd) {
      (*raw)->Restore();
      Status st = StatusFromReply(m->body);
      if (!st.ok()) return Failed(st);
      std::string msg;
      int code = ExitCodeFor(m->body["result"], &msg);
      if (!msg.empty()) std::cerr << "trybox: " << OneLine(msg) << "\n";
      return code;
    } else if (m->kind == Kind::kReset) {
      (*raw)->Restore();
      return Failed(StatusFromReset(m->body, "the exec"));
    }
  }
}

int RunDetached(Client& client, const std::string& vm, const std::vector<std::string>& argv,
                const ExecOptions& ex) {
  Json req = ExecRequest(vm, argv, ex);
  req["detach"] = true;
  auto r = client.Call(req);
  if (!r.ok()) return Failed(r.status());
  if (!r->contains("exec_id") || !(*r)["exec_id"].is_number_integer()) {
    return Failed(Internal("tryboxd's reply has no exec id"));
  }
  std::cout << (*r)["exec_id"].get<int64_t>() << std::endl;
  if (!r->contains("result")) return 0;
  std::string msg;
  int code = ExitCodeFor((*r)["result"], &msg);
  if (!msg.empty()) std::cerr << "trybox: " << OneLine(msg) << "\n";
  return code;
}

void AddTerminalCommands(CLI::App& app, Invocation& inv) {
  TerminalOptions& t = inv.term;
  auto* shell = app.add_subcommand("shell", "Open a shell in a running VM (bash, else sh)");
  shell->add_option("id", inv.id, "VM id")->required();
  shell->add_option("-e,--env", inv.exec.env, "Set an environment variable K=V (repeatable)")
      ->allow_extra_args(false);
  shell->add_option("-w,--workdir", inv.exec.workdir, "Working directory inside the VM");
  shell->callback([&inv] { inv.command = "shell"; });

  auto* logs = app.add_subcommand("logs", "Print an exec's output, kept by the daemon");
  logs->add_option("exec", t.exec_id, "Exec id (from exec -d, or trybox ps)")->required();
  logs->add_flag("-f,--follow", t.follow, "Keep printing while the exec runs; end when it ends");
  logs->add_option("--offset", t.offset,
                   "Start at this byte of the output (to resume where an earlier logs stopped)");
  logs->add_flag("--stderr", t.stderr, "The exec's stderr instead of its stdout");
  logs->callback([&inv] { inv.command = "logs"; });

  auto* ps = app.add_subcommand("ps", "List a VM's execs");
  ps->add_option("id", inv.id, "VM id")->required();
  ps->add_flag("--json", inv.json, "JSON output");
  ps->callback([&inv] { inv.command = "ps"; });

  auto* kill = app.add_subcommand("kill", "Signal a running exec and its whole process tree");
  kill->add_option("exec", t.exec_id, "Exec id")->required();
  kill->add_option("-s,--signal", t.signal, "Signal name or number")->capture_default_str();
  kill->callback([&inv] { inv.command = "kill"; });

  auto* port = app.add_subcommand(
      "port", "Forward a local TCP port to a port in the VM until Ctrl-C (loopback only)");
  port->add_option("id", inv.id, "VM id")->required();
  port->add_option("port", t.guest_port, "Port inside the VM (on its 127.0.0.1)")->required();
  port->add_option("--host", t.host, "Local ADDR:PORT to listen on (default 127.0.0.1:PORT)");
  port->add_flag("--allow-remote", t.allow_remote,
                 "Allow --host to be an address other machines can reach");
  port->callback([&inv] { inv.command = "port"; });
}

bool IsTerminalCommand(const std::string& command) {
  return command == "shell" || command == "logs" || command == "ps" || command == "kill" ||
         command == "port";
}

Status ValidateTerminalCommand(const Invocation& inv) {
  if (inv.command == "shell" || inv.command == "ps" || inv.command == "port") {
    RETURN_IF_ERROR(ValidateName("VM id", inv.id));
  }
  if ((inv.command == "logs" || inv.command == "kill") && inv.term.exec_id <= 0) {
    return InvalidArgument("an exec id is a positive number (see trybox ps ID)");
  }
  if (inv.command == "logs" && inv.term.offset < 0) {
    return InvalidArgument("--offset must not be negative");
  }
  if (inv.command == "kill") RETURN_IF_ERROR(ParseSignal(inv.term.signal).status());
  if (inv.command == "port") {
    if (inv.term.guest_port < 1 || inv.term.guest_port > 65535) {
      return InvalidArgument("the VM's port must be from 1 to 65535");
    }
    if (!inv.term.host.empty()) {
      ASSIGN_OR_RETURN(HostAddress a, ParseHostAddress(inv.term.host));
      if (!a.loopback && !inv.term.allow_remote) {
        return InvalidArgument("--host " + inv.term.host +
                               " is not a loopback address: other machines could reach port " +
                               std::to_string(inv.term.guest_port) +
                               " of the VM through it; add --allow-remote to listen there anyway");
      }
    }
  }
  return Status::Ok();
}

int RunTerminalCommand(Client& client, const Invocation& inv) {
  if (inv.command == "shell") return RunOnTerminal(client, inv.id, ShellCommand(), inv.exec);
  if (inv.command == "logs") return CmdLogs(client, inv.term);
  if (inv.command == "ps") return CmdPs(client, inv.id, inv.json);
  if (inv.command == "kill") return CmdKill(client, inv.term);
  if (inv.command == "port") return CmdPort(client, inv.term, inv.id);
  return Failed(InvalidArgument("unknown command " + inv.command));
}

}  // namespace trybox::cli
