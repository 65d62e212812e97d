#include "cli/cli.h"

#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <sstream>
#include <thread>

#include "agent/text.h"
#include "cli/agent_cmd.h"
#include "cli/client.h"
#include "cli/daemon_cmd.h"
#include "cli/image_cmd.h"
#include "cli/image_recipe.h"
#include "cli/mcp.h"
#include "cli/mcp_tools.h"
#include "cli/reply.h"
#include "cli/secret_flags.h"
#include "cli/store_cmd.h"
#include "cli/terminal.h"
#include "cli/transfer.h"
#include "egress/allowlist.h"
#include "util/fd.h"
#include "util/names.h"
#include "util/numbers.h"
#include "util/paths.h"
#include "util/process.h"
#include "util/utf8.h"
#include "util/version.h"
#include "vmm/template.h"
#include "workspace/workspace.h"

namespace trybox::cli {
namespace {

using Kind = channel::Stream::Message::Kind;
constexpr int kTryboxFailed = 125;
// Pages asked of a paging daemon: its own caps (docs/protocol/daemon.md).
constexpr int64_t kDiffPage = 2000;

constexpr const char* kHttpRuleHelp =
    "'allow|deny METHODS HOST[/PATH]', e.g. 'allow GET,POST api.github.com/repos/OWNER/NAME': "
    "once HOST has a rule, each HTTPS request to it goes only if the first rule matching its "
    "method (or *) and path prefix allows it (repeatable, in order; docs/secrets.md)";

// Numeric flags arrive as text and are parsed by Parse() with their bounds; CLI11's own
// conversion would wrap 4294967808 to 512 and read 1e20 as a double.
struct NumberFlags {
  std::string memory, cpus, exec_timeout, agent_timeout, max_turns, max_tokens, limit;
};

std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[512];
  int n = std::vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return "";
  if (static_cast<size_t>(n) < sizeof small) return std::string(small, static_cast<size_t>(n));
  std::string big(static_cast<size_t>(n) + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(big.data(), big.size(), fmt, ap);
  va_end(ap);
  big.resize(static_cast<size_t>(n));
  return big;
}

void AddVmOptions(CLI::App* cmd, VmOptions& vm, NumberFlags& nf) {
  cmd->add_option("--image", vm.image, "Image to boot")->capture_default_str();
  cmd->add_option("--memory", nf.memory, "Guest memory in MiB, 128 to 65536 (default 512)")
      ->option_text("MIB");
  cmd->add_option("--cpus", nf.cpus, "Guest vCPUs, 1 to 64 (default 1)")->option_text("N");
  cmd->add_flag("--cold", vm.cold,
                "Boot the kernel instead of restoring the image's saved template");
  cmd->add_flag("--privileged", vm.privileged,
                "Commands keep every capability (mknod, mount, modules...); the guest's control "
                "channel is then within their reach, and every result from this VM is the "
                "guest's word (docs/security.md)");
  cmd->add_option("--allow", vm.allow,
                  "Let the VM reach HOST[:PORT] through the egress proxy (port 443 by default; "
                  "*.example.com for subdomains; repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--profile", vm.profiles,
                  "Add a named allow-list from the daemon's egress.json (repeatable)")
      ->allow_extra_args(false);
  cmd->add_flag("--internet", vm.internet,
                "Let the VM reach any public host on any port instead of an allow-list; "
                "loopback, private, link-local and metadata addresses stay refused");
  cmd->add_option("--deny", vm.deny,
                  "Never let the VM reach HOST[:PORT] (every port when none is given; "
                  "*.example.com for subdomains; wins over --allow and --internet; repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--secret", vm.secrets,
                  "NAME=SOURCE@HOST[,HOST...]: the guest sees NAME set to a placeholder; the "
                  "egress proxy puts the real value (SOURCE: env:VAR or file:PATH) in its place "
                  "only in HTTPS requests to HOST (repeatable; docs/secrets.md)")
      ->allow_extra_args(false);
  cmd->add_option("--http-rule", vm.http_rules, kHttpRuleHelp)->allow_extra_args(false);
  cmd->add_option("--workspace", vm.workspace,
                  "Copy this git working tree into /workspace (the default working directory)");
  cmd->add_option("--workspace-quota", vm.workspace_quota,
                  "Most the workspace may hold, each way (bytes, or K/M/G/T; default 1G, at "
                  "most 1T)");
  cmd->add_option("--workspace-quota-entries", vm.workspace_quota_entries,
                  "Most files, directories and symlinks the workspace may hold, each way "
                  "(default 100000)");
}

void AddAgentModelOptions(CLI::App* cmd, ModelFlags& m, NumberFlags& nf) {
  cmd->add_option("--provider", m.provider,
                  "anthropic or openai (default: from ANTHROPIC_*/OPENAI_* or agent.json)");
  cmd->add_option("--model", m.model, "Model name (default: ANTHROPIC_MODEL / OPENAI_MODEL)");
  cmd->add_option("--max-turns", nf.max_turns, "Most model turns for this call, 1 to 1000")
      ->option_text("N");
  cmd->add_option("--timeout", nf.agent_timeout,
                  "Wall clock for this call in seconds, at most 86400 (rounded up to whole "
                  "seconds)")
      ->option_text("SECONDS");
  cmd->add_option("--max-tokens", nf.max_tokens,
                  "Most tokens (input + output) for this call, 1000 to 2^40")
      ->option_text("N");
}

void AddExecOptions(CLI::App* cmd, ExecOptions& ex, NumberFlags& nf) {
  // One value per flag: a vector option would otherwise swallow "--" and the command.
  cmd->add_option("-e,--env", ex.env, "Set an environment variable K=V (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("-w,--workdir", ex.workdir, "Working directory inside the VM");
  cmd->add_option("--timeout", nf.exec_timeout,
                  "Kill the command after SECONDS (fractions allowed; at most 604800, 7 days)")
      ->option_text("SECONDS");
  cmd->add_flag("-i,--interactive", ex.interactive, "Forward standard input to the command");
  cmd->add_flag("-t,--tty", ex.tty,
                "Run the command on a terminal in the VM (stdin must be a terminal)");
}

// Converts the numeric flags that were given; the others keep their defaults.
Status ParseNumberFlags(const NumberFlags& nf, Invocation* inv) {
  if (!nf.memory.empty()) {
    ASSIGN_OR_RETURN(inv->vm.memory_mib,
                     ParseBoundedInt(nf.memory, kMinMemoryMib, kMaxMemoryMib, "--memory", "MiB"));
  }
  if (!nf.cpus.empty()) {
    ASSIGN_OR_RETURN(inv->vm.cpus, ParseBoundedInt(nf.cpus, 1, kMaxCpus, "--cpus"));
  }
  if (!nf.exec_timeout.empty()) {
    ASSIGN_OR_RETURN(inv->exec.timeout_ms,
                     ParseSecondsToMs(nf.exec_timeout, kMaxExecTimeoutMs, "--timeout"));
  }
  if (!nf.agent_timeout.empty()) {
    ASSIGN_OR_RETURN(int64_t ms,
                     ParseSecondsToMs(nf.agent_timeout, kMaxAgentWallClockS * 1000, "--timeout"));
    inv->agent.wall_clock_s = (ms + 999) / 1000;
  }
  if (!nf.max_turns.empty()) {
    ASSIGN_OR_RETURN(inv->agent.max_turns,
                     ParseBoundedInt(nf.max_turns, 1, kMaxAgentTurns, "--max-turns"));
  }
  if (!nf.max_tokens.empty()) {
    ASSIGN_OR_RETURN(inv->agent.max_tokens, ParseBoundedInt(nf.max_tokens, kMinAgentTokens,
                                                            kMaxAgentTokens, "--max-tokens"));
  }
  if (!nf.limit.empty()) {
    ASSIGN_OR_RETURN(inv->limit, ParseBoundedInt(nf.limit, 1, kMaxAuditRows, "--limit", "rows"));
  }
  if (!inv->vm.workspace_quota.empty()) {
    ASSIGN_OR_RETURN(
        inv->vm.quota_bytes,
        ParseByteSize(inv->vm.workspace_quota, 1, kMaxWorkspaceQuotaBytes, "--workspace-quota"));
  }
  if (!inv->vm.workspace_quota_entries.empty()) {
    ASSIGN_OR_RETURN(inv->vm.quota_entries,
                     ParseBoundedInt(inv->vm.workspace_quota_entries, 1, int64_t{1} << 32,
                                     "--workspace-quota-entries", "entries"));
  }
  return Status::Ok();
}

// Every string from the daemon or a guest that this file prints goes through OneLine
// (util/utf8.h): a name a guest chose can neither start a line of its own nor reach the
// terminal as an escape sequence (docs/security.md, "What the CLI prints"). Command output
// itself is written as it came.
int Fail(std::ostream& err, const Status& st) {
  err << "trybox: " << OneLine(st.message()) << "\n";
  return kTryboxFailed;
}

std::string CpPathVm(const std::string& s, std::string* path) {
  // ID:/path. A local path that contains ':' before any '/' is read as a VM reference,
  // like docker; prefix ./ to copy such a local file.
  size_t colon = s.find(':');
  if (colon == std::string::npos || s.find('/') < colon) return "";
  *path = s.substr(colon + 1);
  return s.substr(0, colon);
}

// The exit code an exec result stands for; `message` gets what to tell the user.
Result<int> ExitCodeOf(const ReplyView& r, std::string* message) {
  ASSIGN_OR_RETURN(std::string outcome, r.StringOr("outcome", ""));
  if (outcome == "exited" && r.Has("exit_code")) {
    ASSIGN_OR_RETURN(int64_t code, r.Int("exit_code", 0, 255));
    return static_cast<int>(code);
  }
  if (outcome == "signaled" && r.Has("signal")) {
    ASSIGN_OR_RETURN(int64_t sig, r.Int("signal", 1, 127));
    *message = "command killed by signal " + std::to_string(sig);
    return 128 + static_cast<int>(sig);
  }
  if (outcome == "timed_out") {
    ASSIGN_OR_RETURN(int64_t ms, r.IntOr("timeout_ms", 0, 0));
    *message = "command timed out after " + Format("%.3f", static_cast<double>(ms) / 1000) + " s";
    return 124;
  }
  if (outcome == "error") {
    ASSIGN_OR_RETURN(std::string err, r.StringOr("error", ""));
    ASSIGN_OR_RETURN(*message, r.StringOr("message", err));
    if (err == "not_found") return 127;
    if (err == "not_executable" || err == "bad_cwd") return 126;
    return kTryboxFailed;
  }
  if (outcome == "channel_lost" || outcome == "cancelled" || outcome == "guest_unresponsive" ||
      outcome == "not_started") {
    ASSIGN_OR_RETURN(std::string why, r.StringOr("message", ""));
    *message = (outcome == "cancelled"            ? "the command was cancelled: "
                : outcome == "guest_unresponsive" ? "the guest stopped answering: "
                : outcome == "not_started"        ? "the command never started: "
                                           : "lost the guest before the command finished: ") +
               why;
    return kTryboxFailed;
  }
  *message = "unexpected exec result: " + QuoteForMessage(r.json().dump(), 400);
  return kTryboxFailed;
}

// Streams one exec, forwarding stdout/stderr as they arrive. Returns the exit code.
int StreamExec(Client& client, const std::string& vm, const std::vector<std::string>& argv,
               const ExecOptions& ex, std::ostream& err) {
  Json req = {{"verb", "exec"},
              {"vm", vm},
              {"argv", argv},
              {"env", EnvObject(ex.env)},
              {"timeout_ms", ex.timeout_ms},
              {"stdin", ex.interactive}};
  if (!ex.workdir.empty()) req["cwd"] = ex.workdir;
  auto s = client.Open(req);
  if (!s.ok()) return Fail(err, s.status());
  std::thread input;
  if (ex.interactive) {
    input = std::thread([st = *s] {
      std::string buf(64 * 1024, '\0');
      for (;;) {
        auto n = ReadSome(0, buf.data(), buf.size());
        if (!n.ok() || *n == 0) break;
        if (!st->Write(channel::kChanIn, std::string_view(buf.data(), *n)).ok()) return;
      }
      (void)st->CloseWrite(channel::kChanIn);
    });
    input.detach();  // a blocked read on a terminal must not hold the exit
  }
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) return Fail(err, client.Explain(m.status()));
    switch (m->kind) {
      case Kind::kData: {
        int fd = m->channel == channel::kChanErr ? 2 : 1;
        if (!WriteFull(fd, m->data).ok()) {
          (void)(*s)->Reset("output closed");
          return kTryboxFailed;
        }
        break;
      }
      case Kind::kEnd: {
        Status st = StatusFromReply(m->body);
        if (!st.ok()) return Fail(err, st);
        auto result = ReplyView(m->body).Object("result");
        if (!result.ok()) return Fail(err, result.status());
        std::string msg;
        auto code = ExitCodeOf(*result, &msg);
        if (!code.ok()) return Fail(err, code.status());
        if (!msg.empty()) err << "trybox: " << OneLine(msg) << "\n";
        return *code;
      }
      case Kind::kReset:
        return Fail(err, StatusFromReset(m->body, "the exec"));
      default:
        break;
    }
  }
}

// The END of `s`. The daemon's progress EVENTs ({"progress": {stage, message}}) are printed
// on stderr once the wait has lasted a second (a quick answer prints nothing), if `show`.
Result<Json> AwaitWithProgress(channel::Stream& s, bool show, std::ostream& err) {
  const auto print_from = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  std::optional<std::string> pending;
  bool printing = false;
  for (;;) {
    channel::Stream::Deadline deadline;
    if (show && !printing && pending) deadline = print_from;
    auto m = s.Next(deadline);
    if (!m.ok() && m.status().code() == Code::kDeadlineExceeded) {
      printing = true;
      err << "trybox: " << OneLine(*pending) << "...\n";
      pending.reset();
      continue;
    }
    if (!m.ok()) return m.status();
    if (m->kind == Kind::kEnd) {
      RETURN_IF_ERROR(StatusFromReply(m->body));
      return m->body;
    }
    if (m->kind == Kind::kReset) return StatusFromReset(m->body, "the create");
    if (m->kind != Kind::kEvent) continue;
    ASSIGN_OR_RETURN(auto progress, ReplyView(m->body).OptionalObject("progress"));
    if (!progress) continue;
    ASSIGN_OR_RETURN(std::string msg, progress->StringOr("message", ""));
    if (printing) {
      err << "trybox: " << OneLine(msg) << "...\n";
    } else {
      pending = msg;
    }
  }
}

// `ephemeral`: the daemon destroys the VM when this connection closes, so a `run` that is
// interrupted or killed never leaves its VM behind.
Result<std::string> CreateVm(Client& client, const VmOptions& vm, bool ephemeral, bool quiet,
                             std::ostream& err) {
  RETURN_IF_ERROR(BuildOnFirstUse(Paths::FromEnvironment(), vm.image, ShowProgress(quiet), err));
  Json request = {
      {"verb", "create"},        {"image", vm.image},       {"memory_mib", vm.memory_mib},
      {"cpus", vm.cpus},         {"cold", vm.cold},         {"privileged", vm.privileged},
      {"allow", vm.allow},       {"profiles", vm.profiles}, {"ephemeral", ephemeral},
      {"internet", vm.internet}, {"deny", vm.deny}};
  if (!vm.secrets.empty()) {
    ASSIGN_OR_RETURN(request["secrets"], ResolveSecrets(Paths::FromEnvironment(), vm.secrets));
  }
  if (!vm.http_rules.empty()) request["http_rules"] = vm.http_rules;
  ASSIGN_OR_RETURN(auto s, client.Open(request));
  ASSIGN_OR_RETURN(Json r, AwaitWithProgress(*s, ShowProgress(quiet), err));
  ASSIGN_OR_RETURN(ReplyView v, ReplyView(r).Object("vm"));
  ASSIGN_OR_RETURN(std::string id, v.String("id"));
  if (!ValidateName("VM id", id).ok()) {
    return MalformedReply("vm.id", "must be a VM id ([A-Za-z0-9_-], 1 to 64 characters)");
  }
  ASSIGN_OR_RETURN(auto start, v.OptionalObject("start"));
  std::optional<std::string> note;
  if (start) {
    ASSIGN_OR_RETURN(note, start->OptionalString("note"));
  }
  // A fallback (template unusable, booted cold) is news; --cold is not.
  if (note && !vm.cold) err << "trybox: " << OneLine(*note) << "\n";
  return id;
}

// The messages of a workspace_in END, and the setup hook's exit code (0 without a hook).
Result<int> ReadWorkspaceIn(const Json& body, std::string* text) {
  ReplyView r(body);
  ASSIGN_OR_RETURN(ReplyView w, r.Object("workspace"));
  ASSIGN_OR_RETURN(auto skipped, w.ObjectsOrEmpty("skipped"));
  for (const auto& sk : skipped) {
    ASSIGN_OR_RETURN(std::string path, sk.String("path"));
    ASSIGN_OR_RETURN(std::string reason, sk.String("reason"));
    *text += "trybox: workspace: not copied: " + OneLine(path) + ": " + OneLine(reason) + "\n";
  }
  ASSIGN_OR_RETURN(auto setup, r.OptionalObject("setup"));
  if (!setup) return 0;
  ASSIGN_OR_RETURN(ReplyView result, setup->Object("result"));
  std::string msg;
  ASSIGN_OR_RETURN(int code, ExitCodeOf(result, &msg));
  if (code != 0) {
    *text += std::string("trybox: ") + workspace::kSetupScript + " failed" +
             (msg.empty() ? " with exit code " + std::to_string(code) : ": " + OneLine(msg)) +
             "; the command was not run\n";
  }
  return code;
}

// Copies the working tree `dir` into the VM and runs the project's setup hook, whose output
// goes to our stderr. Returns 0, or the exit code to stop with.
int InjectWorkspace(Client& client, const std::string& vm, const VmOptions& opts,
                    std::ostream& err) {
  char real[PATH_MAX];
  if (!::realpath(opts.workspace.c_str(), real)) {
    return Fail(err, ErrnoError("--workspace " + opts.workspace));
  }
  Json req = {{"verb", "workspace_in"}, {"vm", vm}, {"dir", real}};
  if (opts.quota_bytes) req["quota_bytes"] = opts.quota_bytes;
  if (opts.quota_entries) req["quota_entries"] = opts.quota_entries;
  auto s = client.Open(req);
  if (!s.ok()) return Fail(err, s.status());
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) return Fail(err, client.Explain(m.status()));
    if (m->kind == Kind::kData) {
      err.flush();
      (void)WriteFull(2, m->data);
      continue;
    }
    if (m->kind == Kind::kReset) return Fail(err, StatusFromReset(m->body, "the workspace copy"));
    if (m->kind != Kind::kEnd) continue;
    Status st = StatusFromReply(m->body);
    if (!st.ok()) return Fail(err, st);
    std::string text;
    auto code = ReadWorkspaceIn(m->body, &text);
    if (!code.ok()) return Fail(err, code.status());
    err << text;
    return *code;
  }
}

// A cheap look before a VM is booted for nothing; the daemon checks again, fully.
Status CheckWorkspaceDir(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoError("--workspace " + dir);
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("--workspace " + dir + " is not a directory");
  if (::lstat((dir + "/.git").c_str(), &st) != 0) {
    return InvalidArgument("--workspace " + dir +
                           " is not a git working tree (no .git in it; pass the top level of "
                           "the repository)");
  }
  return Status::Ok();
}

// The human summary of a collect (the `collect` object of a collect or diff reply).
Result<std::string> RenderCollect(const ReplyView& c) {
  ASSIGN_OR_RETURN(std::string vm, c.String("vm"));
  ASSIGN_OR_RETURN(ReplyView n, c.Object("counts"));
  int64_t counts[5];
  const char* kinds[5] = {"added", "modified", "deleted", "renamed", "mode_changed"};
  for (int i = 0; i < 5; ++i) {
    ASSIGN_OR_RETURN(counts[i], n.Int(kinds[i], 0));
  }
  ASSIGN_OR_RETURN(const Json* changes, c.Array("changes"));
  const int64_t listed = static_cast<int64_t>(changes->size());
  ASSIGN_OR_RETURN(int64_t total, c.IntOr("changes_total", listed, 0));
  ASSIGN_OR_RETURN(bool truncated, c.BoolOr("changes_truncated", false));
  ASSIGN_OR_RETURN(auto skipped, c.ObjectsOrEmpty("skipped"));
  ASSIGN_OR_RETURN(std::string commit, c.StringOr("commit", ""));
  ASSIGN_OR_RETURN(std::string branch, c.StringOr("branch", ""));
  ASSIGN_OR_RETURN(std::string note, c.StringOr("note", ""));
  ASSIGN_OR_RETURN(auto dir, c.OptionalString("dir"));
  vm = OneLine(vm);
  std::string out = Format(
      "collected /workspace of VM %s: %lld file%s changed (%lld added, %lld "
      "modified, %lld deleted, %lld renamed, %lld mode changes)\n",
      vm.c_str(), static_cast<long long>(total), total == 1 ? "" : "s",
      static_cast<long long>(counts[0]), static_cast<long long>(counts[1]),
      static_cast<long long>(counts[2]), static_cast<long long>(counts[3]),
      static_cast<long long>(counts[4]));
  if (truncated || total > listed) {
    out += Format(
        "%lld of these changes are not shown in this reply; trybox diff %s lists "
        "them all\n",
        static_cast<long long>(total - listed), vm.c_str());
  }
  for (const auto& sk : skipped) {
    ASSIGN_OR_RETURN(std::string path, sk.String("path"));
    ASSIGN_OR_RETURN(std::string reason, sk.String("reason"));
    out += "skipped " + OneLine(path) + ": " + OneLine(reason) + "\n";
  }
  if (!commit.empty()) {
    out += "committed " + OneLine(commit) + " on branch " + OneLine(branch);
    if (dir) out += " in " + OneLine(*dir);
    out += "\n";
  } else if (!note.empty()) {
    out += OneLine(note) + "\n";
  }
  return out;
}

// Runs the collect verb; prints to `out` (text or JSON). Returns the exit code.
int CollectWorkspace(Client& client, const std::string& vm, const std::string& into, bool commit,
                     const std::string& command, bool json, std::ostream& out, std::ostream& err) {
  Json req = {{"verb", "collect"}, {"vm", vm}, {"commit", commit}, {"command", command}};
  if (!into.empty()) {
    std::string abs = into;
    if (abs[0] != '/') {
      char cwd[PATH_MAX];
      if (!::getcwd(cwd, sizeof cwd)) return Fail(err, ErrnoError("getcwd"));
      abs = std::string(cwd) + "/" + into;
    }
    req["into"] = abs;
  }
  auto r = client.Call(req);
  if (!r.ok()) return Fail(err, r.status());
  auto c = ReplyView(*r).Object("collect");
  if (!c.ok()) return Fail(err, c.status());
  if (json) {
    out << c->json().dump(2) << "\n";
    return 0;
  }
  auto text = RenderCollect(*c);
  if (!text.ok()) return Fail(err, text.status());
  out << *text;
  return 0;
}

// One line of `trybox diff` per change; unknown kinds are left out.
Result<std::string> RenderChanges(const ReplyView& c) {
  ASSIGN_OR_RETURN(auto changes, c.Objects("changes"));
  std::string out;
  for (const auto& ch : changes) {
    ASSIGN_OR_RETURN(std::string k, ch.String("change"));
    ASSIGN_OR_RETURN(std::string raw_path, ch.String("path"));
    const std::string path = OneLine(raw_path);  // a name the guest chose
    auto size = [&](const char* key) -> Result<long long> {
      ASSIGN_OR_RETURN(int64_t v, ch.Int(key, 0));
      return static_cast<long long>(v);
    };
    if (k == "added") {
      ASSIGN_OR_RETURN(long long n, size("new_size"));
      out += Format("A  %s (%lld bytes)\n", path.c_str(), n);
    } else if (k == "deleted") {
      ASSIGN_OR_RETURN(long long n, size("old_size"));
      out += Format("D  %s (%lld bytes)\n", path.c_str(), n);
    } else if (k == "modified") {
      ASSIGN_OR_RETURN(long long o, size("old_size"));
      ASSIGN_OR_RETURN(long long n, size("new_size"));
      out += Format("M  %s (%lld -> %lld bytes)\n", path.c_str(), o, n);
    } else if (k == "renamed") {
      ASSIGN_OR_RETURN(std::string from, ch.String("from"));
      ASSIGN_OR_RETURN(long long n, size("new_size"));
      out += Format("R  %s -> %s (%lld bytes)\n", OneLine(from).c_str(), path.c_str(), n);
    } else if (k == "mode_changed") {
      ASSIGN_OR_RETURN(int64_t o, ch.Int("old_mode", 0, 07777));
      ASSIGN_OR_RETURN(int64_t n, ch.Int("new_mode", 0, 07777));
      out += Format("T  %s (mode %o -> %o)\n", path.c_str(), static_cast<unsigned>(o),
                    static_cast<unsigned>(n));
    }
  }
  return out;
}

int CmdDiff(Client& client, const std::string& vm, bool json, std::ostream& out,
            std::ostream& err) {
  auto c = FetchDiff(client, vm);
  if (!c.ok()) return Fail(err, c.status());
  if (json) {
    out << c->dump(2) << "\n";
    return 0;
  }
  ReplyView v(*c, "collect");
  auto outcome = v.StringOr("outcome", "ok");
  if (!outcome.ok()) return Fail(err, outcome.status());
  if (*outcome != "ok") {
    auto why = v.StringOr("error", "");
    if (!why.ok()) return Fail(err, why.status());
    out << "the last collect of VM " << OneLine(vm) << " failed: " << OneLine(*why) << "\n";
    return 1;
  }
  auto lines = RenderChanges(v);
  if (!lines.ok()) return Fail(err, lines.status());
  auto summary = RenderCollect(v);
  if (!summary.ok()) return Fail(err, summary.status());
  out << *lines << *summary;
  return 0;
}

std::string JoinCommand(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

std::string FormatAge(double created) {
  double age = static_cast<double>(::time(nullptr)) - created;
  if (age < 120) return std::to_string(static_cast<int64_t>(age)) + "s";
  if (age < 7200) return std::to_string(static_cast<int64_t>(age / 60)) + "m";
  return std::to_string(static_cast<int64_t>(age / 3600)) + "h";
}

// "yes", "no", or "?" for a VM recorded before the store kept whether it was privileged.
Result<std::string> PrivilegedWord(const ReplyView& v) {
  if (!v.Has("privileged")) return std::string("?");
  ASSIGN_OR_RETURN(bool privileged, v.Bool("privileged"));
  return std::string(privileged ? "yes" : "no");
}

Result<std::string> RenderLs(const ReplyView& r) {
  ASSIGN_OR_RETURN(auto vms, r.Objects("vms"));
  std::string out = Format("%-14s %-12s %-8s %-10s %-5s %-7s %-5s %-11s %s\n", "ID", "IMAGE",
                           "STATE", "PRIVILEGED", "ACCEL", "MEMORY", "AGE", "EXECS", "NOTE");
  for (const auto& v : vms) {
    ASSIGN_OR_RETURN(std::string id, v.String("id"));
    ASSIGN_OR_RETURN(std::string image, v.String("image"));
    ASSIGN_OR_RETURN(std::string state, v.String("state"));
    ASSIGN_OR_RETURN(std::string accel, v.StringOr("accel", ""));
    ASSIGN_OR_RETURN(int64_t memory, v.Int("memory_mib", 0));
    ASSIGN_OR_RETURN(double created, v.Number("created_at"));
    ASSIGN_OR_RETURN(std::string note, v.StringOr("note", ""));
    ASSIGN_OR_RETURN(int64_t total, v.IntOr("execs", 0, 0));
    ASSIGN_OR_RETURN(int64_t running, v.IntOr("running_execs", 0, 0));
    ASSIGN_OR_RETURN(std::string privileged, PrivilegedWord(v));
    std::string execs = std::to_string(total);
    if (running > 0) execs += " (" + std::to_string(running) + " run)";
    out += Format("%-14s %-12s %-8s %-10s %-5s %-7s %-5s %-11s %s\n", OneLine(id).c_str(),
                  OneLine(image).c_str(), OneLine(state).c_str(), privileged.c_str(),
                  OneLine(accel).c_str(), (std::to_string(memory) + "M").c_str(),
                  FormatAge(created).c_str(), execs.c_str(), OneLine(note).c_str());
  }
  return out;
}

int CmdLs(Client& client, bool json, std::ostream& out, std::ostream& err) {
  auto r = client.Call({{"verb", "list"}});
  if (!r.ok()) return Fail(err, r.status());
  ReplyView v(*r);
  if (json) {
    auto vms = v.Array("vms");
    if (!vms.ok()) return Fail(err, vms.status());
    out << (*vms)->dump(2) << "\n";
    return 0;
  }
  auto text = RenderLs(v);
  if (!text.ok()) return Fail(err, text.status());
  out << *text;
  return 0;
}

// "" if the destroy report says everything was cleaned up, else the report.
Result<std::string> LeftBehind(const Json& body) {
  ASSIGN_OR_RETURN(ReplyView rep, ReplyView(body).Object("report"));
  bool clean = true;
  for (const char* k : {"process_gone", "sockets_removed", "dir_removed"}) {
    ASSIGN_OR_RETURN(bool b, rep.Bool(k));
    clean = clean && b;
  }
  return clean ? std::string() : rep.json().dump();
}

int CmdRm(Client& client, const std::vector<std::string>& ids, std::ostream& out,
          std::ostream& err) {
  int rc = 0;
  for (const auto& id : ids) {
    auto r = client.Call({{"verb", "destroy"}, {"vm", id}});
    if (!r.ok()) {
      err << "trybox: " << OneLine(r.status().message()) << "\n";
      rc = 1;
      continue;
    }
    auto left = LeftBehind(*r);
    if (!left.ok()) {
      rc = Fail(err, left.status().Annotate("destroy " + id));
      continue;
    }
    out << id << "\n";
    if (!left->empty()) {
      err << "trybox: " << id << " was not fully cleaned up: " << OneLine(*left) << "\n";
      rc = 1;
    }
  }
  return rc;
}

// A VM's policy as `trybox allow`/`deny` print it.
Result<std::string> PolicyText(const ReplyView& egress) {
  ASSIGN_OR_RETURN(std::string mode, egress.String("mode"));
  ASSIGN_OR_RETURN(auto allow, egress.Strings("allow"));
  ASSIGN_OR_RETURN(auto deny, egress.Strings("deny"));
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : " ") + OneLine(x);
    return s.empty() ? std::string("(none)") : s;
  };
  std::string out = "mode:  " + OneLine(mode) + "\n";
  if (mode != "internet") out += "allow: " + join(allow) + "\n";
  return out + "deny:  " + join(deny) + "\n";
}

// `trybox allow ID HOST...` / `trybox deny ID HOST...`: prints the policy now in force.
int CmdEgress(Client& client, const Invocation& inv, std::ostream& out, std::ostream& err) {
  auto r =
      client.Call({{"verb", "egress"},
                   {"vm", inv.id},
                   {"allow", inv.command == "allow" ? inv.vm.allow : std::vector<std::string>{}},
                   {"deny", inv.command == "deny" ? inv.vm.deny : std::vector<std::string>{}}});
  if (!r.ok()) return Fail(err, r.status());
  auto egress = ReplyView(*r).Object("egress");
  if (!egress.ok()) return Fail(err, egress.status());
  if (inv.json) {
    out << egress->json().dump() << "\n";
    return 0;
  }
  auto text = PolicyText(*egress);
  if (!text.ok()) return Fail(err, text.status());
  out << *text;
  return 0;
}

// One line of `trybox approvals`, `now` seconds since the epoch.
Result<std::string> ApprovalLine(const ReplyView& a, double now) {
  ASSIGN_OR_RETURN(std::string run, a.String("run"));
  ASSIGN_OR_RETURN(std::string vm, a.String("vm"));
  ASSIGN_OR_RETURN(std::string kind, a.String("kind"));
  ASSIGN_OR_RETURN(std::string state, a.String("state"));
  ASSIGN_OR_RETURN(double since, a.Number("since"));
  std::string what;
  if (kind == "network") {
    ASSIGN_OR_RETURN(std::string host, a.String("host"));
    ASSIGN_OR_RETURN(int64_t port, a.Int("port", 1, 65535));
    ASSIGN_OR_RETURN(std::string reason, a.StringOr("reason", ""));
    what = "network " + OneLine(host) + ":" + std::to_string(port) + ", because " +
           agent::InlineQuote(reason, 200) + " (trybox approve|deny " + OneLine(run) + ")";
  } else {
    ASSIGN_OR_RETURN(std::string question, a.StringOr("question", ""));
    what = "question " + agent::InlineQuote(question, 200) + " (trybox agent answer " +
           OneLine(run) + " TEXT)";
  }
  if (state != "pending") {
    ASSIGN_OR_RETURN(std::string why, a.StringOr("why", ""));
    what += "; " + OneLine(why);
  }
  const std::string waited = std::to_string(static_cast<int64_t>(std::max(0.0, now - since))) + "s";
  return Format("%-12s  %-12s  %-8s  %-7s  %s\n", OneLine(run).c_str(), OneLine(vm).c_str(),
                waited.c_str(), OneLine(state).c_str(), what.c_str());
}

// `trybox approvals`: one line each, oldest first.
int CmdApprovals(Client& client, bool json, std::ostream& out, std::ostream& err) {
  auto r = client.Call({{"verb", "approvals"}});
  if (!r.ok()) return Fail(err, r.status());
  auto list = ReplyView(*r).Objects("approvals");
  if (!list.ok()) return Fail(err, list.status());
  if (json) {
    Json all = Json::array();
    for (const auto& a : *list) all.push_back(a.json());
    out << all.dump(2) << "\n";
    return 0;
  }
  if (list->empty()) {
    out << "nothing waits for a person\n";
    return 0;
  }
  const double now = static_cast<double>(::time(nullptr));
  std::string table =
      Format("%-12s  %-12s  %-8s  %-7s  %s\n", "RUN", "VM", "WAITING", "STATE", "WHAT");
  for (const auto& a : *list) {
    auto line = ApprovalLine(a, now);
    if (!line.ok()) return Fail(err, line.status());
    table += *line;
  }
  out << table;
  return 0;
}

int CmdCp(Client& client, const std::string& src, const std::string& dst, std::ostream& err) {
  std::string src_path, dst_path;
  std::string src_vm = CpPathVm(src, &src_path);
  std::string dst_vm = CpPathVm(dst, &dst_path);
  if (src_vm.empty() == dst_vm.empty()) {
    return Fail(err, InvalidArgument("exactly one of SRC and DST must be ID:/path"));
  }
  const std::string& vm = src_vm.empty() ? dst_vm : src_vm;
  Status st = ValidateName("VM id", vm);
  if (!st.ok()) return Fail(err, st);
  auto r = src_vm.empty() ? PutPath(client, vm, src, dst_path) : GetPath(client, vm, src_path, dst);
  if (!r.ok()) return Fail(err, client.Explain(r.status()));
  return 0;
}

// A base image is built by trybox-image-build (image/image_build_main.cc), which this process
// becomes: its kernel and initramfs code would cost every other command its libraries.
int CmdImageBuild(const Invocation& inv) {
  if (UsesRecipe(inv.image_name, inv.recipe_file)) return CmdImageBuildRecipe(inv);
  const std::string helper = BinaryBesideSelf("trybox-image-build");
  std::vector<const char*> argv = {helper.c_str(), inv.image_name.c_str()};
  if (inv.rebuild_rootfs) argv.push_back("--rebuild-rootfs");
  if (ShowProgress(inv.quiet)) argv.push_back("--progress");
  argv.push_back(nullptr);
  ::execv(helper.c_str(), const_cast<char* const*>(argv.data()));
  return Fail(std::cerr, ErrnoError("run " + helper));
}

Result<std::string> RenderDoctor(const ReplyView& r) {
  ASSIGN_OR_RETURN(ReplyView a, r.Object("accel"));
  ASSIGN_OR_RETURN(auto accel, a.OptionalString("accel"));
  ASSIGN_OR_RETURN(std::string why, a.String("reason"));
  ASSIGN_OR_RETURN(std::string qemu, r.String("qemu"));
  ASSIGN_OR_RETURN(int64_t pid, r.Int("daemon_pid", 0));
  ASSIGN_OR_RETURN(ReplyView paths, r.Object("paths"));
  ASSIGN_OR_RETURN(std::string socket, paths.String("socket"));
  ASSIGN_OR_RETURN(std::string images_dir, paths.String("images"));
  std::string out =
      "acceleration: " + OneLine(accel.value_or("unknown")) + "\n  why: " + OneLine(why) + "\n";
  out += "qemu: " + qemu + "\n";
  ASSIGN_OR_RETURN(std::string daemon_version, r.StringOr("version", "unknown"));
  out += "daemon: pid " + std::to_string(pid) + ", version " + daemon_version + ", socket " +
         socket + "\n";
  out += std::string("client: version ") + Version() + "\n";
  if (r.Has("unwell_vms")) {
    ASSIGN_OR_RETURN(const Json* unwell, r.Array("unwell_vms"));
    for (size_t i = 0; i < unwell->size(); ++i) {
      ReplyView v((*unwell)[i], "unwell_vms[" + std::to_string(i) + "]");
      ASSIGN_OR_RETURN(std::string id, v.String("id"));
      ASSIGN_OR_RETURN(std::string state, v.String("state"));
      ASSIGN_OR_RETURN(std::string note, v.StringOr("note", ""));
      out += "VM " + OneLine(id) + ": " + OneLine(state) +
             (note.empty() ? "" : " (" + OneLine(note) + ")") + "\n";
    }
  }
  ASSIGN_OR_RETURN(auto memory, r.OptionalObject("memory"));
  if (memory) {
    ASSIGN_OR_RETURN(int64_t promised, memory->IntOr("promised_mib", 0, 0));
    ASSIGN_OR_RETURN(int64_t budget, memory->IntOr("budget_mib", 0, 0));
    ASSIGN_OR_RETURN(int64_t total, memory->IntOr("total_mib", 0, 0));
    ASSIGN_OR_RETURN(int64_t reserve, memory->IntOr("reserve_mib", 0, 0));
    ASSIGN_OR_RETURN(bool set, memory->BoolOr("total_from_setting", false));
    const Json& ratio =
        memory->json().contains("overcommit") ? memory->json()["overcommit"] : Json();
    if (!ratio.is_number()) return MalformedReply("memory.overcommit", "must be a number");
    char line[512];
    std::snprintf(line, sizeof line,
                  "memory: %lld MiB promised to live VMs of a %lld MiB budget (%lld MiB%s less "
                  "a %lld MiB reserve, overcommit ratio %g)\n",
                  static_cast<long long>(promised), static_cast<long long>(budget),
                  static_cast<long long>(total),
                  set ? " as set by --memory-total" : " of host memory",
                  static_cast<long long>(reserve), ratio.get<double>());
    out += line;
  }
  ASSIGN_OR_RETURN(auto pool, r.OptionalObject("spare_pool"));
  if (pool) {
    ASSIGN_OR_RETURN(bool enabled, pool->BoolOr("enabled", false));
    if (!enabled) {
      out += "spare clones: off (tryboxd --spares 0)\n";
    } else {
      ASSIGN_OR_RETURN(int64_t used, pool->IntOr("used_mib", 0, 0));
      ASSIGN_OR_RETURN(int64_t budget, pool->IntOr("budget_mib", 0, 0));
      ASSIGN_OR_RETURN(int64_t min_spares, pool->IntOr("min_spares", 0, 0));
      ASSIGN_OR_RETURN(int64_t window, pool->IntOr("demand_window_s", 0, 0));
      ASSIGN_OR_RETURN(int64_t workers, pool->IntOr("refill_workers", 1, 0));
      out += "spare clones: " + std::to_string(used) + " of " + std::to_string(budget) +
             " MiB budget; at least " + std::to_string(min_spares) +
             " per shape in use, more with the creates of the last " + std::to_string(window) +
             " s; " + std::to_string(workers) + " refilled at a time\n";
      ASSIGN_OR_RETURN(auto shapes, pool->OptionalObject("shapes"));
      if (shapes) {
        for (const auto& [shape, ignored] : shapes->json().items()) {
          ASSIGN_OR_RETURN(ReplyView sv, shapes->Object(shape));
          ASSIGN_OR_RETURN(int64_t ready, sv.IntOr("ready", 0, 0));
          ASSIGN_OR_RETURN(int64_t refilling, sv.IntOr("refilling", 0, 0));
          ASSIGN_OR_RETURN(int64_t target, sv.IntOr("target", 0, 0));
          ASSIGN_OR_RETURN(int64_t recent, sv.IntOr("recent_creates", 0, 0));
          out += "  " + shape + ": " + std::to_string(ready) + " ready, " +
                 std::to_string(refilling) + " refilling, target " + std::to_string(target) + " (" +
                 std::to_string(recent) + " recent creates)\n";
        }
      }
    }
    out += "\n";
  }
  ASSIGN_OR_RETURN(auto store, r.OptionalObject("store"));
  if (store) {
    ASSIGN_OR_RETURN(std::string lines, RenderStoreHealth(*store));
    out += lines + "\n";
  }
  ASSIGN_OR_RETURN(auto images, r.Objects("images"));
  out += "images (" + images_dir + "):\n";
  if (images.empty()) out += "  none; run: trybox image build\n";
  for (const auto& im : images) {
    ASSIGN_OR_RETURN(std::string name, im.String("name"));
    ASSIGN_OR_RETURN(bool valid, im.Bool("valid"));
    ASSIGN_OR_RETURN(std::string problem, im.StringOr("problem", ""));
    out += "  " + OneLine(name) + ": " + (valid ? "ok" : "invalid: " + OneLine(problem)) + "\n";
    ASSIGN_OR_RETURN(auto t, im.OptionalObject("template"));
    if (!t) continue;
    ASSIGN_OR_RETURN(int64_t memory, t->IntOr("memory_mib", 0, 0));
    ASSIGN_OR_RETURN(int64_t cpus, t->IntOr("cpus", 0, 0));
    ASSIGN_OR_RETURN(std::string state, t->StringOr("state", "?"));
    ASSIGN_OR_RETURN(auto reason, t->OptionalString("reason"));
    ASSIGN_OR_RETURN(auto created, t->OptionalString("created"));
    out += "    template (" + std::to_string(memory) + " MiB, " + std::to_string(cpus) +
           " cpu): " + OneLine(state);
    if (reason) out += " (" + OneLine(*reason) + ")";
    if (created) out += ", built " + OneLine(*created);
    if (state == "broken") {
      out += "; the next create rebuilds it, `trybox image rm-template " + name + "` removes it";
    }
    out += "\n";
  }
  return out;
}

int CmdDoctor(Client& client, bool probe, std::ostream& out, std::ostream& err) {
  auto r = client.Call({{"verb", "doctor"}, {"probe", probe}});
  if (!r.ok()) return Fail(err, r.status());
  auto text = RenderDoctor(ReplyView(*r));
  if (!text.ok()) return Fail(err, text.status());
  out << *text;
  return 0;
}

// At most `n` bytes of `s`, "..." in place of the rest; never cut inside a character.
std::string Clip(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, WholeUtf8Prefix(s.substr(0, n - 3))) + "...";
}

Result<std::string> RenderAudit(const Json& rows) {
  std::string out = Format("%-19s %-12s %-8s %-4s %-32s %-22s %9s %9s %8s %s\n", "TIME", "VM",
                           "VERDICT", "HTTP", "HOST:PORT", "ADDRESS", "UP", "DOWN", "MS", "REASON");
  for (size_t i = 0; i < rows.size(); ++i) {
    ReplyView e(rows[i], "egress[" + std::to_string(i) + "]");
    ASSIGN_OR_RETURN(double started, e.Number("started_at"));
    ASSIGN_OR_RETURN(double ended, e.Number("ended_at"));
    ASSIGN_OR_RETURN(std::string vm, e.String("vm"));
    ASSIGN_OR_RETURN(std::string verdict, e.String("verdict"));
    ASSIGN_OR_RETURN(int64_t status, e.Int("status"));
    ASSIGN_OR_RETURN(std::string host, e.String("host"));
    ASSIGN_OR_RETURN(int64_t port, e.Int("port", 0, 65535));
    ASSIGN_OR_RETURN(std::string address, e.StringOr("address", ""));
    ASSIGN_OR_RETURN(int64_t up, e.Int("bytes_up", 0));
    ASSIGN_OR_RETURN(int64_t down, e.Int("bytes_down", 0));
    double duration = 0;  // milliseconds, fractional
    if (e.Has("duration_ms")) {
      ASSIGN_OR_RETURN(duration, e.Number("duration_ms"));
    }
    ASSIGN_OR_RETURN(std::string reason, e.StringOr("reason", ""));
    ASSIGN_OR_RETURN(bool override_used, e.BoolOr("override", false));
    char when[32] = "?";
    // Outside what gmtime can show, the time is left as "?" rather than converted wrongly.
    if (started >= 0 && started < 253402300800.0) {
      time_t t = static_cast<time_t>(started);
      struct tm tm;
      if (::gmtime_r(&t, &tm)) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    }
    if (override_used) reason = "[override] " + reason;
    // The host is the guest's word (a privileged guest sends any bytes): escaped, then clipped.
    std::string target = OneLine(host) + ":" + std::to_string(port);
    out += Format("%-19s %-12s %-8s %-4lld %-32s %-22s %9lld %9lld %8s %s\n", when,
                  OneLine(vm).c_str(), OneLine(verdict).c_str(), static_cast<long long>(status),
                  Clip(target, 32).c_str(), OneLine(address).c_str(), static_cast<long long>(up),
                  static_cast<long long>(down),
                  ended == 0 ? "open" : Format("%.0f", duration).c_str(), OneLine(reason).c_str());
  }
  return out;
}

int CmdAudit(Client& client, const std::string& vm, int64_t limit, bool json, std::ostream& out,
             std::ostream& err) {
  auto rows = FetchAudit(client, vm, limit);
  if (!rows.ok()) return Fail(err, rows.status());
  if (json) {
    out << rows->dump(2) << "\n";
    return 0;
  }
  auto text = RenderAudit(*rows);
  if (!text.ok()) return Fail(err, text.status());
  out << *text;
  return 0;
}

}  // namespace

Result<Json> FetchAudit(Client& client, const std::string& vm, int64_t limit) {
  // Pages come newest first, each oldest first inside; `before_id` walks back in time.
  std::vector<Json> pages;
  int64_t remaining = limit;
  std::optional<int64_t> before;
  while (remaining > 0) {
    Json req = {{"verb", "audit"}, {"limit", remaining}};
    if (!vm.empty()) req["vm"] = vm;
    if (before) req["before_id"] = *before;
    ASSIGN_OR_RETURN(Json r, client.Call(req));
    ReplyView v(r);
    ASSIGN_OR_RETURN(const Json* page, v.Array("egress"));
    for (size_t i = 0; i < page->size(); ++i) {
      if (!(*page)[i].is_object()) {
        return MalformedReply("egress[" + std::to_string(i) + "]", "must be an object");
      }
    }
    Json rows = *page;
    if (static_cast<int64_t>(rows.size()) > remaining) {
      // More than asked for: the newest `remaining` of them, which are the last.
      rows.erase(rows.begin(), rows.end() - remaining);
    }
    remaining -= static_cast<int64_t>(rows.size());
    pages.push_back(std::move(rows));
    if (!v.Has("next_before_id") || remaining == 0) break;
    ASSIGN_OR_RETURN(int64_t next, v.Int("next_before_id"));
    if (pages.back().empty() || (before && next >= *before)) {
      return MalformedReply("next_before_id",
                            "must move back from the last page's before_id (and follow a "
                            "non-empty page)");
    }
    before = next;
  }
  Json all = Json::array();
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
    for (auto& row : *it) all.push_back(std::move(row));
  }
  return all;
}

Result<Json> FetchDiff(Client& client, const std::string& vm) {
  ASSIGN_OR_RETURN(Json r, client.Call({{"verb", "diff"}, {"vm", vm}}));
  ASSIGN_OR_RETURN(ReplyView first, ReplyView(r).Object("collect"));
  Json c = first.json();
  ASSIGN_OR_RETURN(const Json* changes, first.Array("changes"));
  Json all = *changes;
  ASSIGN_OR_RETURN(int64_t total,
                   first.IntOr("changes_total", static_cast<int64_t>(all.size()), 0));
  if (static_cast<int64_t>(all.size()) > total) {
    return MalformedReply("collect.changes_total", "is smaller than the changes listed");
  }
  const Json id = c.contains("id") ? c["id"] : Json();
  while (static_cast<int64_t>(all.size()) < total) {
    const int64_t offset = static_cast<int64_t>(all.size());
    ASSIGN_OR_RETURN(Json p, client.Call({{"verb", "diff"},
                                          {"vm", vm},
                                          {"offset", offset},
                                          {"limit", std::min(kDiffPage, total - offset)}}));
    ASSIGN_OR_RETURN(ReplyView page, ReplyView(p).Object("collect"));
    // Another collect of the VM between two pages would mix two lists.
    if ((page.json().contains("id") ? page.json()["id"] : Json()) != id) {
      return FailedPrecondition("the last collect of VM " + vm +
                                " changed while its changes were read; run the command again");
    }
    ASSIGN_OR_RETURN(const Json* more, page.Array("changes"));
    if (more->empty() || offset + static_cast<int64_t>(more->size()) > total) {
      return MalformedReply("collect.changes", "at offset " + std::to_string(offset) +
                                                   " must hold between 1 and " +
                                                   std::to_string(total - offset) + " entries");
    }
    for (const auto& ch : *more) all.push_back(ch);
  }
  c["changes"] = std::move(all);
  if (c.contains("changes_total")) c["changes_truncated"] = false;
  return c;
}

Json EnvObject(const std::vector<std::string>& env) {
  Json o = Json::object();
  for (const auto& kv : env) {
    size_t eq = kv.find('=');
    o[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return o;
}

Status ValidateEnvAssignment(const std::string& kv) {
  size_t eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgument("--env takes K=V, got " + QuoteForMessage(kv));
  }
  for (size_t i = 0; i < eq; ++i) {
    char c = kv[i];
    bool ok = c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) {
      return InvalidArgument("--env name " + QuoteForMessage(kv.substr(0, eq)) +
                             " is not a valid environment variable name");
    }
  }
  if (kv.find('\0') != std::string::npos) return InvalidArgument("--env value contains NUL");
  return Status::Ok();
}

bool ShowProgress(bool quiet) {
  if (quiet) return false;
  const char* force = std::getenv("TRYBOX_PROGRESS");
  if (force && std::string(force) == "always") return true;
  if (force && std::string(force) == "never") return false;
  return ::isatty(2) == 1;
}

int ExitCodeFor(const nlohmann::json& result, std::string* message) {
  message->clear();
  auto code = ExitCodeOf(ReplyView(result, "result"), message);
  if (code.ok()) return *code;
  *message = code.status().message();
  return kTryboxFailed;
}

Result<Invocation> Parse(const std::vector<std::string>& args) {
  Invocation inv;
  NumberFlags nf;
  CLI::App app{"trybox: throwaway Linux microVMs for trying things"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all");
  app.set_version_flag("--version", std::string("trybox ") + Version(),
                       "Print the version and exit");

  auto* run = app.add_subcommand("run", "Create a VM, run a command in it, destroy it");
  AddVmOptions(run, inv.vm, nf);
  AddExecOptions(run, inv.exec, nf);
  run->add_option("command", inv.argv, "Command and arguments (after --)")->required();

  auto* create = app.add_subcommand("create", "Create a VM and print its id");
  AddVmOptions(create, inv.vm, nf);

  auto* exec = app.add_subcommand("exec", "Run a command in a running VM");
  AddExecOptions(exec, inv.exec, nf);
  exec->add_flag("-d,--detach", inv.exec.detach,
                 "Start the command, print its exec id and return; see trybox logs, ps, kill");
  exec->add_option("id", inv.id, "VM id")->required();
  exec->add_option("command", inv.argv, "Command and arguments (after --)")->required();

  auto* collect = app.add_subcommand(
      "collect", "Bring /workspace back and commit it on branch trybox/ID of the workspace repo");
  collect->add_option("id", inv.id, "VM id")->required();
  collect->add_option("--into", inv.into, "Also leave the collected tree in this new directory");
  collect->add_flag("--no-commit", inv.no_commit, "Record the changes but make no commit");
  collect->add_flag("--json", inv.json, "JSON output");

  auto* diff = app.add_subcommand("diff", "Show the files changed, as of the last collect");
  diff->add_option("id", inv.id, "VM id")->required();
  diff->add_flag("--json", inv.json, "JSON output");

  auto* cp = app.add_subcommand(
      "cp",
      "Copy files: trybox cp SRC ID:/path, or ID:/path DST (DST must not be a symbolic link; a "
      "copied directory must not exist yet)");
  cp->add_option("src", inv.src)->required();
  cp->add_option("dst", inv.dst)->required();

  auto* rm = app.add_subcommand("rm", "Destroy VMs");
  rm->add_option("ids", inv.ids, "VM ids")->required();

  auto* ls = app.add_subcommand("ls", "List VMs");
  ls->add_flag("--json", inv.json, "JSON output");

  auto* image = app.add_subcommand("image", "Build and list images");
  image->require_subcommand(1);
  auto* build = image->add_subcommand("build", "Build an image (default debian-12)");
  build->add_option("name", inv.image_name, "Image name")->capture_default_str();
  build->add_option("-f,--file", inv.recipe_file,
                    "Build from this recipe (docs/images.md, \"Recipes\"); default for "
                    "debian-12-dev: its built-in recipe");
  build->add_flag("--rebuild-rootfs", inv.rebuild_rootfs, "Ignore the cached root filesystem");
  auto* ils = image->add_subcommand("ls", "List built images");
  ils->add_flag("--json", inv.json, "JSON output");
  auto* irm = image->add_subcommand("rm", "Remove an image (refused while a VM uses it)");
  irm->add_option("name", inv.image_name, "Image name")->required();
  auto* irmt = image->add_subcommand(
      "rm-template", "Remove an image's templates (a broken one, say); the next create rebuilds");
  irmt->add_option("name", inv.image_name, "Image name")->required();
  auto* prune = image->add_subcommand(
      "prune",
      "Remove unused templates and dead builds' leftovers (and, with --all, the rootfs cache)");
  prune->add_flag("--json", inv.json, "JSON output");
  prune->add_flag("--dry-run", inv.dry_run, "Only list what would be removed, with its size");
  prune->add_flag("--all,--force", inv.all,
                  "Also remove the cached root filesystem (the next base image build then "
                  "takes the long path again); without it a terminal is asked, else it is kept");
  auto* commit = app.add_subcommand("commit", "Save a running VM's disk state as a new image");
  commit->add_option("id", inv.id, "VM id")->required();
  commit->add_option("name", inv.image_name, "New image name")->required();
  commit->add_flag("--json", inv.json, "JSON output");

  auto* doctor = app.add_subcommand("doctor", "Show the acceleration choice and the set-up");
  doctor->add_flag("--probe", inv.probe,
                   "Probe the acceleration again instead of using the answer kept from an "
                   "earlier probe");
  for (auto* cmd : {run, create, build}) {
    cmd->add_flag("-q,--quiet", inv.quiet,
                  "Print no progress on stderr (it is printed only to a terminal anyway)");
  }

  auto* record_prune = app.add_subcommand(
      "prune", "Apply the retention now: remove what it lets go, print what was freed");
  record_prune->add_flag("--dry-run", inv.dry_run, "Only say what would be removed");
  record_prune->add_flag("--json", inv.json, "JSON output");

  auto* allow = app.add_subcommand(
      "allow", "Let a running VM reach more hosts, from its next connection on (audited)");
  allow->add_option("id", inv.id, "VM id")->required();
  allow->add_option("hosts", inv.vm.allow, "HOST[:PORT] (port 443 by default)")->required();
  auto* deny = app.add_subcommand(
      "deny",
      "Stop a running VM reaching hosts, from its next connection on (audited); with a run "
      "id and no host, refuse that run's pending network request (trybox approvals)");
  deny->add_option("id", inv.id, "VM id (or run id, with no HOST)")->required();
  deny->add_option("hosts", inv.vm.deny, "HOST[:PORT] (every port when none is given)");
  for (auto* cmd : {allow, deny}) cmd->add_flag("--json", inv.json, "JSON output");
  AddAgentModelOptions(deny, inv.model, nf);
  auto* approve = app.add_subcommand(
      "approve", "Grant a run's pending network request (trybox approvals); the run continues");
  approve->add_option("run", inv.agent.run_id, "Run id")->required();
  approve->add_option("text", inv.agent.answer, "Words for the agent with the approval");
  approve->add_flag("--json", inv.json, "Print the report as JSON");
  AddAgentModelOptions(approve, inv.model, nf);
  auto* approvals =
      app.add_subcommand("approvals", "List what waits for a person: network requests, questions");
  approvals->add_flag("--json", inv.json, "JSON output");

  auto* audit = app.add_subcommand("audit", "Show the egress audit record");
  audit->add_option("--vm", inv.id, "Only this VM's connections");
  audit
      ->add_option("--limit", nf.limit,
                   "At most this many rows, the newest (1 to 1000000; default 1000)")
      ->option_text("N");
  audit->add_flag("--json", inv.json, "JSON output");

  auto* agent = app.add_subcommand(
      "agent", "Hand a task to a model that works in a VM; print the daemon's report");
  agent->add_option(
      "--image", inv.agent.image,
      "Image to boot (default: agent.json \"image\", else debian-12-dev; an image with "
      "a built-in recipe is built on first use)");
  agent->add_option("--workspace", inv.vm.workspace,
                    "Copy this git working tree into /workspace; the result is committed on "
                    "branch trybox/RUN_ID");
  agent->add_option("--verify", inv.agent.verify,
                    "Shell command the supervisor re-runs in a fresh VM from the collected "
                    "/workspace (instead of the agent's own)");
  agent->add_option("--allow", inv.vm.allow, "Let the VM reach HOST[:PORT] (repeatable)")
      ->allow_extra_args(false);
  agent->add_option("--profile", inv.vm.profiles, "Add a named allow-list (repeatable)")
      ->allow_extra_args(false);
  auto* agent_internet = agent->add_flag("--internet")
                             ->description(
                                 "Any public host on any port (default: agent.json \"internet\", "
                                 "else the allow-list)");
  auto* agent_no_internet = agent->add_flag("--no-internet")
                                ->description("Only the allow-list, whatever agent.json says");
  agent_internet->excludes(agent_no_internet);
  agent->add_option("--deny", inv.vm.deny, "Never let the VM reach HOST[:PORT] (repeatable)")
      ->allow_extra_args(false);
  agent
      ->add_option("--secret", inv.vm.secrets,
                   "NAME=SOURCE@HOST[,HOST...] or a NAME of secrets.json: the run's VM (and "
                   "its verification VM) sees NAME set to a placeholder; the real value goes "
                   "only into HTTPS requests to HOST (repeatable; docs/secrets.md)")
      ->allow_extra_args(false);
  agent->add_option("--http-rule", inv.vm.http_rules, kHttpRuleHelp)->allow_extra_args(false);
  AddAgentModelOptions(agent, inv.model, nf);
  agent->add_flag("--json", inv.json, "Print the report as JSON");
  agent->add_option("task", inv.agent.task, "The task, in words");
  auto* answer = agent->add_subcommand(
      "answer", "Answer a run's question, or approve or refuse its network request; it continues");
  answer->add_option("run", inv.agent.run_id, "Run id")->required();
  answer->add_option("text", inv.agent.answer,
                     "The answer (optional with --approve or --deny; to a network request, "
                     "words alone grant nothing)");
  auto* answer_approve =
      answer->add_flag("--approve")
          ->description(
              "Grant the host the run asked for (request_network), from its next connection on");
  auto* answer_deny = answer->add_flag("--deny")->description("Refuse the host the run asked for");
  answer_approve->excludes(answer_deny);
  AddAgentModelOptions(answer, inv.model, nf);
  answer->add_flag("--json", inv.json, "Print the report as JSON");
  auto* resume = agent->add_subcommand("resume", "Continue a run that ran past a limit");
  resume->add_option("run", inv.agent.run_id, "Run id")->required();
  AddAgentModelOptions(resume, inv.model, nf);
  resume->add_flag("--json", inv.json, "Print the report as JSON");
  auto* show = agent->add_subcommand("show", "Print a run's report again");
  show->add_option("run", inv.agent.run_id, "Run id")->required();
  show->add_flag("-f,--follow", inv.agent.follow,
                 "While the run works: print each step and command as it happens, then the report");
  auto* agent_ls = agent->add_subcommand("ls", "List runs, newest first");
  agent_ls->add_flag("--json", inv.json, "JSON output");
  auto* transcript =
      agent->add_subcommand("transcript", "Print a run's conversation with its model");
  transcript->add_option("run", inv.agent.run_id, "Run id")->required();
  transcript->add_flag("--json", inv.json, "JSON output");
  auto* cancel = agent->add_subcommand(
      "cancel",
      "Stop a run: the command in flight is killed, its work collected, its VM destroyed");
  cancel->add_option("run", inv.agent.run_id, "Run id")->required();
  cancel->add_flag("--json", inv.json, "Print the report as JSON");
  show->add_flag("--json", inv.json, "Print the report as JSON");
  auto* mcp = app.add_subcommand(
      "mcp", "Serve trybox's tools to an MCP client on stdin/stdout (docs/protocol/mcp.md)");
  mcp->add_option("--tools", inv.mcp_tools,
                  "Tools to offer, comma-separated (default all: vm_agent, vm_create, vm_exec, "
                  "vm_read_file, vm_write_file, vm_list_dir, vm_destroy)");
  mcp->add_option("--provider", inv.model.provider, "Model provider: anthropic or openai");
  mcp->add_option("--model", inv.model.model, "Model name for the agent in the VM");
  AddTerminalCommands(app, inv);
  AddDaemonCommands(app, inv);
  AddHttpCommands(app, inv);

  std::vector<std::string> rev(args.rbegin(), args.rend() - 1);
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    inv.command = "help";
    inv.help = app.help();
    for (auto* sub : app.get_subcommands()) inv.help = sub->help();
    return inv;
  } catch (const CLI::CallForAllHelp&) {
    inv.command = "help";
    inv.help = app.help("", CLI::AppFormatMode::All);
    return inv;
  } catch (const CLI::CallForVersion& v) {
    inv.command = "version";
    inv.help = std::string(v.what()) + "\n";
    return inv;
  } catch (const CLI::ParseError& e) {
    return InvalidArgument(e.what());
  }
  if (run->parsed()) inv.command = "run";
  if (create->parsed()) inv.command = "create";
  if (exec->parsed()) inv.command = "exec";
  if (cp->parsed()) inv.command = "cp";
  if (collect->parsed()) inv.command = "collect";
  if (diff->parsed()) inv.command = "diff";
  if (rm->parsed()) inv.command = "rm";
  if (ls->parsed()) inv.command = "ls";
  if (build->parsed()) inv.command = "image-build";
  if (ils->parsed()) inv.command = "image-ls";
  if (irm->parsed()) inv.command = "image-rm";
  if (irmt->parsed()) inv.command = "image-rm-template";
  if (prune->parsed()) inv.command = "image-prune";
  if (commit->parsed()) inv.command = "commit";
  if (doctor->parsed()) inv.command = "doctor";
  if (audit->parsed()) inv.command = "audit";
  if (allow->parsed()) inv.command = "allow";
  if (deny->parsed()) inv.command = "deny";
  if (approvals->parsed()) inv.command = "approvals";
  if (deny->parsed() && inv.vm.deny.empty()) {
    inv.command = "agent-answer";
    inv.agent.run_id = inv.id;
    inv.agent.decision = "deny";
    RETURN_IF_ERROR(ValidateName("run id", inv.agent.run_id));
  }
  if (approve->parsed()) {
    inv.command = "agent-answer";
    inv.agent.decision = "approve";
    RETURN_IF_ERROR(ValidateName("run id", inv.agent.run_id));
  }
  if (record_prune->parsed()) inv.command = "prune";
  if (agent->parsed()) {
    inv.command = answer->parsed()       ? "agent-answer"
                  : resume->parsed()     ? "agent-resume"
                  : show->parsed()       ? "agent-show"
                  : agent_ls->parsed()   ? "agent-ls"
                  : transcript->parsed() ? "agent-transcript"
                  : cancel->parsed()     ? "agent-cancel"
                                         : "agent";
    if (answer_approve->count() > 0) inv.agent.decision = "approve";
    if (answer_deny->count() > 0) inv.agent.decision = "deny";
    if (answer->parsed() && inv.agent.answer.empty() && inv.agent.decision.empty()) {
      return InvalidArgument("agent answer: give the answer, or --approve or --deny");
    }
    if (agent_internet->count() > 0) inv.vm.agent_internet = true;
    if (agent_no_internet->count() > 0) inv.vm.agent_internet = false;
    if (inv.command == "agent" && inv.agent.task.empty()) {
      return InvalidArgument("agent: give the task, e.g. trybox agent \"make the tests pass\"");
    }
    if (inv.command != "agent" && inv.command != "agent-ls") {
      RETURN_IF_ERROR(ValidateName("run id", inv.agent.run_id));
    }
  }
  if (mcp->parsed()) inv.command = "mcp";
  RETURN_IF_ERROR(ParseNumberFlags(nf, &inv));
  for (const auto& a : inv.vm.allow) {
    auto e = egress::ParseAllowEntry(a);
    if (!e.ok()) return InvalidArgument("--allow: " + e.status().message());
  }
  for (const auto& d : inv.vm.deny) {
    auto e = egress::ParseDenyEntry(d);
    if (!e.ok()) return InvalidArgument("--deny: " + e.status().message());
  }
  for (const auto& p : inv.vm.profiles) RETURN_IF_ERROR(ValidateName("profile name", p));
  for (const auto& sf : inv.vm.secrets) RETURN_IF_ERROR(ParseSecretFlag(sf).status());
  if (inv.command == "audit" && !inv.id.empty()) RETURN_IF_ERROR(ValidateName("VM id", inv.id));
  if (inv.command == "allow" || inv.command == "deny") {
    RETURN_IF_ERROR(ValidateName("VM id", inv.id));
  }
  for (const auto& kv : inv.exec.env) RETURN_IF_ERROR(ValidateEnvAssignment(kv));
  if (inv.command == "run" || inv.command == "create") {
    RETURN_IF_ERROR(ValidateName("image name", inv.vm.image));
  }
  if (inv.command == "image-build" || inv.command == "image-rm" || inv.command == "commit") {
    RETURN_IF_ERROR(ValidateName("image name", inv.image_name));
  }
  if (inv.command == "commit" || inv.command == "exec" || inv.command == "collect" ||
      inv.command == "diff") {
    RETURN_IF_ERROR(ValidateName("VM id", inv.id));
  }
  for (const auto& id : inv.ids) RETURN_IF_ERROR(ValidateName("VM id", id));
  if (inv.exec.detach && (inv.exec.tty || inv.exec.interactive)) {
    return InvalidArgument("-d cannot be combined with -i or -t: a detached command has no input");
  }
  RETURN_IF_ERROR(ValidateTerminalCommand(inv));
  if (inv.command == "mcp") {
    ASSIGN_OR_RETURN(inv.tools, mcp::ChooseTools(inv.mcp_tools));
  }
  return inv;
}

int RunWithClient(Client& c, const Invocation& inv, std::ostream& out, std::ostream& err) {
  if (inv.command == "ls") return CmdLs(c, inv.json, out, err);
  if (inv.command == "rm") return CmdRm(c, inv.ids, out, err);
  if (inv.command == "cp") return CmdCp(c, inv.src, inv.dst, err);
  if (inv.command == "doctor") return CmdDoctor(c, inv.probe, out, err);
  if (inv.command == "prune") return CmdPrune(c, inv.dry_run, inv.json, out, err);
  if (inv.command == "audit") return CmdAudit(c, inv.id, inv.limit, inv.json, out, err);
  if (inv.command == "allow" || inv.command == "deny") return CmdEgress(c, inv, out, err);
  if (inv.command == "approvals") return CmdApprovals(c, inv.json, out, err);
  if (inv.command == "commit") return CmdCommit(c, inv.id, inv.image_name, inv.json, out, err);
  if (inv.command == "image-rm") return CmdImageRm(c, inv.image_name, out, err);
  if (inv.command == "image-rm-template") return CmdImageRmTemplate(c, inv.image_name, out, err);
  if (inv.command == "image-prune") {
    PruneAsk ask;
    if (!inv.all && !inv.dry_run && !inv.json && ::isatty(0) == 1 && ::isatty(2) == 1) {
      ask = [&err](const std::string& question) {
        err << question << " [y/N] ";
        err.flush();
        std::string answer;
        if (!std::getline(std::cin, answer)) return false;
        return answer == "y" || answer == "Y" || answer == "yes";
      };
    }
    return CmdImagePrune(c, inv.dry_run, inv.all, ask, inv.json, out, err);
  }
  // The terminal's commands own the process's terminal and streams.
  if (inv.command == "exec" && inv.exec.tty) return RunOnTerminal(c, inv.id, inv.argv, inv.exec);
  if (inv.command == "exec" && inv.exec.detach) return RunDetached(c, inv.id, inv.argv, inv.exec);
  if (inv.command == "exec") return StreamExec(c, inv.id, inv.argv, inv.exec, err);
  if (IsTerminalCommand(inv.command)) return RunTerminalCommand(c, inv);
  if (IsHttpCommand(inv.command)) return RunHttpCommand(c, inv, out, err);
  if (inv.command == "collect") {
    return CollectWorkspace(c, inv.id, inv.into, !inv.no_commit, "", inv.json, out, err);
  }
  if (inv.command == "diff") return CmdDiff(c, inv.id, inv.json, out, err);
  if (inv.command.rfind("agent", 0) == 0) return CmdAgent(c, inv, out, err);
  if (!inv.vm.workspace.empty()) {
    Status st = CheckWorkspaceDir(inv.vm.workspace);
    if (!st.ok()) return Fail(err, st);
  }
  if (inv.command == "create") {
    auto id = CreateVm(c, inv.vm, /*ephemeral=*/false, inv.quiet, err);
    if (!id.ok()) return Fail(err, id.status());
    if (!inv.vm.workspace.empty()) {
      int code = InjectWorkspace(c, *id, inv.vm, err);
      if (code != 0) {
        (void)c.Call({{"verb", "destroy"}, {"vm", *id}});
        return code;
      }
    }
    out << *id << "\n";
    return 0;
  }
  if (inv.command == "run") {
    auto id = CreateVm(c, inv.vm, /*ephemeral=*/true, inv.quiet, err);
    if (!id.ok()) return Fail(err, id.status());
    int code = inv.vm.workspace.empty() ? 0 : InjectWorkspace(c, *id, inv.vm, err);
    bool ran = code == 0;
    if (ran) {
      code = inv.exec.tty ? RunOnTerminal(c, *id, inv.argv, inv.exec)
                          : StreamExec(c, *id, inv.argv, inv.exec, err);
    }
    if (ran && !inv.vm.workspace.empty()) {
      // The work comes back whatever the command's exit code: a failed try is a result too.
      std::ostringstream text;
      int cc = CollectWorkspace(c, *id, "", true, JoinCommand(inv.argv), false, text, err);
      std::istringstream lines(text.str());
      for (std::string line; std::getline(lines, line);) err << "trybox: " << line << "\n";
      if (cc != 0 && code == 0) code = cc;
    }
    auto r = c.Call({{"verb", "destroy"}, {"vm", *id}});
    if (!r.ok()) {
      err << "trybox: could not destroy VM " << *id << ": " << OneLine(r.status().message())
          << "\n";
      if (code == 0) code = kTryboxFailed;
    }
    return code;
  }
  return Fail(err, InvalidArgument("unknown command " + inv.command));
}

int Run(const Invocation& inv) {
  if (inv.command == "help" || inv.command == "version") {
    std::cout << inv.help;
    return 0;
  }
  if (inv.command == "image-build") return CmdImageBuild(inv);
  if (inv.command == "image-ls") return CmdImageLs(inv.json, std::cout, std::cerr);
  if (inv.command == "mcp") return RunMcpServer({.model = inv.model, .tools = inv.tools}, 0, 1);
  if (IsDaemonCommand(inv.command)) {
    return RunDaemonCommand(Paths::FromEnvironment(), inv, std::cout, std::cerr);
  }
  if (inv.exec.tty || inv.command == "shell") {
    // Before anything starts (a VM, the daemon): a terminal we do not have cannot be used.
    Status st = CheckTtyOnStdin();
    if (!st.ok()) return Fail(std::cerr, st);
  }
  ::signal(SIGPIPE, SIG_IGN);
  if (inv.command == "agent" || inv.command == "agent-answer" || inv.command == "agent-resume") {
    // Ctrl-C cancels the run (agent_cmd.cc): blocked here, before the connection's threads
    // exist, so that only the thread waiting for it ever takes the signal.
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGINT, SIGTERM, SIGUSR2}) sigaddset(&set, sig);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }
  auto client = Client::Connect(Paths::FromEnvironment());
  if (!client.ok()) return Fail(std::cerr, client.status());
  return RunWithClient(**client, inv, std::cout, std::cerr);
}

}  // namespace trybox::cli
