#include "agent/tools.h"

#include "agent/text.h"

namespace trybox::agent {
namespace {

Json Schema(Json properties, std::vector<std::string> required) {
  return {{"type", "object"}, {"properties", std::move(properties)}, {"required", required}};
}

Status Bad(const std::string& tool, const std::string& what) {
  return InvalidArgument(tool + ": " + what);
}

Result<std::string> String(const Json& in, const std::string& tool, const char* field,
                           bool required, bool non_empty) {
  if (!in.contains(field)) {
    if (required) return Bad(tool, std::string("missing '") + field + "'");
    return std::string();
  }
  if (!in[field].is_string()) return Bad(tool, std::string("'") + field + "' must be a string");
  std::string v = in[field];
  if (non_empty && v.empty()) return Bad(tool, std::string("'") + field + "' must not be empty");
  return v;
}

Result<int64_t> Integer(const Json& in, const std::string& tool, const char* field, int64_t dflt,
                        int64_t lo, int64_t hi) {
  if (!in.contains(field) || in[field].is_null()) return dflt;
  const Json& v = in[field];
  if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == int64_t(v))) {
    return Bad(tool, std::string("'") + field + "' must be an integer");
  }
  int64_t n = v.is_number_integer() ? v.get<int64_t>() : int64_t(v.get<double>());
  if (n < lo || n > hi) {
    return Bad(tool, std::string("'") + field + "' must be between " + std::to_string(lo) +
                         " and " + std::to_string(hi) + ", got " + std::to_string(n));
  }
  return n;
}

}  // namespace

const std::vector<ToolSpec>& AgentTools() {
  static const std::vector<ToolSpec> tools = {
      {"run",
       "Run a shell command (/bin/sh -c) in the VM, in /workspace unless it changes directory. "
       "Returns the exit code (or how it failed: timed out, killed by a signal, not found), "
       "the duration and the combined stdout+stderr, capped at 16 KiB with the middle cut.",
       Schema({{"command", {{"type", "string"}, {"description", "The shell command line"}}},
               {"timeout_s",
                {{"type", "integer"},
                 {"description", "Kill it after this many seconds (default 120, at most 1800)"}}}},
              {"command"})},
      {"write_file",
       "Create or replace a file in the VM (parent directories are created). Relative paths "
       "are under /workspace. At most 1 MiB.",
       Schema(
           {{"path", {{"type", "string"}}},
            {"content", {{"type", "string"}}},
            {"mode", {{"type", "integer"}, {"description", "Permission bits, e.g. 493 (0755)"}}}},
           {"path", "content"})},
      {"read_file",
       "Read a file in the VM. Relative paths are under /workspace. Returns at most 64 KiB "
       "(less with max_bytes); a longer file is cut and says so.",
       Schema({{"path", {{"type", "string"}}}, {"max_bytes", {{"type", "integer"}}}}, {"path"})},
      {"list_dir",
       "List a directory in the VM (names, types, sizes). Relative paths are under /workspace.",
       Schema({{"path", {{"type", "string"}}}}, {"path"})},
      {"ask",
       "Ask the person who gave you the task a question, when you cannot go on without an "
       "answer. The run pauses; the answer comes back as the next message, in the same VM.",
       Schema({{"question", {{"type", "string"}}}}, {"question"})},
      {"request_network",
       "Ask for network access to one more host, when the work "
       "cannot go on without it. Give the host, the port (443 unless another) and why. The "
       "operator's policy may grant or refuse it at once; otherwise the run pauses until a "
       "person approves or refuses, and the answer comes back as this call's result.",
       Schema({{"host", {{"type", "string"}, {"description", "A host name, e.g. pypi.org"}}},
               {"port", {{"type", "integer"}, {"description", "TCP port (default 443)"}}},
               {"reason", {{"type", "string"}, {"description", "Why the work needs it"}}}},
              {"host", "reason"})},
      {"finish",
       "End the task. Give a short summary of what you did and found, and a shell command "
       "that checks the result (run from /workspace, exit code 0 means it works). The "
       "supervisor re-runs that command in a fresh VM from the files in /workspace, so the "
       "command must not depend on anything outside /workspace that you installed or changed.",
       Schema({{"summary", {{"type", "string"}}},
               {"verify_command",
                {{"type", "string"},
                 {"description", "Shell command that exits 0 when the work is correct"}}}},
              {"summary"})},
  };
  return tools;
}

std::string SystemPrompt(const ImageFacts& image) {
  std::string about = image.distribution;
  if (!image.name.empty()) about += ", image " + image.name;
  std::string tools;
  if (!image.checks.empty()) {
    tools = "- These commands are known to work in this image: ";
    for (size_t i = 0; i < image.checks.size(); ++i) {
      tools += (i ? "; " : "") + image.checks[i];
    }
    tools += ". Other tools may be missing; check with `command -v` before relying on one.\n";
  }
  return "You are working inside a throwaway Linux virtual machine (" + about +
         ") on a task given by "
         "another assistant. Use the tools to try things for real: write files, run them, read "
         "the actual errors and fix them. Do not guess what a command would print; run it.\n" +
         tools +
         "- Your working directory is /workspace. Only files under /workspace are kept when you "
         "finish; everything else in the VM is discarded.\n"
         "- The VM's network reaches only the hosts the caller's policy allows, by name: "
         "through the HTTP proxy in HTTPS_PROXY (a refusal says why in its 403), and for "
         "programs that ignore it through the VM's own resolver (a refused name does not "
         "resolve). UDP other than DNS goes nowhere. If the work needs a host that is "
         "refused, call request_network.\n"
         "- Tool results are capped; a cut is marked.\n"
         "- When you are done, call finish with a summary and a verification command that "
         "exits 0 when the work is correct. It is re-run by the supervisor in a fresh VM from "
         "/workspace, and your summary is shown to the caller as an unverified claim next to "
         "that result.\n"
         "- If you cannot go on without information only the caller has, call ask.";
}

Result<std::string> GuestPath(const std::string& path) {
  if (path.empty()) return InvalidArgument("'path' must not be empty");
  if (path.find('\0') != std::string::npos) return InvalidArgument("'path' contains a NUL byte");
  std::string full = path[0] == '/' ? path : "/workspace/" + path;
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= full.size()) {
    size_t j = full.find('/', i);
    if (j == std::string::npos) j = full.size();
    std::string p = full.substr(i, j - i);
    if (p == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!p.empty() && p != ".") {
      parts.push_back(p);
    }
    i = j + 1;
  }
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

Result<ToolArgs> ParseToolCall(const ToolCall& call) {
  const std::string& t = call.name;
  if (!call.input_error.empty()) {
    return Bad(t, "the arguments are not a JSON object (" + call.input_error +
                      "); send them again as a JSON object");
  }
  const Json& in = call.input;
  if (!in.is_object()) return Bad(t, "the arguments must be a JSON object");
  if (t == "run") {
    RunArgs a;
    ASSIGN_OR_RETURN(a.command, String(in, t, "command", true, true));
    ASSIGN_OR_RETURN(int64_t s,
                     Integer(in, t, "timeout_s", kDefaultRunTimeoutS, 1, kMaxRunTimeoutS));
    a.timeout_s = static_cast<int>(s);
    return ToolArgs(a);
  }
  if (t == "write_file") {
    WriteArgs a;
    ASSIGN_OR_RETURN(a.path, String(in, t, "path", true, true));
    ASSIGN_OR_RETURN(a.content, String(in, t, "content", true, false));
    if (a.content.size() > kMaxWriteBytes) {
      return Bad(t, "'content' is " + std::to_string(a.content.size()) +
                        " bytes; at most 1 MiB per call (write in parts with run and cat >>)");
    }
    ASSIGN_OR_RETURN(int64_t m, Integer(in, t, "mode", 0644, 0, 07777));
    a.mode = static_cast<int>(m);
    return ToolArgs(a);
  }
  if (t == "read_file") {
    ReadArgs a;
    ASSIGN_OR_RETURN(a.path, String(in, t, "path", true, true));
    ASSIGN_OR_RETURN(a.max_bytes, Integer(in, t, "max_bytes", kMaxReadBytes, 1, kMaxReadBytes));
    return ToolArgs(a);
  }
  if (t == "list_dir") {
    ListArgs a;
    ASSIGN_OR_RETURN(a.path, String(in, t, "path", true, true));
    return ToolArgs(a);
  }
  if (t == "ask") {
    AskArgs a;
    ASSIGN_OR_RETURN(a.question, String(in, t, "question", true, true));
    return ToolArgs(a);
  }
  if (t == "request_network") {
    NetworkArgs a;
    ASSIGN_OR_RETURN(a.host, String(in, t, "host", true, true));
    ASSIGN_OR_RETURN(int64_t port, Integer(in, t, "port", 443, 1, 65535));
    a.port = static_cast<int>(port);
    ASSIGN_OR_RETURN(std::string reason, String(in, t, "reason", true, true));
    a.reason = CapChars(reason, kMaxNetworkReasonChars);
    return ToolArgs(a);
  }
  if (t == "finish") {
    FinishArgs a;
    ASSIGN_OR_RETURN(a.summary, String(in, t, "summary", true, false));
    ASSIGN_OR_RETURN(a.verify_command, String(in, t, "verify_command", false, false));
    return ToolArgs(a);
  }
  std::string names;
  for (const auto& spec : AgentTools()) names += (names.empty() ? "" : ", ") + spec.name;
  return InvalidArgument("there is no tool named " + Json(t).dump() + " (tools: " + names + ")");
}

}  // namespace trybox::agent
