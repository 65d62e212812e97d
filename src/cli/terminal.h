// The CLI's terminal side (issue 14): `exec -t` / `shell` / `run -t` on a pseudo-terminal in
// the guest, `exec -d` with output kept, and the commands around it: `logs`, `ps`, `kill`,
// `port`. Wire: docs/protocol/daemon.md.
//
// RawTerminal puts the caller's terminal in raw mode and restores it on every way out:
// its destructor, and a handler for the signals that end the process (TERM, HUP, INT,
// QUIT, PIPE), which restores the saved settings and re-raises the signal.
#pragma once

#include <termios.h>

#include <optional>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "cli/client.h"
#include "util/status.h"

namespace CLI {
class App;
}

namespace trybox::cli {

class RawTerminal {
 public:
  // kFailedPrecondition naming `fd` if it is not a terminal.
  static Result<std::unique_ptr<RawTerminal>> Enter(int fd);
  ~RawTerminal();
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;
  // Restores the saved settings now (idempotent).
  void Restore();

 private:
  RawTerminal(int fd, const termios& saved) : fd_(fd), saved_(saved) {}
  int fd_;
  termios saved_;
  bool restored_ = false;
};

// Prints "trybox: MESSAGE" on stderr; returns 125, the code of trybox's own failures.
int Failed(const Status& st);

// The window size of the terminal on `fd`, if it is one.
std::optional<std::pair<int, int>> WindowSize(int fd);

// kFailedPrecondition naming -t and stdin unless fd 0 is a terminal.
Status CheckTtyOnStdin();

// Runs argv in `vm` on a pseudo-terminal the size of ours, our terminal raw, resized along
// with the window, TERM passed through. Returns the command's exit code (cli.h).
int RunOnTerminal(Client& client, const std::string& vm, const std::vector<std::string>& argv,
                  const ExecOptions& ex);
// `exec -d`: starts argv with no client; prints its exec id. The exit code is 0, or the
// command's if it ended before it started (not found, bad cwd).
int RunDetached(Client& client, const std::string& vm, const std::vector<std::string>& argv,
                const ExecOptions& ex);
// The command `trybox shell` runs: bash if the image has it, else sh (a login shell).
std::vector<std::string> ShellCommand();

// Registers shell, logs, ps, kill and port on `app`; each sets inv.command when parsed.
void AddTerminalCommands(CLI::App& app, Invocation& inv);
// Checks what CLI11 cannot (names, the signal, the --host address).
Status ValidateTerminalCommand(const Invocation& inv);
bool IsTerminalCommand(const std::string& command);
// Runs shell, logs, ps, kill or port.
int RunTerminalCommand(Client& client, const Invocation& inv);

// logs.cc
int CmdLogs(Client& client, const TerminalOptions& t);
int CmdPs(Client& client, const std::string& vm, bool json);
int CmdKill(Client& client, const TerminalOptions& t);
// A signal by name (KILL, SIGKILL, kill) or number (9), 1 to 64.
Result<int> ParseSignal(const std::string& s);

// port_forward.cc
struct HostAddress {
  std::string host;  // a numeric IPv4 or IPv6 address
  int port = 0;      // 0: any free port
  bool loopback = false;
};
// "127.0.0.1:8000", "[::1]:0", "0.0.0.0:80".
Result<HostAddress> ParseHostAddress(const std::string& s);
int CmdPort(Client& client, const TerminalOptions& t, const std::string& vm);

}  // namespace trybox::cli
