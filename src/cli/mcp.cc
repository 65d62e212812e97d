#include "cli/mcp.h"

#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cli/agent_settings.h"
#include "cli/client.h"
#include "cli/image_recipe.h"
#include "cli/mcp_tools.h"
#include "cli/reply.h"
#include "cli/secret_flags.h"
#include "egress/allowlist.h"
#include "egress/http_rules.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/mutex.h"
#include "util/names.h"
#include "util/thread_annotations.h"

#ifndef TRYBOX_VERSION
#define TRYBOX_VERSION "0"
#endif

namespace trybox::cli {
namespace {

using Json = nlohmann::json;
using Kind = channel::Stream::Message::Kind;

constexpr int kParseError = -32700;
constexpr int kInvalidRequest = -32600;
constexpr int kMethodNotFound = -32601;
constexpr int kInvalidParams = -32602;

// Protocol revisions served, newest first. The differences that matter here: 2025-06-18
// added outputSchema/structuredContent (sent only to clients that negotiated it) and removed
// JSON-RPC batches (refused for every revision).
constexpr std::array<std::string_view, 4> kProtocolVersions = {"2025-11-25", "2025-06-18",
                                                               "2025-03-26", "2024-11-05"};

bool HasStructuredOutput(const std::string& version) { return version >= "2025-06-18"; }

constexpr const char* kToolName = "vm_agent";

// What the calling assistant reads to decide whether and how to use the tool.
constexpr const char* kToolDescription =
    "Hand a self-contained task to a second AI agent that works inside a fresh, throwaway "
    "Linux microVM, and get back a report. Use it for work that needs trying things rather "
    "than reasoning about them: building and testing code, running programs, reproducing a "
    "bug, installing packages, all without touching this machine. The VM reaches only the "
    "hosts listed in `allow`, or with `internet` any public host (never this machine's "
    "network: loopback, private and metadata addresses stay refused); every connection is "
    "decided and recorded by trybox, and the report's `network` section lists where it went "
    "and what was refused. With `workspace`, the agent works on a copy of that "
    "git working tree in /workspace and its changes are collected back without touching "
    "your working tree. With `verify`, trybox itself re-runs that shell command in a fresh "
    "VM on the agent's result, so success is checked rather than claimed. A run takes "
    "minutes.\n\n"
    "The report's `outcome` is one of:\n"
    "- DONE: the agent finished. `verdict` is VERIFIED (the verify command passed in a fresh "
    "VM), FAILED_VERIFICATION (it failed: treat the work as not done) or UNVERIFIED (no "
    "verify command was given, so nothing was checked).\n"
    "- NEEDS_INPUT: the agent asks `question`. Call again with `run_id` and `answer`; it "
    "continues in the same VM. When the report also has `approval`, the agent asked for "
    "network access to that host: only a person can grant it (`trybox approve RUN` or "
    "`trybox deny RUN`), so tell the user; an `answer` from you continues the run with the "
    "host still refused.\n"
    "- IN_PROGRESS: the run stopped before finishing (a turn, time or token limit, or an "
    "interrupted call). Call again with only `run_id` to let it continue.\n"
    "- ERROR: the run failed; the text says why.\n\n"
    "The agent's summary is its own claim and is not verified. The other facts in the report "
    "(verdict, commands, files changed, network access) are recorded by trybox, not written "
    "by the agent: trust them over the summary.";

Json VmAgentTool(bool structured_output) {
  Json string = {{"type", "string"}};
  Json tool = {
      {"name", kToolName},
      {"title", "Delegate a task to an agent in a throwaway VM"},
      {"description", kToolDescription},
      {"inputSchema",
       {{"type", "object"},
        {"properties",
         {{"task",
           {{"type", "string"},
            {"description",
             "What to do, self-contained: the agent sees only this text and the workspace. "
             "Say what done looks like. Starts a new run; do not combine with run_id."}}},
          {"image",
           {{"type", "string"},
            {"description",
             "Image to boot (default: agent.json's \"image\", else debian-12-dev, built on first "
             "use). Only with task."}}},
          {"workspace",
           {{"type", "string"},
            {"description",
             "Absolute path on this machine of a git working tree to copy into the VM at "
             "/workspace (tracked and untracked files, not ignored ones). The agent's changes "
             "are collected back; the report says where. Only with task."}}},
          {"verify",
           {{"type", "string"},
            {"description",
             "Shell command that checks the result, e.g. `make test`. After the agent says it "
             "is done, trybox runs it in a fresh VM with the agent's workspace changes; its "
             "exit status decides the verdict. Only with task."}}},
          {"allow",
           {{"type", "array"},
            {"items", string},
            {"description",
             "Hosts the VM may reach, as HOST[:PORT] (port 443 by default; *.example.com "
             "for subdomains), e.g. [\"pypi.org\", \"files.pythonhosted.org\"]. Everything "
             "else is refused. Only with task."}}},
          {"internet",
           {{"type", "boolean"},
            {"description",
             "true: the VM may reach any public host on any port instead of only `allow` "
             "(loopback, private, link-local and metadata addresses stay refused). Default: "
             "the user's agent.json \"internet\", else false. Only with task."}}},
          {"secrets",
           {{"type", "array"},
            {"items", string},
            {"description",
             "Names of secrets the user declared in trybox's secrets.json, e.g. "
             "[\"GH_TOKEN\"]. The VM sees each as an environment variable holding a "
             "placeholder; trybox puts the real value in only on HTTPS requests to that "
             "secret's hosts (which must also be in `allow`). Values are never given here, and "
             "never reach the agent. Only with task."}}},
          {"http_rules",
           {{"type", "array"},
            {"items", string},
            {"description",
             "HTTP rules, each 'allow|deny METHODS HOST[/PATH]', e.g. [\"allow GET,POST "
             "api.github.com/repos/OWNER/NAME\"]: once a host has a rule, each HTTPS "
             "request to it goes only if the first rule matching its method and path "
             "prefix allows it; refused requests get a 403 naming why. Only with task."}}},
          {"run_id",
           {{"type", "string"},
            {"description",
             "Continue an earlier run (the `run` of its report) instead of starting one: with "
             "`answer` for a NEEDS_INPUT run, alone for an IN_PROGRESS run."}}},
          {"answer",
           {{"type", "string"},
            {"description", "Your answer to a NEEDS_INPUT run's question. Needs run_id."}}}}},
        {"additionalProperties", false}}},
      // Advisory only: it runs commands in a VM it throws away, reaches the network it is
      // allowed to, and adds to the workspace's repository without rewriting anything.
      {"annotations",
       {{"readOnlyHint", false},
        {"destructiveHint", false},
        {"idempotentHint", false},
        {"openWorldHint", true}}}};
  if (structured_output) {
    // Loose on purpose: only what the description promises. The daemon's report carries
    // more fields, and an ERROR may have no run.
    tool["outputSchema"] = {
        {"type", "object"},
        {"properties",
         {{"run", {{"type", "string"}, {"description", "The run's id, for run_id"}}},
          {"outcome", {{"enum", {"DONE", "NEEDS_INPUT", "IN_PROGRESS", "ERROR"}}}},
          {"verdict", {{"enum", {"VERIFIED", "FAILED_VERIFICATION", "UNVERIFIED", nullptr}}}},
          {"approval",
           {{"type", {"object", "null"}},
            {"description",
             "NEEDS_INPUT for network access: the host and port the agent asked for, which "
             "only a person can grant (trybox approve RUN)"},
            {"properties",
             {{"host", {{"type", "string"}}},
              {"port", {{"type", "integer"}}},
              {"reason", {{"type", "string"}}}}}}},
          {"question",
           {{"type", {"object", "null"}},
            {"description", "NEEDS_INPUT: the agent's question (its words), to answer"},
            {"properties",
             {{"text", {{"type", "string"}}}, {"truncated", {{"type", "boolean"}}}}}}},
          {"claim",
           {{"type", {"object", "null"}},
            {"description",
             "DONE: the agent's summary, an unverified claim; status is contradicted when "
             "the supervisor's re-run failed"},
            {"properties",
             {{"summary", {{"type", "string"}}},
              {"status", {{"enum", {"unverified", "contradicted"}}}}}}}}}},
        {"required", {"outcome"}}};
  }
  return tool;
}

Json ToolText(const std::string& text, bool is_error) {
  return {{"content", {{{"type", "text"}, {"text", text}}}}, {"isError", is_error}};
}

Json ToolError(const std::string& text) { return ToolText(text, true); }

// A JSON-RPC id as MCP allows it: a string or an integer (never null).
bool IsValidId(const Json& id) { return id.is_string() || id.is_number_integer(); }

// The daemon request for a vm_agent call, or the message for the calling model.
Result<Json> BuildAgentRequest(const Json& args) {
  static const std::set<std::string> kKnown = {"task",    "image",     "workspace", "verify",
                                               "allow",   "internet",  "run_id",    "answer",
                                               "secrets", "http_rules"};
  for (const auto& [key, value] : args.items()) {
    if (!kKnown.count(key)) return InvalidArgument("unknown argument '" + key + "'");
    if (key == "internet") {
      if (!value.is_boolean()) return InvalidArgument("internet must be true or false");
      continue;
    }
    bool want_array = key == "allow" || key == "secrets" || key == "http_rules";
    if (want_array ? !value.is_array() : !value.is_string()) {
      return InvalidArgument(key +
                             (want_array ? " must be an array of strings" : " must be a string"));
    }
  }
  auto str = [&](const char* key) { return args.value(key, std::string()); };
  bool task = args.contains("task"), run = args.contains("run_id");
  if (task == run) {
    return InvalidArgument(task
                               ? "give either task (start a run) or run_id (continue one), not both"
                               : "give task to start a run, or run_id to continue one");
  }
  if (task) {
    if (str("task").empty()) return InvalidArgument("task is empty");
    if (args.contains("answer")) return InvalidArgument("answer needs run_id, not task");
    Json req = {{"verb", "agent"}, {"task", str("task")}};
    if (args.contains("image")) {
      RETURN_IF_ERROR(ValidateName("image name", str("image")));
      req["image"] = str("image");
    }
    if (args.contains("workspace")) {
      if (str("workspace").empty() || str("workspace")[0] != '/') {
        return InvalidArgument("workspace must be an absolute path on this machine");
      }
      req["workspace"] = str("workspace");
    }
    if (args.contains("verify")) {
      if (str("verify").empty()) return InvalidArgument("verify is empty");
      req["verify"] = str("verify");
    }
    if (args.contains("allow")) {
      for (const auto& a : args["allow"]) {
        if (!a.is_string()) return InvalidArgument("allow must be an array of strings");
        auto e = egress::ParseAllowEntry(a.get<std::string>());
        if (!e.ok()) return e.status().Annotate("allow");
      }
      req["allow"] = args["allow"];
    }
    if (args.contains("internet")) req["internet"] = args["internet"];
    if (args.contains("secrets")) {
      // Names only: the values are resolved from the user's secrets.json by the caller.
      for (const auto& n : args["secrets"]) {
        if (!n.is_string()) return InvalidArgument("secrets must be an array of strings");
        auto flag = ParseSecretFlag(n.get<std::string>());
        if (!flag.ok() || !flag->source.empty()) {
          return InvalidArgument(
              "secrets takes names declared in secrets.json, never a source "
              "or a value");
        }
      }
      req["secret_names"] = args["secrets"];
    }
    if (args.contains("http_rules")) {
      for (const auto& r : args["http_rules"]) {
        if (!r.is_string()) return InvalidArgument("http_rules must be an array of strings");
        auto rule = egress::ParseHttpRule(r.get<std::string>());
        if (!rule.ok()) return rule.status().Annotate("http_rules");
      }
      req["http_rules"] = args["http_rules"];
    }
    return req;
  }
  if (str("run_id").empty()) return InvalidArgument("run_id is empty");
  for (const char* key :
       {"image", "workspace", "verify", "allow", "internet", "secrets", "http_rules"}) {
    if (args.contains(key)) {
      return InvalidArgument(std::string(key) + " goes with task: a continued run keeps its VM");
    }
  }
  if (args.contains("answer")) {
    if (str("answer").empty()) return InvalidArgument("answer is empty");
    return Json{{"verb", "agent_answer"}, {"run", str("run_id")}, {"answer", str("answer")}};
  }
  return Json{{"verb", "agent_resume"}, {"run", str("run_id")}};
}

// The client-facing end. Whole lines only, from any thread; after a failed write (the
// client went away) further messages are dropped.
class Output {
 public:
  explicit Output(int fd) : fd_(fd) {}

  void Send(const Json& message) {
    // `replace`: text from the daemon or the guest may hold invalid UTF-8; dump() would
    // throw on it. Control characters are escaped, so the line has no embedded newline.
    std::string line = message.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    MutexLock lock(mu_);
    if (broken_) return;
    Status st = WriteFull(fd_, line);
    if (!st.ok()) {
      broken_ = true;
      LogWarn("mcp", "cannot write to the client: " + st.message());
    }
  }

  void Error(const Json& id, int code, const std::string& message) {
    Send({{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}});
  }
  void Reply(const Json& id, Json result) {
    Send({{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}});
  }

 private:
  const int fd_;
  Mutex mu_;
  bool broken_ GUARDED_BY(mu_) = false;
};

// One tools/call in flight. The call's thread reads the daemon stream; a cancellation resets
// the stream from the reading thread, which wakes it.
class Call {
 public:
  // How a call was stopped: by notifications/cancelled (the client wants no response), or by
  // the end of input (a response is still written, in case anyone reads it).
  enum class Ending { kRunning, kCancelled, kInputClosed };

  // Called with the stream once opened. False if the call was stopped already (then the
  // stream has been reset).
  bool Attach(std::shared_ptr<channel::Stream> stream) {
    MutexLock lock(mu_);
    stream_ = std::move(stream);
    if (ending_ != Ending::kRunning)
      (void)stream_->Reset("cancelled by the MCP client: " + reason_);
    return ending_ == Ending::kRunning;
  }

  // Resets the daemon stream; the daemon stops the run's current step. The first stop wins.
  void Stop(Ending how, const std::string& reason) {
    MutexLock lock(mu_);
    if (ending_ != Ending::kRunning) return;
    ending_ = how;
    reason_ = reason;
    if (stream_) (void)stream_->Reset("cancelled by the MCP client: " + reason);
  }

  Ending ending() const {
    MutexLock lock(mu_);
    return ending_;
  }
  std::string reason() const {
    MutexLock lock(mu_);
    return reason_;
  }

 private:
  mutable Mutex mu_;
  std::shared_ptr<channel::Stream> stream_ GUARDED_BY(mu_);
  Ending ending_ GUARDED_BY(mu_) = Ending::kRunning;
  std::string reason_ GUARDED_BY(mu_);
};

// notifications/progress values must increase strictly. The daemon sends its turn number,
// which repeats when a turn has several steps: those get a value between this turn and the
// next.
class ProgressCounter {
 public:
  std::optional<double> Next(int64_t turn) {
    double v = static_cast<double>(turn);
    if (v <= last_) v = last_ + (std::floor(last_) + 1 - last_) / 2;
    if (v <= last_) return std::nullopt;  // halved past double precision: skip it
    last_ = v;
    return v;
  }

 private:
  double last_ = -1;
};

Json ProgressNumber(double v) {
  if (v == std::floor(v)) return static_cast<int64_t>(v);
  return v;
}

class Server {
 public:
  Server(const McpOptions& options, int out_fd)
      : options_(options),
        tools_(options.tools.empty() ? mcp::AllToolNames() : options.tools),
        out_(out_fd),
        session_(options.paths, options.autostart) {}

  // One line from the client, without its newline.
  void HandleLine(std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) return;
    Json msg = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (msg.is_discarded()) return out_.Error(nullptr, kParseError, "parse error: not JSON");
    if (msg.is_array()) {
      return out_.Error(nullptr, kInvalidRequest,
                        "JSON-RPC batches are not supported: send one message per line");
    }
    if (!msg.is_object()) {
      return out_.Error(nullptr, kInvalidRequest, "a message must be a JSON object");
    }
    bool has_id = msg.contains("id");
    if (has_id && !IsValidId(msg["id"])) {
      return out_.Error(nullptr, kInvalidRequest, "id must be a string or an integer");
    }
    Json id = has_id ? msg["id"] : Json();
    if (msg.value("jsonrpc", Json()) != "2.0") {
      if (has_id) return out_.Error(id, kInvalidRequest, "jsonrpc must be \"2.0\"");
      return LogWarn("mcp", "ignored a notification without jsonrpc \"2.0\"");
    }
    if (!msg.contains("method")) {
      // A response: this server sends no requests, so nothing is waiting for it.
      if (msg.contains("result") || msg.contains("error")) return;
      return out_.Error(id, kInvalidRequest, "no method");
    }
    if (!msg["method"].is_string()) {
      if (has_id) return out_.Error(id, kInvalidRequest, "method must be a string");
      return;
    }
    std::string method = msg["method"].get<std::string>();
    Json params = msg.contains("params") ? msg["params"] : Json::object();
    if (!has_id) return HandleNotification(method, params);
    if (!params.is_object()) return out_.Error(id, kInvalidParams, "params must be an object");
    if (method == "initialize") return Initialize(id, params);
    if (method == "ping") return out_.Reply(id, Json::object());
    if (method == "tools/list") {
      if (params.contains("cursor")) {
        return out_.Error(id, kInvalidParams, "invalid cursor: the tool list has one page");
      }
      bool structured = HasStructuredOutput(version());
      Json tools = Json::array();
      for (const auto& name : tools_) {
        tools.push_back(name == kToolName ? VmAgentTool(structured)
                                          : mcp::VmToolDefinition(name, structured));
      }
      return out_.Reply(id, {{"tools", std::move(tools)}});
    }
    if (method == "tools/call") return StartCall(id, params);
    out_.Error(id, kMethodNotFound, "method not found: " + method);
  }

  // A line longer than the limit: its id is unknown, as it is never parsed.
  void RefuseOversized() {
    out_.Error(nullptr, kInvalidRequest,
               "message longer than " + std::to_string(options_.max_line_bytes) + " bytes");
  }

  // EOF: the client is shutting down. Stops every call and waits for them.
  void Shutdown() {
    std::vector<std::thread> threads;
    {
      MutexLock lock(mu_);
      for (auto& [key, call] : calls_)
        call->Stop(Call::Ending::kInputClosed, "the client closed stdin");
      for (auto& [key, t] : threads_) threads.push_back(std::move(t));
      threads_.clear();
    }
    for (auto& t : threads) t.join();
  }

 private:
  std::string version() {
    MutexLock lock(mu_);
    return version_;
  }

  void HandleNotification(const std::string& method, const Json& params) {
    if (method == "notifications/cancelled") {
      if (!params.is_object() || !params.contains("requestId")) return;
      std::string reason;
      if (params.contains("reason") && params["reason"].is_string())
        reason = params["reason"].get<std::string>();
      MutexLock lock(mu_);
      // Unknown or finished requests are ignored: the race with the response is expected.
      auto it = calls_.find(params["requestId"].dump());
      if (it != calls_.end())
        it->second->Stop(Call::Ending::kCancelled, reason.empty() ? "no reason given" : reason);
    }
    // notifications/initialized and anything else: nothing to do.
  }

  void Initialize(const Json& id, const Json& params) {
    if (!params.contains("protocolVersion") || !params["protocolVersion"].is_string()) {
      return out_.Error(id, kInvalidParams, "initialize needs protocolVersion (a string)");
    }
    std::string asked = params["protocolVersion"].get<std::string>();
    std::string chosen(kProtocolVersions[0]);
    for (auto v : kProtocolVersions) {
      if (v == asked) chosen = asked;
    }
    {
      MutexLock lock(mu_);
      if (initialized_) return out_.Error(id, kInvalidRequest, "already initialized");
      initialized_ = true;
      version_ = chosen;
    }
    LogInfo("mcp", "initialize: client asked for " + asked + ", serving " + chosen);
    out_.Reply(id, {{"protocolVersion", chosen},
                    {"capabilities", {{"tools", {{"listChanged", false}}}}},
                    {"serverInfo", {{"name", "trybox"}, {"version", TRYBOX_VERSION}}},
                    {"instructions",
                     "trybox gives you throwaway Linux VMs. vm_agent hands a whole task to a "
                     "second agent in a VM and reports what happened (runs take minutes; "
                     "progress is reported per turn when the call has a progressToken). "
                     "vm_create, vm_exec, vm_read_file, vm_write_file, vm_list_dir and "
                     "vm_destroy let you work in a VM yourself. Exit codes are recorded by "
                     "trybox; output and files are the guest's and untrusted."}});
  }

  void StartCall(const Json& id, const Json& params) {
    if (!params.contains("name") || !params["name"].is_string()) {
      return out_.Error(id, kInvalidParams, "tools/call needs name (a string)");
    }
    const std::string tool = params["name"].get<std::string>();
    if (std::find(tools_.begin(), tools_.end(), tool) == tools_.end()) {
      return out_.Error(id, kInvalidParams, "unknown tool: " + tool);
    }
    Json args = params.contains("arguments") ? params["arguments"] : Json::object();
    if (!args.is_object()) return out_.Error(id, kInvalidParams, "arguments must be an object");
    Json token;
    if (params.contains("_meta") && params["_meta"].is_object() &&
        params["_meta"].contains("progressToken")) {
      token = params["_meta"]["progressToken"];
      if (!IsValidId(token)) {
        return out_.Error(id, kInvalidParams, "progressToken must be a string or an integer");
      }
    }
    const std::string key = id.dump();
    auto call = std::make_shared<Call>();
    MutexLock lock(mu_);
    if (calls_.count(key)) return out_.Error(id, kInvalidRequest, "request id already in use");
    // Threads of finished calls are joined here, so a long session does not pile them up.
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (calls_.count(it->first)) {
        ++it;
      } else {
        it->second.join();
        it = threads_.erase(it);
      }
    }
    calls_[key] = call;
    bool structured = HasStructuredOutput(version_);
    threads_[key] = std::thread([this, id, key, call, tool, args, token, structured] {
      std::optional<Json> result =
          tool == kToolName ? RunCall(*call, args, token, structured)
                            : mcp::RunVmTool(tool, args, session_, structured,
                                             [&call](std::shared_ptr<channel::Stream> s) {
                                               return call->Attach(std::move(s));
                                             });
      if (result && call->ending() != Call::Ending::kCancelled) out_.Reply(id, std::move(*result));
      MutexLock lock(mu_);
      calls_.erase(key);
    });
  }

  // The tool result, or nullopt once the call is cancelled.
  std::optional<Json> RunCall(Call& call, const Json& args, const Json& token, bool structured) {
    auto req = BuildAgentRequest(args);
    if (!req.ok()) return ToolError("vm_agent: " + req.status().message());
    auto model = ResolveModel(options_.paths, options_.model, options_.env);
    if (model.ok()) {
      (*req)["model"] = std::move(*model);
    } else if ((*req)["verb"] == "agent" || model.status().code() != Code::kNotFound) {
      // A continued run may go on with the model it started with; a new one needs one.
      return ToolError(model.status().message());
    }
    if (auto names = req->find("secret_names"); names != req->end()) {
      auto secrets = ResolveSecrets(options_.paths, names->get<std::vector<std::string>>());
      if (!secrets.ok()) return ToolError("vm_agent: " + secrets.status().message());
      req->erase("secret_names");
      (*req)["secrets"] = std::move(*secrets);
    }
    if ((*req)["verb"] == "agent") {
      // The image as `trybox agent` chooses it (the argument, agent.json, the default),
      // built on first use; its progress goes to this server's stderr.
      auto image = ResolveAgentImage(options_.paths, req->value("image", std::string()));
      if (!image.ok()) return ToolError("vm_agent: " + image.status().message());
      (*req)["image"] = *image;
      std::optional<bool> asked;
      if (req->contains("internet")) asked = (*req)["internet"].get<bool>();
      auto internet = ResolveAgentInternet(options_.paths, asked);
      if (!internet.ok()) return ToolError("vm_agent: " + internet.status().message());
      (*req)["internet"] = *internet;
      Status built = BuildOnFirstUse(options_.paths, *image, /*progress=*/false, std::cerr);
      if (!built.ok()) return ToolError("vm_agent: " + built.message());
    }
    auto client = Client::Connect(options_.paths, options_.autostart);
    if (!client.ok()) return ToolError(client.status().message());
    auto stream = (*client)->Open(*req);
    if (!stream.ok()) return ToolError("tryboxd: " + stream.status().message());
    if (!call.Attach(*stream)) return Stopped(call, "");
    std::string run;
    ProgressCounter counter;
    for (;;) {
      auto m = (*stream)->Next();
      if (!m.ok()) {
        // A stop resets the stream, which ends Next(); an END that won the race still counts
        // (and the caller drops it if the client cancelled).
        if (call.ending() != Call::Ending::kRunning) return Stopped(call, run);
        std::string text = "lost tryboxd";
        if (!run.empty()) text += " during run " + run;
        text += ": " + m.status().message();
        if (!run.empty()) text += ". Call vm_agent with run_id " + run + " to resume it.";
        return ToolError(text);
      }
      if (m->kind == Kind::kEvent) {
        auto note = ReadEvent(m->body, &run);
        if (!note.ok()) {
          (void)(*stream)->Reset("malformed event");
          return ToolError(note.status().message());
        }
        if (!note->has_value() || token.is_null() || call.ending() != Call::Ending::kRunning) {
          continue;
        }
        auto v = counter.Next((*note)->turn);
        if (!v) continue;
        Json params = {{"progressToken", token}, {"progress", ProgressNumber(*v)}};
        if ((*note)->total) params["total"] = *(*note)->total;
        if ((*note)->message) params["message"] = *(*note)->message;
        out_.Send({{"jsonrpc", "2.0"}, {"method", "notifications/progress"}, {"params", params}});
      } else if (m->kind == Kind::kEnd) {
        Status st = StatusFromReply(m->body);
        if (!st.ok()) return ToolError(st.message());
        ReplyView body(m->body);
        auto report = body.Object("report");
        auto text = body.String("text");
        if (!report.ok() || !text.ok()) {
          return ToolError((report.ok() ? text.status() : report.status()).message() +
                           " (is tryboxd older than this trybox?)");
        }
        auto outcome = report->StringOr("outcome", "");
        if (!outcome.ok()) return ToolError(outcome.status().message());
        Json result = ToolText(*text, *outcome == "ERROR");
        if (structured) result["structuredContent"] = report->json();
        return result;
      } else if (m->kind == Kind::kReset) {
        std::string what = "the run";
        if (!run.empty()) what += " " + run;
        return ToolError(StatusFromReset(m->body, what).message());
      }
    }
  }

  // What an EVENT from the daemon says: `run` is updated from {"run": ID}; a progress step
  // comes back as a note. A field of the wrong type is a malformed-reply error.
  struct ProgressNote {
    int64_t turn = 0;
    std::optional<int64_t> total;
    std::optional<std::string> message;
  };
  static Result<std::optional<ProgressNote>> ReadEvent(const Json& ev, std::string* run) {
    ReplyView v(ev);
    ASSIGN_OR_RETURN(auto id, v.OptionalString("run"));
    if (id) *run = *id;
    ASSIGN_OR_RETURN(auto p, v.OptionalObject("progress"));
    if (!p) return std::optional<ProgressNote>();
    ProgressNote note;
    ASSIGN_OR_RETURN(note.turn, p->IntOr("turn", 0));
    if (p->Has("max_turns")) {
      ASSIGN_OR_RETURN(note.total, p->Int("max_turns", 0));
    }
    ASSIGN_OR_RETURN(note.message, p->OptionalString("message"));
    return std::optional<ProgressNote>(std::move(note));
  }

  static std::optional<Json> Stopped(const Call& call, const std::string& run) {
    std::string text = "cancelled by the MCP client (" + call.reason() + ")";
    if (!run.empty())
      text += "; run " + run +
              " was cancelled (a cancelled run cannot be resumed; `trybox agent show " + run +
              "` shows what it did).";
    LogInfo("mcp", text);
    if (call.ending() == Call::Ending::kCancelled) return std::nullopt;
    return ToolError(text);
  }

  const McpOptions& options_;
  const std::vector<std::string> tools_;
  Output out_;
  mcp::Session session_;
  Mutex mu_;
  bool initialized_ GUARDED_BY(mu_) = false;
  std::string version_ GUARDED_BY(mu_){kProtocolVersions[0]};
  // Keyed by the request id's JSON text, so 1 and "1" stay distinct.
  std::map<std::string, std::shared_ptr<Call>> calls_ GUARDED_BY(mu_);
  std::map<std::string, std::thread> threads_ GUARDED_BY(mu_);
};

}  // namespace

int RunMcpServer(const McpOptions& options, int in_fd, int out_fd) {
  ::signal(SIGPIPE, SIG_IGN);
  Server server(options, out_fd);
  std::string pending;
  bool oversized = false;  // discarding the rest of a line that was too long
  std::string buf(64 * 1024, '\0');
  int code = 0;
  for (;;) {
    auto n = ReadSome(in_fd, buf.data(), buf.size());
    if (!n.ok()) {
      LogError("mcp", "reading stdin: " + n.status().message());
      code = 1;
      break;
    }
    if (*n == 0) break;
    std::string_view chunk(buf.data(), *n);
    while (!chunk.empty()) {
      size_t nl = chunk.find('\n');
      std::string_view piece = chunk.substr(0, nl);
      if (!oversized && pending.size() + piece.size() > options.max_line_bytes) {
        oversized = true;
        std::string().swap(pending);
        server.RefuseOversized();
      }
      if (!oversized) pending.append(piece);
      if (nl == std::string_view::npos) break;
      chunk.remove_prefix(nl + 1);
      if (!oversized) server.HandleLine(pending);
      pending.clear();
      oversized = false;
    }
  }
  if (!oversized && !pending.empty()) server.HandleLine(pending);  // a last line without \n
  server.Shutdown();
  return code;
}

}  // namespace trybox::cli
