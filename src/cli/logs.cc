// trybox logs, ps and kill (cli/terminal.h).
#include <signal.h>

#include <cctype>
#include <cstdio>
#include <iostream>

#include "cli/terminal.h"
#include "util/fd.h"
#include "util/utf8.h"

namespace trybox::cli {
namespace {

using Kind = channel::Stream::Message::Kind;
int64_t IntOr(const Json& j, const char* key, int64_t fallback) {
  return j.is_object() && j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>()
                                                                        : fallback;
}

std::string TextOr(const Json& j, const char* key, const std::string& fallback = "") {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>()
                                                                : fallback;
}

std::string Duration(int64_t ms) {
  char buf[32];
  if (ms < 10'000) {
    std::snprintf(buf, sizeof buf, "%.1fs", static_cast<double>(ms) / 1000);
  } else if (ms < 3'600'000) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(ms / 60'000),
                  static_cast<long long>(ms / 1000 % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(ms / 3'600'000),
                  static_cast<long long>(ms / 60'000 % 60));
  }
  return buf;
}

std::string CommandLine(const Json& argv, size_t max) {
  std::string s;
  if (argv.is_array()) {
    for (const auto& a : argv) {
      if (!a.is_string()) continue;
      if (!s.empty()) s += ' ';
      s += a.get<std::string>();
    }
  }
  s = OneLine(s);  // no escapes on screen, no line of its own
  return s.size() <= max ? s : s.substr(0, WholeUtf8Prefix(s.substr(0, max - 3))) + "...";
}

struct SignalName {
  const char* name;
  int number;
};
constexpr SignalName kSignals[] = {
    {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT},   {"KILL", SIGKILL}, {"USR1", SIGUSR1},
    {"USR2", SIGUSR2}, {"PIPE", SIGPIPE}, {"ALRM", SIGALRM},   {"TERM", SIGTERM}, {"CONT", SIGCONT},
    {"STOP", SIGSTOP}, {"TSTP", SIGTSTP}, {"WINCH", SIGWINCH}, {"ABRT", SIGABRT}};

}  // namespace

Result<int> ParseSignal(const std::string& s) {
  if (!s.empty() && s.size() <= 2 && std::isdigit(static_cast<unsigned char>(s[0])) &&
      std::isdigit(static_cast<unsigned char>(s.back()))) {
    int n = std::stoi(s);
    if (n >= 1 && n <= 64) return n;
  }
  std::string name;
  for (char c : s) name += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  for (const auto& sig : kSignals) {
    if (name == sig.name) return sig.number;
  }
  return InvalidArgument("--signal: " + s.substr(0, 20) +
                         " is not a signal (a name such as TERM or KILL, or a number 1-64)");
}

int CmdLogs(Client& client, const TerminalOptions& t) {
  Json req = {{"verb", "logs"},
              {"exec", t.exec_id},
              {"offset", t.offset},
              {"follow", t.follow},
              {"stream", t.stderr ? "stderr" : "stdout"}};
  auto s = client.Open(req);
  if (!s.ok()) return Failed(s.status());
  char last = '\n';
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) return Failed(client.Explain(m.status()));
    if (m->kind == Kind::kData) {
      if (!WriteFull(1, m->data).ok()) return Failed(Unavailable("stdout closed"));
      if (!m->data.empty()) last = m->data.back();
    } else if (m->kind == Kind::kEvent && TextOr(m->body, "type") == "gap") {
      // The bytes the cap dropped: said where they were, on a line of its own. The marker
      // is not part of the output's offsets.
      std::string mark = std::string(last == '\n' ? "" : "\n") + "[trybox: output bytes " +
                         std::to_string(IntOr(m->body, "from", -1)) + " to " +
                         std::to_string(IntOr(m->body, "to", -1)) +
                         " were not kept (the log keeps the first and the last part of each "
                         "stream); resuming at offset " +
                         std::to_string(IntOr(m->body, "to", -1)) + "]\n";
      if (!WriteFull(1, mark).ok()) return Failed(Unavailable("stdout closed"));
      last = '\n';
    } else if (m->kind == Kind::kEnd) {
      Status st = StatusFromReply(m->body);
      return st.ok() ? 0 : Failed(st);
    } else if (m->kind == Kind::kReset) {
      return Failed(Unavailable("tryboxd aborted the logs"));
    }
  }
}

int CmdPs(Client& client, const std::string& vm, bool json) {
  auto r = client.Call({{"verb", "ps"}, {"vm", vm}});
  if (!r.ok()) return Failed(r.status());
  const Json& execs = (*r)["execs"];
  if (!execs.is_array()) return Failed(Internal("tryboxd's ps reply has no execs"));
  if (json) {
    std::cout << execs.dump(2) << "\n";
    return 0;
  }
  if (TextOr(*r, "trust") != "init") {
    // A privileged VM's commands could reach the channel: no result below is the daemon's
    // fact (docs/security.md).
    std::printf("VM %s %s: every result below is the guest's word\n", vm.c_str(),
                (*r)["privileged"] == true ? "was created --privileged"
                                           : "is not recorded as unprivileged");
  }
  std::printf("%-7s %-12s %-6s %-9s %s\n", "EXEC", "STATE", "EXIT", "DURATION", "COMMAND");
  for (const auto& e : execs) {
    std::string state = TextOr(e, "outcome", "?");
    std::string exit = "-";
    if (e.contains("exit_code")) exit = std::to_string(IntOr(e, "exit_code", -1));
    if (e.contains("signal")) exit = "sig " + std::to_string(IntOr(e, "signal", -1));
    std::printf(
        "%-7lld %-12s %-6s %-9s %s\n", static_cast<long long>(IntOr(e, "id", 0)),
        OneLine(state).c_str(), exit.c_str(),
        IntOr(e, "duration_ms", -1) < 0 ? "-" : Duration(IntOr(e, "duration_ms", 0)).c_str(),
        CommandLine(e.is_object() && e.contains("argv") ? e["argv"] : Json(), 60).c_str());
  }
  return 0;
}

int CmdKill(Client& client, const TerminalOptions& t) {
  auto sig = ParseSignal(t.signal);
  if (!sig.ok()) return Failed(sig.status());
  auto r = client.Call({{"verb", "kill"}, {"exec", t.exec_id}, {"signal", *sig}});
  if (!r.ok()) return Failed(r.status());
  return 0;
}

}  // namespace trybox::cli
