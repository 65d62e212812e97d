#include "daemon/requests.h"

#include <string.h>

#include "util/names.h"

namespace trybox::daemon {
namespace {

Result<std::string> VmId(const Fields& f) {
  ASSIGN_OR_RETURN(std::string id, f.String("vm"));
  RETURN_IF_ERROR(ValidateName("VM id", id));
  return id;
}

Result<std::string> RunId(const Fields& f) {
  ASSIGN_OR_RETURN(std::string id, f.String("run"));
  RETURN_IF_ERROR(ValidateName("run id", id));
  return id;
}

Result<std::string> ImageName(const Fields& f) {
  ASSIGN_OR_RETURN(std::string name, f.String("image", kDefaultImage));
  RETURN_IF_ERROR(ValidateName("image name", name));
  return name;
}

Result<std::string> AbsolutePath(const Fields& f, const char* key, bool required) {
  if (!required && !f.Has(key)) return std::string();
  ASSIGN_OR_RETURN(std::string path, f.String(key));
  if (path.empty() || path[0] != '/') {
    return InvalidArgument(std::string("'") + key + "' must be an absolute path, got " +
                           QuoteForMessage(path));
  }
  if (path.find('\0') != std::string::npos) {
    return InvalidArgument(std::string("'") + key + "' contains a NUL byte");
  }
  return path;
}

bool IsSha256Hex(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

Status NoNul(const std::string& s, const char* what) {
  if (s.find('\0') != std::string::npos) {
    return InvalidArgument(std::string(what) + " contains a NUL byte");
  }
  return Status::Ok();
}

// [{"name": N, "value": V, "hosts": [H...], "body": false, "keep_cookies": false,
// "target": false}]. Errors
// name the secret by its index and name, never by its value. `what`: the prefix of the
// field's name in messages. The values go into pages of their own; every string copy made
// here is wiped, parsed or not.
Result<std::shared_ptr<const egress::HeldSecrets>> Secrets(const Json& j, const std::string& what) {
  if (j.is_null()) return std::shared_ptr<const egress::HeldSecrets>();
  if (!j.is_array()) return InvalidArgument("'" + what + "secrets' must be an array");
  if (j.size() > egress::kMaxSecrets) {
    return InvalidArgument("'" + what + "secrets' has more than " +
                           std::to_string(egress::kMaxSecrets) + " entries");
  }
  std::vector<egress::SecretInput> inputs;
  auto parse = [&]() -> Status {
    for (size_t i = 0; i < j.size(); ++i) {
      Fields f(j[i], what + "secrets[" + std::to_string(i) + "].");
      RETURN_IF_ERROR(f.CheckObject());
      egress::SecretInput& in = inputs.emplace_back();
      ASSIGN_OR_RETURN(in.name, f.String("name"));
      ASSIGN_OR_RETURN(in.value, f.String("value"));
      ASSIGN_OR_RETURN(in.hosts, f.StringList("hosts"));
      ASSIGN_OR_RETURN(in.body, f.Bool("body", false));
      ASSIGN_OR_RETURN(in.keep_cookies, f.Bool("keep_cookies", false));
      ASSIGN_OR_RETURN(in.target, f.Bool("target", false));
    }
    return Status::Ok();
  };
  inputs.reserve(j.size());  // no reallocation leaves a value's old bytes behind
  if (Status st = parse(); !st.ok()) {
    egress::WipeSecretInputs(&inputs);
    return st;
  }
  return egress::HeldSecrets::Hold(&inputs);
}

}  // namespace

Result<CreateRequest> ParseCreate(const Json& j, const std::string& what) {
  Fields f(j, what);
  RETURN_IF_ERROR(f.CheckObject());
  CreateRequest r;
  ASSIGN_OR_RETURN(r.image, ImageName(f));
  ASSIGN_OR_RETURN(int64_t memory, f.Int("memory_mib", kMinMemoryMib, kMaxMemoryMib, 512));
  ASSIGN_OR_RETURN(int64_t cpus, f.Int("cpus", 1, kMaxCpus, 1));
  r.memory_mib = static_cast<int>(memory);
  r.cpus = static_cast<int>(cpus);
  ASSIGN_OR_RETURN(r.ephemeral, f.Bool("ephemeral", false));
  ASSIGN_OR_RETURN(r.cold, f.Bool("cold", false));
  ASSIGN_OR_RETURN(r.internet, f.Bool("internet", false));
  ASSIGN_OR_RETURN(r.allow, f.StringList("allow"));
  ASSIGN_OR_RETURN(r.profiles, f.StringList("profiles"));
  ASSIGN_OR_RETURN(r.deny, f.StringList("deny"));
  ASSIGN_OR_RETURN(r.privileged, f.Bool("privileged", false));
  ASSIGN_OR_RETURN(r.secrets, Secrets(f.Raw("secrets"), what));
  ASSIGN_OR_RETURN(r.http_rules, f.StringList("http_rules"));
  return r;
}

Result<VmRequest> ParseVmRequest(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  VmRequest r;
  ASSIGN_OR_RETURN(r.vm, VmId(f));
  return r;
}

Result<EgressRequest> ParseEgress(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  EgressRequest r;
  ASSIGN_OR_RETURN(r.vm, VmId(f));
  ASSIGN_OR_RETURN(r.allow, f.StringList("allow"));
  ASSIGN_OR_RETURN(r.deny, f.StringList("deny"));
  return r;
}

Result<DoctorRequest> ParseDoctor(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  DoctorRequest r;
  ASSIGN_OR_RETURN(r.probe, f.Bool("probe", false));
  return r;
}

Result<PruneRequest> ParsePrune(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  PruneRequest r;
  ASSIGN_OR_RETURN(r.dry_run, f.Bool("dry_run", false));
  return r;
}

Result<ServeRequest> ParseServe(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  ServeRequest r;
  ASSIGN_OR_RETURN(r.listen, f.String("listen", r.listen));
  ASSIGN_OR_RETURN(r.stop, f.Bool("stop", false));
  return r;
}

Result<ApiKeyRequest> ParseApiKey(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  ApiKeyRequest r;
  ASSIGN_OR_RETURN(r.name, f.String("name"));
  RETURN_IF_ERROR(ValidateName("API key name", r.name));
  ASSIGN_OR_RETURN(r.scope, f.String("scope", "sandboxes"));
  if (r.scope != "sandboxes" && r.scope != "operator") {
    return InvalidArgument("'scope' must be \"sandboxes\" or \"operator\", got " +
                           QuoteForMessage(r.scope));
  }
  return r;
}

Result<DaemonStatusRequest> ParseDaemonStatus(const Json& j) {
  RETURN_IF_ERROR(Fields(j).CheckObject());
  return DaemonStatusRequest{};
}

Result<DaemonStopRequest> ParseDaemonStop(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  DaemonStopRequest r;
  ASSIGN_OR_RETURN(r.restart, f.Bool("restart", false));
  return r;
}

Result<DaemonReloadRequest> ParseDaemonReload(const Json& j) {
  RETURN_IF_ERROR(Fields(j).CheckObject());
  return DaemonReloadRequest{};
}

Result<ExecRequest> ParseExec(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  ExecRequest r;
  ASSIGN_OR_RETURN(r.vm, VmId(f));
  auto argv = f.StringList("argv");
  if (!argv.ok() || argv->empty()) {
    return InvalidArgument("'argv' must be a non-empty array of strings");
  }
  if (static_cast<int64_t>(argv->size()) > kMaxArgs) {
    return InvalidArgument("'argv' has more than " + std::to_string(kMaxArgs) + " entries");
  }
  for (const auto& a : *argv) RETURN_IF_ERROR(NoNul(a, "an argv entry"));
  r.argv = std::move(*argv);
  ASSIGN_OR_RETURN(r.env, f.StringMap("env"));
  for (const auto& [k, v] : r.env) {
    if (k.empty() || k.find('=') != std::string::npos) {
      return InvalidArgument("'env' name " + QuoteForMessage(k) + " is empty or contains '='");
    }
    RETURN_IF_ERROR(NoNul(k + v, "an env entry"));
  }
  if (f.Has("cwd")) {
    ASSIGN_OR_RETURN(std::string cwd, AbsolutePath(f, "cwd", true));
    r.cwd = cwd;
  }
  ASSIGN_OR_RETURN(r.timeout_ms, f.Int("timeout_ms", 0, kMaxTimeoutMs, 0));
  ASSIGN_OR_RETURN(r.stdin, f.Bool("stdin", false));
  ASSIGN_OR_RETURN(r.user, f.String("user", ""));
  if (!r.user.empty()) RETURN_IF_ERROR(ValidateName("user name", r.user));
  if (f.Has("tty")) {
    ASSIGN_OR_RETURN(TermSize size, ParseTermSize(f.Raw("tty"), "tty."));
    r.tty = size;
  }
  ASSIGN_OR_RETURN(r.detach, f.Bool("detach", false));
  if (r.detach && (r.stdin || r.tty)) {
    return InvalidArgument(
        "'detach' cannot be combined with 'stdin' or 'tty': a detached exec "
        "has no client to read from");
  }
  return r;
}

Result<TermSize> ParseTermSize(const Json& j, const std::string& what) {
  Fields f(j, what);
  RETURN_IF_ERROR(f.CheckObject());
  TermSize size;
  ASSIGN_OR_RETURN(int64_t rows, f.Int("rows", 1, kMaxTermDimension));
  ASSIGN_OR_RETURN(int64_t cols, f.Int("cols", 1, kMaxTermDimension));
  size.rows = static_cast<int>(rows);
  size.cols = static_cast<int>(cols);
  return size;
}

Result<TermSize> ParseResizeEvent(const Json& j) {
  Fields f(j, "event.");
  RETURN_IF_ERROR(f.CheckObject());
  ASSIGN_OR_RETURN(std::string type, f.String("type"));
  if (type != "resize") {
    return InvalidArgument("an exec event from the client must be of type \"resize\", got " +
                           QuoteForMessage(type));
  }
  return ParseTermSize(j, "event.");
}

Result<LogsRequest> ParseLogs(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  LogsRequest r;
  ASSIGN_OR_RETURN(r.exec, f.Int("exec", 1, INT64_MAX));
  ASSIGN_OR_RETURN(std::string stream, f.String("stream", "stdout"));
  if (stream != "stdout" && stream != "stderr" && stream != "both") {
    return InvalidArgument("'stream' must be \"stdout\", \"stderr\" or \"both\", got " +
                           QuoteForMessage(stream));
  }
  r.stderr = stream == "stderr";
  r.both = stream == "both";
  ASSIGN_OR_RETURN(r.offset, f.Int("offset", 0, INT64_MAX, 0));
  if (r.both) {
    ASSIGN_OR_RETURN(r.stderr_offset, f.Int("stderr_offset", 0, INT64_MAX, 0));
  } else if (j.contains("stderr_offset")) {
    return InvalidArgument("'stderr_offset' goes with \"stream\": \"both\"");
  }
  ASSIGN_OR_RETURN(r.follow, f.Bool("follow", false));
  return r;
}

Result<KillRequest> ParseKill(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  KillRequest r;
  ASSIGN_OR_RETURN(r.exec, f.Int("exec", 1, INT64_MAX));
  ASSIGN_OR_RETURN(int64_t sig, f.Int("signal", 1, kMaxSignal, 9));
  r.signal = static_cast<int>(sig);
  return r;
}

Result<PortRequest> ParsePort(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  PortRequest r;
  ASSIGN_OR_RETURN(r.vm, VmId(f));
  ASSIGN_OR_RETURN(int64_t port, f.Int("port", 1, 65535));
  r.port = static_cast<int>(port);
  return r;
}

Result<PutRequest> ParsePut(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  PutRequest r;
  ASSIGN_OR_RETURN(r.vm, VmId(f));
  ASSIGN_OR_RETURN(r.path, AbsolutePath(f, "path", true));
  ASSIGN_OR_RETURN(r.kind, f.String("kind"));
  if (r.kind != "file" && r.kind != "tar") {
    return InvalidArgument("'kind' must be \"file\" or \"tar\", got " + QuoteForMessage(r.kind));
  }
  ASSIGN_OR_RETURN(r.mode, f.Int("mode", 0, 07777, 0644));
  if (f.Has("mtime_ns")) {
    ASSIGN_OR_RETURN(int64_t mtime, f.Int("mtime_ns", INT64_MIN, INT64_MAX));
    r.mtime_ns = mtime;
  }
  ASSIGN_OR_RETURN(r.mkdirs, f.Bool("mkdirs", false));
  return r;
}

Result<GetRequest> ParseGet(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  GetRequest r;
  ASSIGN_OR_RETURN(r.vm, VmId(f));
  ASSIGN_OR_RETURN(r.path, AbsolutePath(f, "path", true));
  return r;
}

Result<AuditRequest> ParseAudit(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  AuditRequest r;
  if (f.Has("vm")) {
    ASSIGN_OR_RETURN(r.vm, VmId(f));
  }
  ASSIGN_OR_RETURN(r.limit, f.Int("limit", 1, 1'000'000, 1000));
  if (f.Has("before_id")) {
    ASSIGN_OR_RETURN(int64_t before, f.Int("before_id", 1, INT64_MAX));
    r.before_id = before;
  }
  return r;
}

Result<WorkspaceInRequest> ParseWorkspaceIn(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  WorkspaceInRequest r;
  ASSIGN_OR_RETURN(r.vm, VmId(f));
  ASSIGN_OR_RETURN(r.dir, AbsolutePath(f, "dir", true));
  ASSIGN_OR_RETURN(r.quota_bytes, f.Int("quota_bytes", 1, int64_t{1} << 50, 0));
  ASSIGN_OR_RETURN(r.quota_entries, f.Int("quota_entries", 1, int64_t{1} << 32, 0));
  ASSIGN_OR_RETURN(r.setup, f.Bool("setup", true));
  ASSIGN_OR_RETURN(r.setup_timeout_ms, f.Int("setup_timeout_ms", 0, kMaxTimeoutMs, 0));
  return r;
}

Result<CollectRequest> ParseCollect(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  CollectRequest r;
  ASSIGN_OR_RETURN(r.vm, VmId(f));
  ASSIGN_OR_RETURN(r.into, AbsolutePath(f, "into", false));
  ASSIGN_OR_RETURN(r.commit, f.Bool("commit", true));
  ASSIGN_OR_RETURN(r.command, f.String("command", ""));
  RETURN_IF_ERROR(NoNul(r.command, "'command'"));
  return r;
}

Result<DiffRequest> ParseDiff(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  DiffRequest r;
  ASSIGN_OR_RETURN(r.vm, VmId(f));
  ASSIGN_OR_RETURN(r.offset, f.Int("offset", 0, INT64_MAX, 0));
  ASSIGN_OR_RETURN(r.limit, f.Int("limit", 1, 100'000, 0));
  ASSIGN_OR_RETURN(r.patch, f.Bool("patch", false));
  return r;
}

Result<AgentLimits> ParseLimits(const Json& j) {
  AgentLimits l;
  if (j.is_null()) return l;
  Fields f(j, "limits.");
  RETURN_IF_ERROR(f.CheckObject());
  ASSIGN_OR_RETURN(int64_t turns, f.Int("max_turns", 1, 1000, l.max_turns));
  ASSIGN_OR_RETURN(int64_t wall, f.Int("wall_clock_s", 1, 86400, l.wall_clock_s));
  ASSIGN_OR_RETURN(l.max_tokens, f.Int("max_tokens", 1000, int64_t{1} << 40, l.max_tokens));
  l.max_turns = static_cast<int>(turns);
  l.wall_clock_s = static_cast<int>(wall);
  return l;
}

Result<CommitRequest> ParseCommit(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  CommitRequest r;
  ASSIGN_OR_RETURN(r.vm, VmId(f));
  ASSIGN_OR_RETURN(r.name, f.String("name"));
  RETURN_IF_ERROR(ValidateName("image name", r.name));
  ASSIGN_OR_RETURN(r.env, f.StringMap("env"));
  for (const auto& [k, v] : r.env) {
    if (k.empty() || k.find('=') != std::string::npos) {
      return InvalidArgument("'env' has a key that is empty or contains '=': " +
                             QuoteForMessage(k));
    }
    RETURN_IF_ERROR(NoNul(k + v, "'env'"));
  }
  const Json& recipe = f.Raw("recipe");
  if (!recipe.is_null() && !recipe.is_object()) {
    return InvalidArgument("'recipe' must be an object");
  }
  r.recipe = recipe;
  ASSIGN_OR_RETURN(r.recipe_sha256, f.String("recipe_sha256", ""));
  if (!r.recipe_sha256.empty() && !IsSha256Hex(r.recipe_sha256)) {
    return InvalidArgument("'recipe_sha256' must be 64 lowercase hex digits");
  }
  ASSIGN_OR_RETURN(r.packages, f.StringList("packages"));
  ASSIGN_OR_RETURN(r.replace, f.Bool("replace", false));
  ASSIGN_OR_RETURN(r.checks_pending, f.Bool("checks_pending", false));
  return r;
}

Result<ImageNameRequest> ParseImageName(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  ImageNameRequest r;
  ASSIGN_OR_RETURN(r.name, f.String("name"));
  RETURN_IF_ERROR(ValidateName("image name", r.name));
  return r;
}

Result<AgentRequest> ParseAgent(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  AgentRequest r;
  ASSIGN_OR_RETURN(r.task, f.String("task", ""));
  if (r.task.empty()) return InvalidArgument("'task' must be a non-empty string");
  ASSIGN_OR_RETURN(r.image, ImageName(f));
  ASSIGN_OR_RETURN(r.workspace, AbsolutePath(f, "workspace", false));
  ASSIGN_OR_RETURN(r.verify, f.String("verify", ""));
  RETURN_IF_ERROR(NoNul(r.verify, "'verify'"));
  ASSIGN_OR_RETURN(r.internet, f.Bool("internet", false));
  ASSIGN_OR_RETURN(r.allow, f.StringList("allow"));
  ASSIGN_OR_RETURN(r.profiles, f.StringList("profiles"));
  ASSIGN_OR_RETURN(r.deny, f.StringList("deny"));
  ASSIGN_OR_RETURN(int64_t memory, f.Int("memory_mib", kMinMemoryMib, kMaxMemoryMib, 1024));
  ASSIGN_OR_RETURN(int64_t cpus, f.Int("cpus", 1, kMaxCpus, 1));
  r.memory_mib = static_cast<int>(memory);
  r.cpus = static_cast<int>(cpus);
  ASSIGN_OR_RETURN(r.cold, f.Bool("cold", false));
  auto model = agent::ModelSettings::FromJson(f.Raw("model"));
  if (!model.ok()) return model.status().Annotate("model");
  r.model = std::move(*model);
  ASSIGN_OR_RETURN(r.limits, ParseLimits(f.Raw("limits")));
  ASSIGN_OR_RETURN(r.secrets, Secrets(f.Raw("secrets"), ""));
  ASSIGN_OR_RETURN(r.http_rules, f.StringList("http_rules"));
  return r;
}

Result<AgentContinueRequest> ParseAgentContinue(const Json& j, bool answer) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  AgentContinueRequest r;
  ASSIGN_OR_RETURN(r.run, RunId(f));
  if (answer) {
    ASSIGN_OR_RETURN(r.answer, f.String("answer", ""));
    ASSIGN_OR_RETURN(bool approve, f.Bool("approve", false));
    ASSIGN_OR_RETURN(bool deny, f.Bool("deny", false));
    if (approve && deny) return InvalidArgument("'approve' and 'deny' cannot both be true");
    r.decision = approve ? "approve" : deny ? "deny" : "";
    if (r.answer.empty() && r.decision.empty()) {
      return InvalidArgument("'answer' must be a non-empty string (or approve or deny be true)");
    }
  }
  if (f.Has("model")) {
    auto model = agent::ModelSettings::FromJson(f.Raw("model"));
    if (!model.ok()) return model.status().Annotate("model");
    r.model = std::move(*model);
  }
  ASSIGN_OR_RETURN(r.limits, ParseLimits(f.Raw("limits")));
  return r;
}

void WipeModelKey(Json* request) {
  if (!request->is_object()) return;
  if (auto it = request->find("model"); it != request->end()) agent::WipeKey(&*it);
}

void WipeSecretValues(Json* request) {
  if (!request->is_object()) return;
  auto secrets = request->find("secrets");
  if (secrets == request->end() || !secrets->is_array()) return;
  for (Json& s : *secrets) {
    if (!s.is_object()) continue;
    auto value = s.find("value");
    if (value == s.end() || !value->is_string()) continue;
    std::string& text = value->get_ref<std::string&>();
    ::explicit_bzero(text.data(), text.capacity());
    text.clear();
  }
}

Result<RunRequest> ParseRunRequest(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  RunRequest r;
  ASSIGN_OR_RETURN(r.run, RunId(f));
  ASSIGN_OR_RETURN(r.follow, f.Bool("follow", false));
  return r;
}

Result<int64_t> ParseListLimit(const Json& j) {
  Fields f(j);
  RETURN_IF_ERROR(f.CheckObject());
  return f.Int("limit", 1, 1000, 50);
}

}  // namespace trybox::daemon
