// The VM tools of `trybox mcp` beside vm_agent: vm_create, vm_exec, vm_read_file,
// vm_write_file, vm_list_dir and vm_destroy. Each is one or two daemon verbs
// (docs/protocol/daemon.md); their schemas, results and errors are in docs/protocol/mcp.md.
//
// Split in two halves so that the first can be tested without a daemon:
//  - Parse*: the tool's arguments, validated strictly (an unknown argument or a wrong type is
//    an error naming it), into the typed request;
//  - RunVmTool: the call against tryboxd, giving the CallToolResult (text for the model, and
//    structuredContent when the client negotiated it).
//
// What is trusted: exit codes, outcomes, byte counts and exec ids are recorded by tryboxd
// and trybox-init; command output, file contents and directory listings are whatever the
// guest's programs made them, and the tool descriptions tell the model so.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "channel/mux.h"
#include "cli/client.h"
#include "util/mutex.h"
#include "util/paths.h"
#include "util/status.h"

namespace trybox::cli::mcp {

using Json = nlohmann::json;

// Every tool `trybox mcp` can serve, in listing order (vm_agent first).
const std::vector<std::string>& AllToolNames();

// `--tools a,b,c`: the chosen names, in listing order. Empty `spec`: all of them. An
// unknown or repeated name is kInvalidArgument naming it.
Result<std::vector<std::string>> ChooseTools(const std::string& spec);

// The tools/list entry of one of the VM tools (not vm_agent), with outputSchema when
// `structured_output`.
Json VmToolDefinition(const std::string& name, bool structured_output);

struct CreateArgs {
  std::string image;  // empty: the daemon's default
  std::vector<std::string> allow;
  bool internet = false;                // any public host instead of `allow`
  std::vector<std::string> secrets;     // names from secrets.json only, never values
  std::vector<std::string> http_rules;  // egress/http_rules.h texts
  std::optional<int64_t> memory_mib, cpus;
  bool keep = false;  // outlive the MCP session
};
struct ExecArgs {
  std::string vm;
  std::vector<std::string> argv;  // from `argv`, or {"/bin/sh", "-c", command}
  std::string cwd;                // empty: the daemon's default
  std::map<std::string, std::string> env;
  int64_t timeout_ms = 0;
  std::string user;       // empty: root
  size_t max_output = 0;  // bytes kept per stream for the reply
};
struct ReadArgs {
  std::string vm, path;
  size_t max_bytes = 0;
};
struct WriteArgs {
  std::string vm, path;
  std::string content;  // the exact bytes (from `content` or `content_b64`)
  uint32_t mode = 0644;
  bool mkdirs = true;
};
struct ListArgs {
  std::string vm, path;
  int depth = 1;
  size_t limit = 0;
};
struct DestroyArgs {
  std::string vm;
};

Result<CreateArgs> ParseCreate(const Json& args);
Result<ExecArgs> ParseExec(const Json& args);
Result<ReadArgs> ParseRead(const Json& args);
Result<WriteArgs> ParseWrite(const Json& args);
Result<ListArgs> ParseList(const Json& args);
Result<DestroyArgs> ParseDestroy(const Json& args);

// Output kept for a reply: the first and the last max/2 bytes of a stream, and its total.
class OutputKeeper {
 public:
  explicit OutputKeeper(size_t max) : max_(max) {}
  void Add(std::string_view bytes);
  uint64_t total() const { return total_; }
  bool truncated() const { return total_ > max_; }
  // The kept bytes; when truncated, head and tail joined by a line saying what was left out.
  std::string Text(const std::string& omitted_hint) const;

 private:
  size_t max_;
  uint64_t total_ = 0;
  std::string head_;
  std::string tail_;  // a rolling window of the last max/2 bytes once the head is full
};

// One entry of vm_list_dir, parsed from the records `find -printf` writes in the guest.
struct DirEntry {
  std::string path;  // relative to the listed directory
  std::string type;  // file, dir, symlink, other
  uint64_t size = 0;
  std::string mode;    // octal permission bits, e.g. "755"
  double mtime = 0;    // seconds since the epoch
  std::string target;  // a symlink's target
};
// The argv that lists `a` in the guest, and the parser of its stdout. A malformed record
// (the guest's `find` is the guest's word) is kInternal naming it.
std::vector<std::string> ListDirArgv(const ListArgs& a);
Result<std::vector<DirEntry>> ParseFindRecords(std::string_view out);

// What a tool call needs beside its arguments.
class Session {
 public:
  Session(Paths paths, bool autostart) : paths_(std::move(paths)), autostart_(autostart) {}

  // A fresh connection for one call.
  Result<std::unique_ptr<Client>> Connect() const { return Client::Connect(paths_, autostart_); }
  // The session's own connection, kept open until the server ends: VMs created on it without
  // `keep` are destroyed by tryboxd when it closes (the `ephemeral` create), so a session
  // that ends, even by SIGKILL, leaves none of them behind.
  Result<Client*> Owner();

 private:
  const Paths paths_;
  const bool autostart_;
  Mutex mu_;
  std::unique_ptr<Client> owner_ GUARDED_BY(mu_);
};

// Runs one VM tool. `attach` is called with every daemon stream the call opens; false means
// the call was cancelled (the stream has been reset) and the runner returns nullopt as soon
// as it can. Failures are tool errors (isError), never JSON-RPC errors.
std::optional<Json> RunVmTool(const std::string& name, const Json& args, Session& session,
                              bool structured_output,
                              const std::function<bool(std::shared_ptr<channel::Stream>)>& attach);

}  // namespace trybox::cli::mcp
