#include "cli/cli.h"

#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <sstream>
#include <thread>

#include "cli/agent_cmd.h"
#include "cli/client.h"
#include "cli/mcp.h"
#include "cli/terminal.h"
#include "cli/transfer.h"
#include "egress/allowlist.h"
#include "image/image.h"
#include "util/fd.h"
#include "util/names.h"
#include "util/paths.h"
#include "util/process.h"
#include "vmm/template.h"
#include "workspace/workspace.h"

namespace trybox::cli {
namespace {

using Kind = channel::Stream::Message::Kind;
constexpr int kTryboxFailed = 125;

void AddVmOptions(CLI::App* cmd, VmOptions& vm) {
  cmd->add_option("--image", vm.image, "Image to boot")->capture_default_str();
  cmd->add_option("--memory", vm.memory_mib, "Guest memory in MiB")->capture_default_str();
  cmd->add_option("--cpus", vm.cpus, "Guest vCPUs")->capture_default_str();
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
  cmd->add_option("--workspace", vm.workspace,
                  "Copy this git working tree into /workspace (the default working directory)");
  cmd->add_option("--workspace-quota", vm.workspace_quota,
                  "Most the workspace may hold, each way (bytes, or K/M/G; default 1G)");
}

void AddAgentModelOptions(CLI::App* cmd, ModelFlags& m, AgentOptions& a) {
  cmd->add_option("--provider", m.provider,
                  "anthropic or openai (default: from ANTHROPIC_*/OPENAI_* or agent.json)");
  cmd->add_option("--model", m.model, "Model name (default: ANTHROPIC_MODEL / OPENAI_MODEL)");
  cmd->add_option("--max-turns", a.max_turns, "Most model turns for this call");
  cmd->add_option("--timeout", a.timeout_s, "Wall clock for this call, in seconds");
  cmd->add_option("--max-tokens", a.max_tokens, "Most tokens (input + output) for this call");
}

void AddExecOptions(CLI::App* cmd, ExecOptions& ex) {
  // One value per flag: a vector option would otherwise swallow "--" and the command.
  cmd->add_option("-e,--env", ex.env, "Set an environment variable K=V (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("-w,--workdir", ex.workdir, "Working directory inside the VM");
  cmd->add_option("--timeout", ex.timeout_s, "Kill the command after SECONDS");
  cmd->add_flag("-i,--interactive", ex.interactive, "Forward standard input to the command");
  cmd->add_flag("-t,--tty", ex.tty,
                "Run the command on a terminal in the VM (stdin must be a terminal)");
}

int Fail(const Status& st) {
  std::cerr << "trybox: " << st.message() << "\n";
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

// Streams one exec, forwarding stdout/stderr as they arrive. Returns the exit code.
int StreamExec(Client& client, const std::string& vm, const std::vector<std::string>& argv,
               const ExecOptions& ex) {
  Json req = {{"verb", "exec"},
              {"vm", vm},
              {"argv", argv},
              {"env", EnvObject(ex.env)},
              {"timeout_ms", static_cast<int64_t>(ex.timeout_s * 1000)},
              {"stdin", ex.interactive}};
  if (!ex.workdir.empty()) req["cwd"] = ex.workdir;
  auto s = client.Open(req);
  if (!s.ok()) return Fail(s.status());
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
    if (!m.ok()) return Fail(m.status().Annotate("lost tryboxd"));
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
        if (!st.ok()) return Fail(st);
        std::string msg;
        int code = ExitCodeFor(m->body["result"], &msg);
        if (!msg.empty()) std::cerr << "trybox: " << msg << "\n";
        return code;
      }
      case Kind::kReset:
        return Fail(Unavailable("tryboxd aborted the exec: " + m->body.value("reason", "")));
      default:
        break;
    }
  }
}

// `ephemeral`: the daemon destroys the VM when this connection closes, so a `run` that is
// interrupted or killed never leaves its VM behind.
Result<std::string> CreateVm(Client& client, const VmOptions& vm, bool ephemeral) {
  ASSIGN_OR_RETURN(Json r, client.Call({{"verb", "create"},
                                        {"image", vm.image},
                                        {"memory_mib", vm.memory_mib},
                                        {"cpus", vm.cpus},
                                        {"cold", vm.cold},
                                        {"privileged", vm.privileged},
                                        {"allow", vm.allow},
                                        {"profiles", vm.profiles},
                                        {"ephemeral", ephemeral}}));
  // A fallback (template unusable, booted cold) is news; --cold is not.
  const Json& start = r["vm"]["start"];
  if (!vm.cold && start.is_object() && start.contains("note")) {
    std::cerr << "trybox: " << start["note"].get<std::string>() << "\n";
  }
  return r["vm"]["id"].get<std::string>();
}

// Copies the working tree `dir` into the VM and runs the project's setup hook, whose output
// goes to our stderr. Returns 0, or the exit code to stop with.
int InjectWorkspace(Client& client, const std::string& vm, const VmOptions& opts) {
  char real[PATH_MAX];
  if (!::realpath(opts.workspace.c_str(), real)) {
    return Fail(ErrnoError("--workspace " + opts.workspace));
  }
  Json req = {{"verb", "workspace_in"}, {"vm", vm}, {"dir", real}};
  if (opts.quota_bytes) req["quota_bytes"] = opts.quota_bytes;
  auto s = client.Open(req);
  if (!s.ok()) return Fail(s.status());
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) return Fail(m.status().Annotate("lost tryboxd"));
    if (m->kind == Kind::kData) {
      (void)WriteFull(2, m->data);
      continue;
    }
    if (m->kind == Kind::kReset) return Fail(Unavailable("tryboxd aborted the workspace copy"));
    if (m->kind != Kind::kEnd) continue;
    Status st = StatusFromReply(m->body);
    if (!st.ok()) return Fail(st);
    const Json& w = m->body["workspace"];
    for (const auto& sk : w["skipped"]) {
      std::cerr << "trybox: workspace: not copied: " << sk["path"].get<std::string>() << ": "
                << sk["reason"].get<std::string>() << "\n";
    }
    const Json& setup = m->body["setup"];
    if (setup.is_null()) return 0;
    std::string msg;
    int code = ExitCodeFor(setup["result"], &msg);
    if (code != 0) {
      std::cerr << "trybox: " << workspace::kSetupScript << " failed"
                << (msg.empty() ? " with exit code " + std::to_string(code) : ": " + msg)
                << "; the command was not run\n";
    }
    return code;
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

void PrintCollect(std::ostream& out, const Json& c) {
  const Json& n = c["counts"];
  size_t total = c["changes"].size();
  out << "collected /workspace of VM " << c["vm"].get<std::string>() << ": " << total << " file"
      << (total == 1 ? "" : "s") << " changed (" << n["added"] << " added, " << n["modified"]
      << " modified, " << n["deleted"] << " deleted, " << n["renamed"] << " renamed, "
      << n["mode_changed"] << " mode changes)\n";
  for (const auto& sk : c["skipped"]) {
    out << "skipped " << sk["path"].get<std::string>() << ": " << sk["reason"].get<std::string>()
        << "\n";
  }
  if (!c["commit"].get<std::string>().empty()) {
    out << "committed " << c["commit"].get<std::string>() << " on branch "
        << c["branch"].get<std::string>();
    if (c.contains("dir")) out << " in " << c["dir"].get<std::string>();
    out << "\n";
  } else if (!c["note"].get<std::string>().empty()) {
    out << c["note"].get<std::string>() << "\n";
  }
}

// Runs the collect verb; prints to `out` (text) or stdout (JSON). Returns the exit code.
int CollectWorkspace(Client& client, const std::string& vm, const std::string& into, bool commit,
                     const std::string& command, bool json, std::ostream& out) {
  Json req = {{"verb", "collect"}, {"vm", vm}, {"commit", commit}, {"command", command}};
  if (!into.empty()) {
    std::string abs = into;
    if (abs[0] != '/') {
      char cwd[PATH_MAX];
      if (!::getcwd(cwd, sizeof cwd)) return Fail(ErrnoError("getcwd"));
      abs = std::string(cwd) + "/" + into;
    }
    req["into"] = abs;
  }
  auto r = client.Call(req);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << (*r)["collect"].dump(2) << "\n";
  } else {
    PrintCollect(out, (*r)["collect"]);
  }
  return 0;
}

int CmdDiff(Client& client, const std::string& vm, bool json) {
  auto r = client.Call({{"verb", "diff"}, {"vm", vm}});
  if (!r.ok()) return Fail(r.status());
  const Json& c = (*r)["collect"];
  if (json) {
    std::cout << c.dump(2) << "\n";
    return 0;
  }
  if (c["outcome"] != "ok") {
    std::cout << "the last collect of VM " << vm << " failed: " << c["error"].get<std::string>()
              << "\n";
    return 1;
  }
  for (const auto& ch : c["changes"]) {
    std::string k = ch["change"];
    std::string path = ch["path"];
    if (k == "added") {
      std::printf("A  %s (%lld bytes)\n", path.c_str(), ch["new_size"].get<long long>());
    } else if (k == "deleted") {
      std::printf("D  %s (%lld bytes)\n", path.c_str(), ch["old_size"].get<long long>());
    } else if (k == "modified") {
      std::printf("M  %s (%lld -> %lld bytes)\n", path.c_str(), ch["old_size"].get<long long>(),
                  ch["new_size"].get<long long>());
    } else if (k == "renamed") {
      std::printf("R  %s -> %s (%lld bytes)\n", ch["from"].get<std::string>().c_str(), path.c_str(),
                  ch["new_size"].get<long long>());
    } else if (k == "mode_changed") {
      std::printf("T  %s (mode %o -> %o)\n", path.c_str(), ch["old_mode"].get<unsigned>(),
                  ch["new_mode"].get<unsigned>());
    }
  }
  std::fflush(stdout);
  PrintCollect(std::cout, c);
  return 0;
}

std::string JoinCommand(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

std::string FormatAge(double created) {
  double age = static_cast<double>(::time(nullptr)) - created;
  if (age < 120) return std::to_string(static_cast<int>(age)) + "s";
  if (age < 7200) return std::to_string(static_cast<int>(age / 60)) + "m";
  return std::to_string(static_cast<int>(age / 3600)) + "h";
}

int CmdLs(Client& client, bool json) {
  auto r = client.Call({{"verb", "list"}});
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << (*r)["vms"].dump(2) << "\n";
    return 0;
  }
  std::printf("%-14s %-12s %-8s %-5s %-7s %-5s %-11s %s\n", "ID", "IMAGE", "STATE", "ACCEL",
              "MEMORY", "AGE", "EXECS", "NOTE");
  for (const auto& v : (*r)["vms"]) {
    int64_t running = v.value("running_execs", int64_t{0});
    std::string execs = std::to_string(v.value("execs", int64_t{0}));
    if (running > 0) execs += " (" + std::to_string(running) + " run)";
    std::printf("%-14s %-12s %-8s %-5s %-7s %-5s %-11s %s\n", v["id"].get<std::string>().c_str(),
                v["image"].get<std::string>().c_str(), v["state"].get<std::string>().c_str(),
                v["accel"].get<std::string>().c_str(),
                (std::to_string(v["memory_mib"].get<int>()) + "M").c_str(),
                FormatAge(v["created_at"].get<double>()).c_str(), execs.c_str(),
                v["note"].get<std::string>().c_str());
  }
  return 0;
}

int CmdRm(Client& client, const std::vector<std::string>& ids) {
  int rc = 0;
  for (const auto& id : ids) {
    auto r = client.Call({{"verb", "destroy"}, {"vm", id}});
    if (!r.ok()) {
      std::cerr << "trybox: " << r.status().message() << "\n";
      rc = 1;
      continue;
    }
    const Json& rep = (*r)["report"];
    bool clean = rep["process_gone"].get<bool>() && rep["sockets_removed"].get<bool>() &&
                 rep["dir_removed"].get<bool>();
    std::cout << id << "\n";
    if (!clean) {
      std::cerr << "trybox: " << id << " was not fully cleaned up: " << rep.dump() << "\n";
      rc = 1;
    }
  }
  return rc;
}

int CmdCp(Client& client, const std::string& src, const std::string& dst) {
  std::string src_path, dst_path;
  std::string src_vm = CpPathVm(src, &src_path);
  std::string dst_vm = CpPathVm(dst, &dst_path);
  if (src_vm.empty() == dst_vm.empty()) {
    return Fail(InvalidArgument("exactly one of SRC and DST must be ID:/path"));
  }
  const std::string& vm = src_vm.empty() ? dst_vm : src_vm;
  Status st = ValidateName("VM id", vm);
  if (!st.ok()) return Fail(st);
  auto r = src_vm.empty() ? PutPath(client, vm, src, dst_path) : GetPath(client, vm, src_path, dst);
  if (!r.ok()) return Fail(r.status());
  return 0;
}

int CmdImageBuild(const Invocation& inv) {
  Paths paths = Paths::FromEnvironment();
  image::BuildOptions o;
  o.name = inv.image_name;
  o.images_root = paths.images;
  o.cache_dir = paths.cache;
  o.rebuild_rootfs = inv.rebuild_rootfs;
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : "";
  o.init_binary = dir.substr(0, dir.rfind('/')) + "/trybox-init";
  o.progress = [](const std::string& line) { std::cerr << line << "\n"; };
  // Ctrl-C: kill the build's children (mmdebstrap runs in its own process group and would
  // not see the terminal's signal), so the build fails and removes its partial output.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  static std::atomic<bool> interrupted{false};
  o.cancelled = [] { return interrupted.load(); };
  std::thread([set] {
    int sig;
    if (sigwait(&set, &sig) == 0) {
      interrupted = true;
      std::cerr << "trybox: interrupted; stopping the build\n";
      SignalAllChildren(SIGKILL);
    }
  }).detach();
  Status st = image::BuildImage(o);
  if (interrupted) return 130;
  if (!st.ok()) return Fail(st);
  std::cout << "image " << inv.image_name << " built in " << paths.images << "/" << inv.image_name
            << "\n";
  return 0;
}

// The template as the daemon would judge it, using the acceleration it recorded.
Json DescribeTemplate(const Paths& paths, const std::string& name, const std::string& dir) {
  auto accel = ReadFileToString(paths.state + "/accel.json");
  Json a = accel.ok() ? Json::parse(*accel, nullptr, false) : Json();
  if (!a.is_object() || !a.contains("accel") || !a["accel"].is_string()) {
    return {{"state", "unknown"}, {"reason", "tryboxd has not chosen an accelerator yet"}};
  }
  // As the daemon judges it with its default configuration (QEMU under its own uid when
  // the daemon is root).
  return vmm::DescribeImageTemplate(paths.templates(), name, dir, a["accel"], "qemu-system-x86_64",
                                    ::geteuid() == 0);
}

int CmdImageLs(bool json) {
  Paths paths = Paths::FromEnvironment();
  auto list = image::ListImages(paths.images);
  if (!list.ok()) return Fail(list.status());
  Json out = Json::array();
  for (const auto& im : *list) {
    Json tpl = im.valid ? DescribeTemplate(paths, im.name, im.dir)
                        : Json{{"state", "none"}, {"reason", "the image is not valid"}};
    out.push_back({{"name", im.name},
                   {"valid", im.valid},
                   {"problem", im.problem},
                   {"kernel", im.manifest.kernel_version},
                   {"created", im.manifest.created},
                   {"dir", im.dir},
                   {"template", tpl}});
  }
  if (json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("%-16s %-6s %-16s %-21s %-9s %s\n", "NAME", "VALID", "KERNEL", "CREATED", "TEMPLATE",
              "PROBLEM");
  for (const auto& im : out) {
    const Json& tpl = im["template"];
    std::string problem = im["problem"].get<std::string>();
    if (problem.empty() && tpl.contains("reason")) {
      problem = "template: " + tpl["reason"].get<std::string>();
    }
    std::printf("%-16s %-6s %-16s %-21s %-9s %s\n", im["name"].get<std::string>().c_str(),
                im["valid"].get<bool>() ? "yes" : "no", im["kernel"].get<std::string>().c_str(),
                im["created"].get<std::string>().c_str(), tpl["state"].get<std::string>().c_str(),
                problem.c_str());
  }
  return 0;
}

int CmdDoctor(Client& client) {
  auto r = client.Call({{"verb", "doctor"}});
  if (!r.ok()) return Fail(r.status());
  const Json& a = (*r)["accel"];
  std::cout << "acceleration: "
            << (a["accel"].is_null() ? "unknown" : a["accel"].get<std::string>())
            << "\n  why: " << a["reason"].get<std::string>() << "\n";
  std::cout << "qemu: " << (*r)["qemu"].get<std::string>() << "\n";
  std::cout << "daemon: pid " << (*r)["daemon_pid"] << ", socket "
            << (*r)["paths"]["socket"].get<std::string>() << "\n";
  if (r->contains("spares") && !(*r)["spares"].empty()) {
    std::cout << "spare clones ready:";
    for (const auto& [shape, n] : (*r)["spares"].items()) std::cout << " " << shape << "=" << n;
    std::cout << "\n";
  }
  std::cout << "images (" << (*r)["paths"]["images"].get<std::string>() << "):\n";
  if ((*r)["images"].empty()) std::cout << "  none; run: trybox image build\n";
  for (const auto& im : (*r)["images"]) {
    std::cout << "  " << im["name"].get<std::string>() << ": "
              << (im["valid"].get<bool>() ? "ok" : "invalid: " + im["problem"].get<std::string>())
              << "\n";
    if (im.contains("template")) {
      const Json& t = im["template"];
      std::cout << "    template (" << t.value("memory_mib", 0) << " MiB, " << t.value("cpus", 0)
                << " cpu): " << t.value("state", "?");
      if (t.contains("reason")) std::cout << " (" << t["reason"].get<std::string>() << ")";
      if (t.contains("created")) std::cout << ", built " << t["created"].get<std::string>();
      std::cout << "\n";
    }
  }
  return 0;
}

std::string Clip(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

int CmdAudit(Client& client, const std::string& vm, int64_t limit, bool json) {
  Json req = {{"verb", "audit"}, {"limit", limit}};
  if (!vm.empty()) req["vm"] = vm;
  auto r = client.Call(req);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << (*r)["egress"].dump(2) << "\n";
    return 0;
  }
  std::printf("%-19s %-12s %-8s %-4s %-32s %-22s %9s %9s %8s %s\n", "TIME", "VM", "VERDICT", "HTTP",
              "HOST:PORT", "ADDRESS", "UP", "DOWN", "MS", "REASON");
  for (const auto& e : (*r)["egress"]) {
    char when[32];
    time_t t = static_cast<time_t>(e["started_at"].get<double>());
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
    std::string target = e["host"].get<std::string>() + ":" + std::to_string(e["port"].get<int>());
    std::string reason = e["reason"].get<std::string>();
    if (e["override"].get<bool>()) reason = "[override] " + reason;
    bool open = e["ended_at"].get<double>() == 0;
    std::printf(
        "%-19s %-12s %-8s %-4d %-32s %-22s %9lld %9lld %8s %s\n", when,
        e["vm"].get<std::string>().c_str(), e["verdict"].get<std::string>().c_str(),
        e["status"].get<int>(), Clip(target, 32).c_str(), e["address"].get<std::string>().c_str(),
        static_cast<long long>(e["bytes_up"].get<int64_t>()),
        static_cast<long long>(e["bytes_down"].get<int64_t>()),
        open ? "open" : std::to_string(e["duration_ms"].get<int64_t>()).c_str(), reason.c_str());
  }
  return 0;
}

}  // namespace

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

int ExitCodeFor(const nlohmann::json& result, std::string* message) {
  std::string outcome = result.value("outcome", "");
  message->clear();
  if (outcome == "exited" && result.contains("exit_code") && result["exit_code"].is_number()) {
    return result["exit_code"].get<int>();
  }
  if (outcome == "signaled" && result.contains("signal") && result["signal"].is_number()) {
    int sig = result["signal"].get<int>();
    *message = std::string("command killed by signal ") + std::to_string(sig);
    return 128 + sig;
  }
  if (outcome == "timed_out") {
    *message = "command timed out after " +
               std::to_string(result.value("timeout_ms", int64_t{0}) / 1000.0).substr(0, 6) + " s";
    return 124;
  }
  if (outcome == "error") {
    std::string err = result.value("error", "");
    *message = result.value("message", err);
    if (err == "not_found") return 127;
    if (err == "not_executable" || err == "bad_cwd") return 126;
    return kTryboxFailed;
  }
  if (outcome == "channel_lost") {
    *message = "lost the guest before the command finished: " + result.value("message", "");
    return kTryboxFailed;
  }
  if (outcome == "cancelled") {
    *message = "the exec was cancelled: " + result.value("message", "");
    return kTryboxFailed;
  }
  *message = "unexpected exec result: " + result.dump();
  return kTryboxFailed;
}

Result<Invocation> Parse(const std::vector<std::string>& args) {
  Invocation inv;
  CLI::App app{"trybox: throwaway Linux microVMs for trying things"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all");

  auto* run = app.add_subcommand("run", "Create a VM, run a command in it, destroy it");
  AddVmOptions(run, inv.vm);
  AddExecOptions(run, inv.exec);
  run->add_option("command", inv.argv, "Command and arguments (after --)")->required();

  auto* create = app.add_subcommand("create", "Create a VM and print its id");
  AddVmOptions(create, inv.vm);

  auto* exec = app.add_subcommand("exec", "Run a command in a running VM");
  AddExecOptions(exec, inv.exec);
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

  auto* cp = app.add_subcommand("cp", "Copy files: trybox cp SRC ID:/path, or ID:/path DST");
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
  build->add_flag("--rebuild-rootfs", inv.rebuild_rootfs, "Ignore the cached root filesystem");
  auto* ils = image->add_subcommand("ls", "List built images");
  ils->add_flag("--json", inv.json, "JSON output");

  auto* doctor = app.add_subcommand("doctor", "Show the acceleration choice and the set-up");

  auto* audit = app.add_subcommand("audit", "Show the egress audit record");
  audit->add_option("--vm", inv.id, "Only this VM's connections");
  audit->add_option("--limit", inv.limit, "At most this many rows (the newest)")
      ->capture_default_str();
  audit->add_flag("--json", inv.json, "JSON output");

  auto* agent = app.add_subcommand(
      "agent", "Hand a task to a model that works in a VM; print the daemon's report");
  agent->add_option("--image", inv.vm.image, "Image to boot")->capture_default_str();
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
  AddAgentModelOptions(agent, inv.model, inv.agent);
  agent->add_flag("--json", inv.json, "Print the report as JSON");
  agent->add_option("task", inv.agent.task, "The task, in words");
  auto* answer = agent->add_subcommand("answer", "Answer a run's question; it continues");
  answer->add_option("run", inv.agent.run_id, "Run id")->required();
  answer->add_option("text", inv.agent.answer, "The answer")->required();
  AddAgentModelOptions(answer, inv.model, inv.agent);
  answer->add_flag("--json", inv.json, "Print the report as JSON");
  auto* resume = agent->add_subcommand("resume", "Continue a run that ran past a limit");
  resume->add_option("run", inv.agent.run_id, "Run id")->required();
  AddAgentModelOptions(resume, inv.model, inv.agent);
  resume->add_flag("--json", inv.json, "Print the report as JSON");
  auto* show = agent->add_subcommand("show", "Print a run's report again");
  show->add_option("run", inv.agent.run_id, "Run id")->required();
  show->add_flag("--json", inv.json, "Print the report as JSON");
  auto* mcp = app.add_subcommand(
      "mcp", "Serve the vm_agent tool to an MCP client on stdin/stdout (docs/protocol/mcp.md)");
  mcp->add_option("--provider", inv.model.provider, "Model provider: anthropic or openai");
  mcp->add_option("--model", inv.model.model, "Model name for the agent in the VM");
  AddTerminalCommands(app, inv);

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
  if (doctor->parsed()) inv.command = "doctor";
  if (audit->parsed()) inv.command = "audit";
  if (agent->parsed()) {
    inv.command = answer->parsed()   ? "agent-answer"
                  : resume->parsed() ? "agent-resume"
                  : show->parsed()   ? "agent-show"
                                     : "agent";
    if (inv.command == "agent" && inv.agent.task.empty()) {
      return InvalidArgument("agent: give the task, e.g. trybox agent \"make the tests pass\"");
    }
    if (inv.command != "agent") RETURN_IF_ERROR(ValidateName("run id", inv.agent.run_id));
    if (inv.agent.max_turns < 0 || inv.agent.timeout_s < 0 || inv.agent.max_tokens < 0) {
      return InvalidArgument("agent: limits must not be negative");
    }
  }
  if (mcp->parsed()) inv.command = "mcp";
  for (const auto& a : inv.vm.allow) {
    auto e = egress::ParseAllowEntry(a);
    if (!e.ok()) return InvalidArgument("--allow: " + e.status().message());
  }
  for (const auto& p : inv.vm.profiles) RETURN_IF_ERROR(ValidateName("profile name", p));
  if (inv.command == "audit" && !inv.id.empty()) RETURN_IF_ERROR(ValidateName("VM id", inv.id));
  if (inv.limit < 1) return InvalidArgument("--limit must be at least 1");
  for (const auto& kv : inv.exec.env) RETURN_IF_ERROR(ValidateEnvAssignment(kv));
  if (inv.exec.timeout_s < 0) return InvalidArgument("--timeout must not be negative");
  if (inv.command == "run" || inv.command == "create" || inv.command == "image-build") {
    RETURN_IF_ERROR(
        ValidateName("image name", inv.command == "image-build" ? inv.image_name : inv.vm.image));
  }
  if (inv.command == "exec" || inv.command == "collect" || inv.command == "diff") {
    RETURN_IF_ERROR(ValidateName("VM id", inv.id));
  }
  if (!inv.vm.workspace_quota.empty()) {
    auto q = workspace::ParseSize(inv.vm.workspace_quota);
    if (!q.ok()) return q.status().Annotate("--workspace-quota");
    inv.vm.quota_bytes = *q;
  }
  for (const auto& id : inv.ids) RETURN_IF_ERROR(ValidateName("VM id", id));
  if (inv.exec.detach && (inv.exec.tty || inv.exec.interactive)) {
    return InvalidArgument("-d cannot be combined with -i or -t: a detached command has no input");
  }
  RETURN_IF_ERROR(ValidateTerminalCommand(inv));
  return inv;
}

int Run(const Invocation& inv) {
  if (inv.command == "help") {
    std::cout << inv.help;
    return 0;
  }
  if (inv.command == "image-build") return CmdImageBuild(inv);
  if (inv.command == "image-ls") return CmdImageLs(inv.json);
  if (inv.command == "mcp") return RunMcpServer({.model = inv.model}, 0, 1);
  if (inv.exec.tty || inv.command == "shell") {
    // Before anything starts (a VM, the daemon): a terminal we do not have cannot be used.
    Status st = CheckTtyOnStdin();
    if (!st.ok()) return Fail(st);
  }
  ::signal(SIGPIPE, SIG_IGN);
  auto client = Client::Connect(Paths::FromEnvironment());
  if (!client.ok()) return Fail(client.status());
  Client& c = **client;
  if (inv.command == "ls") return CmdLs(c, inv.json);
  if (inv.command == "rm") return CmdRm(c, inv.ids);
  if (inv.command == "cp") return CmdCp(c, inv.src, inv.dst);
  if (inv.command == "doctor") return CmdDoctor(c);
  if (inv.command == "audit") return CmdAudit(c, inv.id, inv.limit, inv.json);
  if (inv.command == "exec" && inv.exec.tty) return RunOnTerminal(c, inv.id, inv.argv, inv.exec);
  if (inv.command == "exec" && inv.exec.detach) return RunDetached(c, inv.id, inv.argv, inv.exec);
  if (inv.command == "exec") return StreamExec(c, inv.id, inv.argv, inv.exec);
  if (IsTerminalCommand(inv.command)) return RunTerminalCommand(c, inv);
  if (inv.command == "collect") {
    return CollectWorkspace(c, inv.id, inv.into, !inv.no_commit, "", inv.json, std::cout);
  }
  if (inv.command == "diff") return CmdDiff(c, inv.id, inv.json);
  if (inv.command.rfind("agent", 0) == 0) return CmdAgent(c, inv);
  if (!inv.vm.workspace.empty()) {
    Status st = CheckWorkspaceDir(inv.vm.workspace);
    if (!st.ok()) return Fail(st);
  }
  if (inv.command == "create") {
    auto id = CreateVm(c, inv.vm, /*ephemeral=*/false);
    if (!id.ok()) return Fail(id.status());
    if (!inv.vm.workspace.empty()) {
      int code = InjectWorkspace(c, *id, inv.vm);
      if (code != 0) {
        (void)c.Call({{"verb", "destroy"}, {"vm", *id}});
        return code;
      }
    }
    std::cout << *id << "\n";
    return 0;
  }
  if (inv.command == "run") {
    auto id = CreateVm(c, inv.vm, /*ephemeral=*/true);
    if (!id.ok()) return Fail(id.status());
    int code = inv.vm.workspace.empty() ? 0 : InjectWorkspace(c, *id, inv.vm);
    bool ran = code == 0;
    if (ran) {
      code = inv.exec.tty ? RunOnTerminal(c, *id, inv.argv, inv.exec)
                          : StreamExec(c, *id, inv.argv, inv.exec);
    }
    if (ran && !inv.vm.workspace.empty()) {
      // The work comes back whatever the command's exit code: a failed try is a result too.
      std::ostringstream text;
      int cc = CollectWorkspace(c, *id, "", true, JoinCommand(inv.argv), false, text);
      std::istringstream lines(text.str());
      for (std::string line; std::getline(lines, line);) std::cerr << "trybox: " << line << "\n";
      if (cc != 0 && code == 0) code = cc;
    }
    auto r = c.Call({{"verb", "destroy"}, {"vm", *id}});
    if (!r.ok()) {
      std::cerr << "trybox: could not destroy VM " << *id << ": " << r.status().message() << "\n";
      if (code == 0) code = kTryboxFailed;
    }
    return code;
  }
  return Fail(InvalidArgument("unknown command " + inv.command));
}

}  // namespace trybox::cli
