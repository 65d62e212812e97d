// The daemon's verbs as typed requests, parsed and validated from their OPEN payloads
// (docs/protocol/daemon.md). Pure: no I/O, no state. Every field is type- and range-checked
// before any work starts; an error names the field. Unknown fields are ignored, so an older
// daemon can serve a newer client's optional fields; no internal option (such as the branch
// a vm_agent run commits on) is reachable from here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/model.h"
#include "daemon/wire.h"
#include "egress/secrets.h"

namespace trybox::daemon {

inline constexpr const char* kDefaultImage = "debian-12";
inline constexpr int64_t kMinMemoryMib = 128;
inline constexpr int64_t kMaxMemoryMib = 65536;
inline constexpr int64_t kMaxCpus = 64;
// The longest timeout a client may ask for: about 35 years, far past any VM's life, small
// enough that adding it to a clock never overflows.
inline constexpr int64_t kMaxTimeoutMs = int64_t{1} << 40;
inline constexpr int64_t kMaxArgs = 4096;
inline constexpr int64_t kMaxTermDimension = 65535;  // a struct winsize field
inline constexpr int kMaxSignal = 64;

// A terminal's size in character cells.
struct TermSize {
  int rows = 24;
  int cols = 80;
};

struct CreateRequest {
  std::string image = kDefaultImage;
  int memory_mib = 512;
  int cpus = 1;
  bool ephemeral = false;  // destroyed when the creating connection closes
  bool cold = false;
  // Egress (docs/protocol/egress.md, "Policy"): internet mode, or the allow-list of `allow`
  // and the named profiles; `deny` subtracts in either mode.
  bool internet = false;
  std::vector<std::string> allow;
  std::vector<std::string> profiles;
  std::vector<std::string> deny;
  // Commands keep every capability (docs/security.md): the channel is then within a
  // command's reach, and the VM's results are the guest's word.
  bool privileged = false;
  // Secrets the guest sees only as placeholders (docs/secrets.md). Values are never echoed,
  // and held in pages of their own from parsing on. Null: none.
  std::shared_ptr<const egress::HeldSecrets> secrets;
  // HTTP rules (egress/http_rules.h), as written: "allow GET api.github.com/repos/A/B".
  std::vector<std::string> http_rules;
};

struct VmRequest {  // destroy
  std::string vm;
};

struct EgressRequest {  // egress: a running VM's list grows or shrinks
  std::string vm;
  std::vector<std::string> allow;
  std::vector<std::string> deny;
};

struct ServeRequest {  // serve
  std::string listen = "127.0.0.1:0";
  bool stop = false;
};

struct ApiKeyRequest {  // api_key_create, api_key_rm
  std::string name;
  std::string scope = "sandboxes";  // api_key_create: "sandboxes" or "operator"
};

struct DoctorRequest {
  bool probe = false;  // probe the acceleration again instead of using the kept answer
};

struct PruneRequest {
  bool dry_run = false;  // count what the retention would free, free nothing
};

// daemon_status, daemon_reload: no fields. daemon_stop: `restart` says the client starts a
// daemon again at once (logged; the daemon stops the same way).
struct DaemonStatusRequest {};
struct DaemonReloadRequest {};
struct DaemonStopRequest {
  bool restart = false;
};

struct ExecRequest {
  std::string vm;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::optional<std::string> cwd;  // default: /workspace once the VM has one, else /root
  int64_t timeout_ms = 0;          // 0: none
  bool stdin = false;
  std::string user;  // "" = the guest's default (root)
  // Run on a pseudo-terminal of this size (output merged on channel 1, input from channel 0,
  // resize EVENTs from the client).
  std::optional<TermSize> tty;
  // Start it and answer with its exec id at once; it runs with no client attached.
  bool detach = false;
};

struct LogsRequest {  // logs
  int64_t exec = 0;
  bool stderr = false;        // the exec's stderr instead of its stdout
  bool both = false;          // stdout on channel 1 and stderr on channel 2, as they come
  int64_t offset = 0;         // a position in the whole output (docs/protocol/daemon.md, "logs")
  int64_t stderr_offset = 0;  // with `both`: the position in stderr
  bool follow = false;        // wait for more until the exec ends
};

struct KillRequest {  // kill
  int64_t exec = 0;
  int signal = 9;
};

struct PortRequest {  // port: one TCP connection to 127.0.0.1:port in the guest
  std::string vm;
  int port = 0;
};

struct PutRequest {
  std::string vm;
  std::string path;
  std::string kind;  // "file" or "tar"
  int64_t mode = 0644;
  std::optional<int64_t> mtime_ns;  // as sent; absent: the guest's clock at write
  bool mkdirs = false;
};

struct GetRequest {
  std::string vm;
  std::string path;
};

struct AuditRequest {
  std::string vm;  // "" = every VM
  int64_t limit = 1000;
  std::optional<int64_t> before_id;  // paging: rows older than this id
};

struct WorkspaceInRequest {
  std::string vm;
  std::string dir;
  int64_t quota_bytes = 0;    // 0: the default
  int64_t quota_entries = 0;  // 0: the default
  bool setup = true;
  int64_t setup_timeout_ms = 0;
};

struct CollectRequest {
  std::string vm;
  std::string into;  // "" = a temporary directory
  bool commit = true;
  std::string command;  // for the commit message; "" = the VM's last exec
};

struct DiffRequest {
  std::string vm;
  int64_t offset = 0;  // paging of the change list
  int64_t limit = 0;   // 0: the default page
  bool patch = false;  // also the commit's patch (WorkspaceService::Patch)
};

// commit: a running VM's disk state as a new image (docs/images.md, "Derived images").
struct CommitRequest {
  std::string vm;
  std::string name;                        // the new image's name
  std::map<std::string, std::string> env;  // baked into the image for every exec
  Json recipe;                             // null or an object, stored verbatim
  std::string recipe_sha256;               // "" or 64 lowercase hex digits
  std::vector<std::string> packages;       // recorded in the manifest
  bool replace = false;                    // swap out an existing image of that name
  bool checks_pending = false;             // a recipe build's staged image (image/image.h)
};

struct ImageNameRequest {  // image_rm
  std::string name;
};

struct AgentLimits {
  int max_turns = 40;
  int wall_clock_s = 900;
  int64_t max_tokens = 2'000'000;
};

struct AgentRequest {
  std::string task;
  std::string image = kDefaultImage;
  std::string workspace;  // "" = none: the run gets an empty repository of its own
  std::string verify;
  bool internet = false;
  std::vector<std::string> allow;
  std::vector<std::string> profiles;
  std::vector<std::string> deny;
  int memory_mib = 1024;
  int cpus = 1;
  bool cold = false;
  agent::ModelSettings model;  // holds the key: never logged, never stored
  AgentLimits limits;
  // The run's VM and its verification VM get these as create's `secrets` (placeholders in
  // the guest). Values: never logged, never stored, held in pages of their own from parsing
  // on (the run keeps this pointer). Null: none.
  std::shared_ptr<const egress::HeldSecrets> secrets;
  // The run's VM's HTTP rules (create's `http_rules`); not its verification VM's,
  // which runs the operator's command rather than the agent's.
  std::vector<std::string> http_rules;
};

struct AgentContinueRequest {
  std::string run;
  std::string answer;  // agent_answer only
  // agent_answer to a request_network: "approve", "deny" or "" (a text answer, which
  // grants nothing). `by` names who answered, for the audit ("uid 1000").
  std::string decision;
  std::string by;
  std::optional<agent::ModelSettings> model;  // the run's own when absent
  AgentLimits limits;
};

struct RunRequest {  // agent_show, agent_cancel, agent_transcript
  std::string run;
  bool follow = false;  // agent_show: stream the live call's events first
};

// `what`: a prefix for the fields' names in messages ("trybox." where the fields are nested).
Result<CreateRequest> ParseCreate(const Json& j, const std::string& what = "");
Result<VmRequest> ParseVmRequest(const Json& j);
Result<EgressRequest> ParseEgress(const Json& j);
Result<DoctorRequest> ParseDoctor(const Json& j);
Result<PruneRequest> ParsePrune(const Json& j);
Result<ServeRequest> ParseServe(const Json& j);
Result<ApiKeyRequest> ParseApiKey(const Json& j);
Result<ExecRequest> ParseExec(const Json& j);
Result<DaemonStatusRequest> ParseDaemonStatus(const Json& j);
Result<DaemonStopRequest> ParseDaemonStop(const Json& j);
Result<DaemonReloadRequest> ParseDaemonReload(const Json& j);
Result<PutRequest> ParsePut(const Json& j);
Result<GetRequest> ParseGet(const Json& j);
Result<AuditRequest> ParseAudit(const Json& j);
Result<WorkspaceInRequest> ParseWorkspaceIn(const Json& j);
Result<CollectRequest> ParseCollect(const Json& j);
Result<DiffRequest> ParseDiff(const Json& j);
Result<AgentRequest> ParseAgent(const Json& j);
Result<CommitRequest> ParseCommit(const Json& j);
// image_rm: {"name": NAME}.
Result<ImageNameRequest> ParseImageName(const Json& j);
// `answer`: agent_answer (needs "answer"), else agent_resume.
Result<AgentContinueRequest> ParseAgentContinue(const Json& j, bool answer);
// Wipes the model key in an agent, agent_answer or agent_resume request once it is parsed
// (the parsed request holds it in its own pages).
void WipeModelKey(Json* request);
// Wipes the values of `secrets` in a create or agent request once it is parsed (the parsed
// request holds them in pages of their own).
void WipeSecretValues(Json* request);
Result<RunRequest> ParseRunRequest(const Json& j);
// agent_ls: {"limit": N} (default 50).
Result<int64_t> ParseListLimit(const Json& j);
Result<AgentLimits> ParseLimits(const Json& j);
Result<LogsRequest> ParseLogs(const Json& j);
Result<KillRequest> ParseKill(const Json& j);
Result<PortRequest> ParsePort(const Json& j);
// {"rows": R, "cols": C}, each from 1 to 65535; `what` prefixes field names in errors.
Result<TermSize> ParseTermSize(const Json& j, const std::string& what);
// A client's EVENT on an exec stream: {"type": "resize", "rows": R, "cols": C} is the only
// one; anything else is an error naming what is wrong.
Result<TermSize> ParseResizeEvent(const Json& j);

}  // namespace trybox::daemon
