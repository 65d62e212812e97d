// envd's `filesystem.Filesystem` (Stat, ListDir, MakeDir, Move, Remove) and `GET /files`,
// over the Connect protocol's JSON codec (api/connect.h). Each request is one exec of the
// guest's own tools (find, mkdir, mv, rm, cat) as the request's account, with no shell
// between the request's paths and the tools: paths are arguments, never code.
#include <nlohmann/json.hpp>

#include "api/connect.h"
#include "channel/frame.h"
#include "daemon/envd.h"
#include "daemon/guest_ops.h"
#include "daemon/http_api.h"
#include "util/names.h"
#include "util/utf8.h"

namespace trybox::daemon {
namespace {

using api::HttpRequest;
using api::HttpResponse;
using api::PathParams;
namespace connect = api::connect;
using nlohmann::json;

constexpr size_t kMaxListingBytes = size_t{16} << 20;
constexpr int64_t kFsTimeoutMs = 60000;
constexpr int64_t kMaxDepth = 64;

// One exec's stdout and stderr, each kept up to a cap.
struct Captured : OutputSink {
  explicit Captured(size_t cap) : cap(cap) {}
  void Append(uint8_t channel, std::string_view data) override {
    std::string& s = channel == channel::kChanOut ? out : err;
    const size_t room = cap - std::min(cap, s.size());
    if (data.size() > room) over = true;
    s.append(data.substr(0, room));
  }
  size_t cap;
  std::string out, err;
  bool over = false;
};

struct GuestRun {
  int exit_code = -1;
  std::string out, err;
  bool over = false;
};

// Runs `argv` in the sandbox's VM as `user` ("" or "root": root) in the account's home.
Result<GuestRun> RunAs(VmService& vms, const std::string& vm_id, const std::string& user,
                       std::vector<std::string> argv, size_t cap) {
  ASSIGN_OR_RETURN(auto vm, vms.Get(vm_id));
  ExecRequest er;
  er.vm = vm_id;
  er.argv = std::move(argv);
  er.cwd = "";
  er.user = user == "root" ? "" : user;
  er.timeout_ms = kFsTimeoutMs;
  ExecSpec spec = vms.SpecFor(*vm, er);
  Captured cap_sink(cap);
  ExecIo io;
  io.sink = &cap_sink;
  ASSIGN_OR_RETURN(ExecResult r, vms.Exec(*vm, spec, io));
  if (r.outcome != ExecOutcome::kExited || !r.exit_code) {
    return Unavailable(
        "the guest could not carry out the request: " + std::string(ExecOutcomeName(r.outcome)) +
        (r.message.empty() ? "" : ": " + r.message));
  }
  return GuestRun{*r.exit_code, std::move(cap_sink.out), std::move(cap_sink.err), cap_sink.over};
}

// A failed tool's stderr as the status envd would give: not_found, permission_denied, ...
Status ToolError(const GuestRun& r, const std::string& path) {
  std::string why = r.err;
  while (!why.empty() && (why.back() == '\n' || why.back() == '\r')) why.pop_back();
  if (why.empty()) why = "exit status " + std::to_string(r.exit_code);
  if (why.find("No such file or directory") != std::string::npos) {
    return NotFound("path " + path + " not found");
  }
  if (why.find("Permission denied") != std::string::npos) {
    return Status(Code::kPermissionDenied, "permission denied: " + path);
  }
  if (why.find("Not a directory") != std::string::npos) {
    return InvalidArgument("a part of " + path + " is not a directory");
  }
  if (why.find("Is a directory") != std::string::npos) {
    return InvalidArgument(path + " is a directory");
  }
  if (why.find("File exists") != std::string::npos) {
    return Status(Code::kAlreadyExists, path + " exists");
  }
  return FailedPrecondition(why);
}

// find's record: type, size, mode, symbolic permissions, owner, group, mtime, path, name,
// link target, each NUL-terminated so that no file name can break a record.
constexpr const char* kEntryFormat = "%y\\0%s\\0%m\\0%M\\0%u\\0%g\\0%T@\\0%p\\0%f\\0%l\\0";
constexpr size_t kEntryFields = 10;

// `path` made absolute against the account's home ($PWD of the exec), by the guest.
// Arguments of a fixed script: no path is ever shell text.
std::vector<std::string> Script(const std::string& body, std::vector<std::string> args) {
  std::vector<std::string> argv = {"/bin/sh", "-c", body, "sh"};
  for (auto& a : args) argv.push_back(std::move(a));
  return argv;
}

Result<std::vector<json>> ParseEntries(const std::string& out) {
  std::vector<std::string> f;
  size_t pos = 0;
  while (pos < out.size()) {
    const size_t nul = out.find('\0', pos);
    if (nul == std::string::npos) return Internal("the guest's listing ends mid-record");
    f.push_back(out.substr(pos, nul - pos));
    pos = nul + 1;
  }
  if (f.size() % kEntryFields != 0) return Internal("the guest's listing has a partial record");
  std::vector<json> entries;
  for (size_t i = 0; i < f.size(); i += kEntryFields) {
    const std::string& t = f[i];
    const char* type = t == "f"   ? "FILE_TYPE_FILE"
                       : t == "d" ? "FILE_TYPE_DIRECTORY"
                       : t == "l" ? "FILE_TYPE_SYMLINK"
                                  : "FILE_TYPE_UNSPECIFIED";
    int64_t mode = 0;
    for (char c : f[i + 2]) mode = mode * 8 + (c >= '0' && c <= '7' ? c - '0' : 0);
    const double mtime = std::atof(f[i + 6].c_str());
    const auto tp = WallClock::time_point(
        std::chrono::duration_cast<WallClock::duration>(std::chrono::duration<double>(mtime)));
    json e = {{"name", f[i + 8]},
              {"type", type},
              {"path", f[i + 7]},
              {"size", std::atoll(f[i + 1].c_str())},
              {"mode", mode},
              {"permissions", f[i + 3]},
              {"owner", f[i + 4]},
              {"group", f[i + 5]},
              {"modifiedTime", Rfc3339(tp)}};
    if (t == "l") e["symlinkTarget"] = f[i + 9];
    entries.push_back(std::move(e));
  }
  return entries;
}

Result<std::string> StringField(const json& m, const char* name) {
  auto it = m.find(name);
  if (it == m.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
    return InvalidArgument(std::string(name) + " must be a non-empty string");
  }
  const std::string& s = it->get_ref<const std::string&>();
  if (s.find('\0') != std::string::npos) return InvalidArgument(std::string(name) + " has a NUL");
  return s;
}

// The shell prefix that makes $1 (and $2) absolute against the home.
constexpr const char* kAbs =
    "abs() { case $1 in /*) printf %s \"$1\" ;; *) printf %s/%s \"$PWD\" \"$1\" ;; esac; }; ";

// Runs a script whose stdout is exactly one entry record (the entry it made or found) and
// answers {"entry": ...}; a failure as the tool reported it about `path`.
Result<json> OneEntry(VmService& vms, const std::string& vm, const std::string& user,
                      const std::string& script, std::vector<std::string> args,
                      const std::string& path) {
  ASSIGN_OR_RETURN(
      GuestRun r,
      RunAs(vms, vm, user, Script(std::string(kAbs) + script, std::move(args)), kMaxListingBytes));
  if (r.exit_code != 0) return ToolError(r, path);
  ASSIGN_OR_RETURN(auto entries, ParseEntries(r.out));
  if (entries.size() != 1) {
    return Internal("the guest gave " + std::to_string(entries.size()) + " entries for " + path);
  }
  return json{{"entry", entries[0]}};
}

// Writes `data` to `path` as `user`: the bytes go to a root-only temporary file (the
// guest's put, which is root's), that file is given to the account, and the account copies
// it into place, so that the account's permissions decide where it may write and the file
// is its own. The entry written, as envd's /files answers it.
Result<json> WriteAs(VmService& vms, const std::string& vm_id, const std::string& user,
                     const std::string& path, std::string_view data) {
  ASSIGN_OR_RETURN(auto vm, vms.Get(vm_id));
  const std::string tmp = "/tmp/.trybox-upload-" + RandomHex(8);
  RETURN_IF_ERROR(WriteFile(*vm, tmp, data, 0600, /*mkdirs=*/false));
  auto drop_tmp = [&] { (void)RunAs(vms, vm_id, "root", {"rm", "-f", "--", tmp}, 4096); };
  if (user != "root") {
    auto given = RunAs(vms, vm_id, "root", {"chown", "--", user + ":", tmp}, 4096);
    if (!given.ok() || given->exit_code != 0) {
      drop_tmp();
      if (!given.ok()) return given.status();
      return InvalidArgument("no account " + user + " in the sandbox");
    }
  }
  auto r =
      RunAs(vms, vm_id, user,
            Script(std::string(kAbs) +
                       "p=$(abs \"$2\"); mkdir -p -- \"$(dirname -- \"$p\")\" && cat -- \"$1\" > "
                       "\"$p\"; s=$?; rm -f -- \"$1\"; [ $s -eq 0 ] && find \"$p\" -maxdepth 0 "
                       "-printf '" +
                       kEntryFormat + "'",
                   {tmp, path}),
            kMaxListingBytes);
  if (!r.ok() || r->exit_code != 0) {
    drop_tmp();  // the account may have failed before removing it
    if (!r.ok()) return r.status();
    return ToolError(*r, path);
  }
  ASSIGN_OR_RETURN(auto entries, ParseEntries(r->out));
  if (entries.size() != 1) return Internal("the guest gave no entry for " + path);
  return json{{"name", entries[0]["name"]}, {"type", "file"}, {"path", entries[0]["path"]}};
}

using UnaryBody =
    std::function<Result<json>(const json& msg, const std::string& user, const std::string& vm)>;

HttpResponse WatchError(const Status& st) { return EnvdStreamError(st); }

// How long the guest may take to put a watch in place.
constexpr auto kWatchStartTimeout = std::chrono::seconds(30);
// How long a quiet watch waits before it looks at whether the server is stopping.
constexpr auto kWatchStopCheck = std::chrono::seconds(1);

// The guest's refusal of a watch ({"ok":false,"error":KIND,"message":...}) as envd's.
Status GuestWatchError(const json& end, const std::string& path) {
  const std::string kind = end.value("error", "");
  const std::string message = end.value("message", "the guest ended the watch");
  if (kind == "not_found") return NotFound("path " + path + " not found");
  if (kind == "not_a_directory") return InvalidArgument(path + " is not a directory");
  if (kind == "permission_denied") return Status(Code::kPermissionDenied, message);
  if (kind == "too_many_directories") return Status(Code::kResourceExhausted, message);
  if (kind == "gone") return NotFound(message);
  return Unavailable("the watch of " + path + " failed: " + message);
}

const char* EventTypeOf(const std::string& op) {
  if (op == "create") return "EVENT_TYPE_CREATE";
  if (op == "write") return "EVENT_TYPE_WRITE";
  if (op == "remove") return "EVENT_TYPE_REMOVE";
  if (op == "rename") return "EVENT_TYPE_RENAME";
  if (op == "chmod") return "EVENT_TYPE_CHMOD";
  return nullptr;
}

// Streams a guest watch as envd's WatchDirResponse: `start`, a `filesystem` event per
// change ({name, type}, the name relative to the watched directory), `keepalive` after
// each quiet interval, then the end of the stream when the guest ends the watch (the
// directory went) or the server stops. The guest's watch is reset when the reader goes.
class WatchStream {
 public:
  WatchStream(std::shared_ptr<channel::Stream> guest, std::string path,
              std::chrono::seconds keepalive, const std::atomic<bool>& stop)
      : guest_(std::move(guest)), path_(std::move(path)), keepalive_(keepalive), stop_(stop) {}
  ~WatchStream() {
    if (!guest_->finished()) (void)guest_->Reset("the watch's reader went away");
  }

  bool Next(std::string* out) {
    if (!started_) {
      started_ = true;
      *out = connect::Envelope({{"start", json::object()}});
      return true;
    }
    if (done_) return false;
    for (;;) {
      if (stop_) {
        done_ = true;
        *out = connect::EndStream(Unavailable("the HTTP API is stopping; the watch ends"));
        return true;
      }
      const auto now = std::chrono::steady_clock::now();
      auto m = guest_->Next(std::min(now + kWatchStopCheck, keepalive_due_));
      if (!m.ok()) {
        if (m.status().code() == Code::kDeadlineExceeded) {
          if (std::chrono::steady_clock::now() >= keepalive_due_) {
            keepalive_due_ = std::chrono::steady_clock::now() + keepalive_;
            *out = connect::Envelope({{"keepalive", json::object()}});
            return true;
          }
          continue;
        }
        done_ = true;
        *out = connect::EndStream(
            Unavailable("the sandbox's watch was lost: " + m.status().message()));
        return true;
      }
      switch (m->kind) {
        case channel::Stream::Message::Kind::kEvent: {
          const json& ev = m->body;
          const char* type = EventTypeOf(ev.value("op", ""));
          if (ev.value("type", "") != "fs" || type == nullptr) continue;  // overflow, newer
          std::string name;
          if (auto n = ev.find("name"); n != ev.end() && n->is_string()) {
            name = n->get<std::string>();
          } else if (auto b = ev.find("name_b64"); b != ev.end() && b->is_string()) {
            auto raw = Base64Decode(b->get<std::string>());
            if (!raw.ok()) continue;
            name = *raw;  // not UTF-8: the envelope's JSON replaces what is not
          } else {
            continue;
          }
          *out = connect::Envelope({{"filesystem", {{"name", name}, {"type", type}}}});
          return true;
        }
        case channel::Stream::Message::Kind::kEnd:
          done_ = true;
          *out = connect::EndStream(m->body.value("ok", false) ? Status::Ok()
                                                               : GuestWatchError(m->body, path_));
          return true;
        case channel::Stream::Message::Kind::kReset:
          done_ = true;
          *out = connect::EndStream(Unavailable("the sandbox's watch was lost: " +
                                                m->body.value("reason", std::string())));
          return true;
        default:
          continue;
      }
    }
  }

 private:
  std::shared_ptr<channel::Stream> guest_;
  const std::string path_;
  const std::chrono::seconds keepalive_;
  const std::atomic<bool>& stop_;
  std::chrono::steady_clock::time_point keepalive_due_ =
      std::chrono::steady_clock::now() + keepalive_;
  bool started_ = false;
  bool done_ = false;
};

}  // namespace

Result<std::string> EnvdUser(const HttpRequest& req, const std::string& fallback) {
  const std::string auth = req.Header("authorization");
  std::string user = fallback;
  if (!auth.empty()) {
    if (auth.rfind("Basic ", 0) != 0) return InvalidArgument("Authorization must be Basic USER:");
    ASSIGN_OR_RETURN(std::string decoded, connect::FromBase64(auth.substr(6)));
    user = decoded.substr(0, decoded.find(':'));
    if (user.empty()) return InvalidArgument("no user in Authorization");
  }
  if (user.empty()) return std::string("user");
  if (user.size() > 32) return InvalidArgument("the user name is over 32 characters");
  for (char c : user) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) {
      return InvalidArgument("the user is not an account name");
    }
  }
  return user;
}

Result<json> ListDirAs(VmService& vms, const std::string& vm, const std::string& user,
                       const std::string& path, int64_t depth) {
  // The directory itself first (depth 0), so that a file or a missing path is told apart.
  ASSIGN_OR_RETURN(
      GuestRun r,
      RunAs(vms, vm, user,
            Script(std::string(kAbs) + "find -H \"$(abs \"$1\")\" -maxdepth \"$2\" -printf '" +
                       kEntryFormat + "'",
                   {path, std::to_string(depth)}),
            kMaxListingBytes));
  if (r.over) return Status(Code::kResourceExhausted, "the listing of " + path + " is over 16 MiB");
  if (r.exit_code != 0 && r.out.empty()) return ToolError(r, path);
  ASSIGN_OR_RETURN(auto entries, ParseEntries(r.out));
  if (entries.empty()) return NotFound("path " + path + " not found");
  if (entries[0]["type"] != "FILE_TYPE_DIRECTORY")
    return InvalidArgument("path " + path + " is not a directory");
  json list = json::array();
  for (size_t i = 1; i < entries.size(); ++i) list.push_back(std::move(entries[i]));
  return list;
}

Result<std::string> ReadFileAs(VmService& vms, const std::string& vm, const std::string& user,
                               const std::string& path) {
  ASSIGN_OR_RETURN(
      GuestRun r,
      RunAs(vms, vm, user,
            Script(std::string(kAbs) + "p=$(abs \"$1\"); if [ -d \"$p\" ]; then echo \"$p: "
                                       "Is a directory\" >&2; exit 21; fi; "
                                       "exec cat -- \"$p\"",
                   {path}),
            kMaxFileReadBytes));
  if (r.exit_code != 0) return ToolError(r, path);
  if (r.over) {
    return Status(Code::kResourceExhausted, path + " is over " +
                                                std::to_string(kMaxFileReadBytes >> 20) +
                                                " MiB: copy it with `trybox cp`");
  }
  return std::move(r.out);
}

void AddFilesystemRoutes(api::Router& router, VmService& vms, const std::atomic<bool>& stop) {
  auto unary = [&router](const char* rpc, UnaryBody body) {
    router.Add("POST", std::string("/filesystem.Filesystem/") + rpc,
               [body](const HttpRequest& req, const PathParams&) {
                 auto msg = connect::ParseUnaryRequest(req.body);
                 if (!msg.ok()) return connect::UnaryError(msg.status());
                 auto user = EnvdUser(req);
                 if (!user.ok()) return connect::UnaryError(user.status());
                 auto reply = body(*msg, *user, req.sandbox);
                 if (!reply.ok()) return connect::UnaryError(reply.status());
                 return connect::UnaryReply(*reply);
               });
  };

  unary("Stat",
        [&vms](const json& m, const std::string& user, const std::string& vm) -> Result<json> {
          ASSIGN_OR_RETURN(std::string path, StringField(m, "path"));
          return OneEntry(
              vms, vm, user,
              std::string("find -H \"$(abs \"$1\")\" -maxdepth 0 -printf '") + kEntryFormat + "'",
              {path}, path);
        });

  unary("ListDir",
        [&vms](const json& m, const std::string& user, const std::string& vm) -> Result<json> {
          ASSIGN_OR_RETURN(std::string path, StringField(m, "path"));
          int64_t depth = 1;
          if (auto d = m.find("depth"); d != m.end() && !d->is_null()) {
            if (!d->is_number_unsigned() && !d->is_number_integer())
              return InvalidArgument("depth must be a number");
            depth = d->get<int64_t>();
            if (depth == 0) depth = 1;
            if (depth < 1 || depth > kMaxDepth)
              return InvalidArgument("depth must be 1 to " + std::to_string(kMaxDepth));
          }
          ASSIGN_OR_RETURN(json list, ListDirAs(vms, vm, user, path, depth));
          return json{{"entries", std::move(list)}};
        });

  unary("MakeDir",
        [&vms](const json& m, const std::string& user, const std::string& vm) -> Result<json> {
          ASSIGN_OR_RETURN(std::string path, StringField(m, "path"));
          return OneEntry(
              vms, vm, user,
              std::string("p=$(abs \"$1\"); if [ -e \"$p\" ]; then echo \"$p: File "
                          "exists\" >&2; exit 17; fi; mkdir -p -- \"$p\" && find \"$p\" "
                          "-maxdepth 0 -printf '") +
                  kEntryFormat + "'",
              {path}, path);
        });

  unary("Move",
        [&vms](const json& m, const std::string& user, const std::string& vm) -> Result<json> {
          ASSIGN_OR_RETURN(std::string from, StringField(m, "source"));
          ASSIGN_OR_RETURN(std::string to, StringField(m, "destination"));
          return OneEntry(vms, vm, user,
                          std::string("s=$(abs \"$1\"); d=$(abs \"$2\"); mv -T -- \"$s\" \"$d\" && "
                                      "find \"$d\" -maxdepth 0 -printf '") +
                              kEntryFormat + "'",
                          {from, to}, from);
        });

  unary(
      "Remove",
      [&vms](const json& m, const std::string& user, const std::string& vm) -> Result<json> {
        ASSIGN_OR_RETURN(std::string path, StringField(m, "path"));
        ASSIGN_OR_RETURN(
            GuestRun r,
            RunAs(
                vms, vm, user,
                Script(
                    std::string(kAbs) +
                        "p=$(abs \"$1\"); [ -e \"$p\" ] || [ -L \"$p\" ] || "
                        "{ echo \"$p: No such file or directory\" >&2; exit 2; }; rm -rf -- \"$p\"",
                    {path}),
                64 * 1024));
        if (r.exit_code != 0) return ToolError(r, path);
        return json::object();
      });

  // WatchDir: the guest's inotify (its "watch" request, docs/protocol/guest.md) on a
  // directory the account can list, streamed as envd's WatchDirResponse events.
  router.Add(
      "POST", "/filesystem.Filesystem/WatchDir",
      [&vms, &stop](const HttpRequest& req, const PathParams&) {
        auto msg = connect::ParseStreamingRequest(req.body);
        if (!msg.ok()) return WatchError(msg.status());
        auto path = StringField(*msg, "path");
        if (!path.ok()) return WatchError(path.status());
        bool recursive = false;
        if (auto r = msg->find("recursive"); r != msg->end() && !r->is_null()) {
          if (!r->is_boolean()) return WatchError(InvalidArgument("recursive must be a boolean"));
          recursive = r->get<bool>();
        }
        if (msg->value("includeEntry", false)) {
          return WatchError(FailedPrecondition("includeEntry is not served by trybox"));
        }
        auto user = EnvdUser(req);
        if (!user.ok()) return WatchError(user.status());
        // Where it is, as the account resolves it, and that the account may list it.
        auto where = RunAs(
            vms, req.sandbox, *user,
            Script(
                std::string(kAbs) +
                    "p=$(abs \"$1\"); if [ ! -d \"$p\" ]; then if [ -e \"$p\" ]; then "
                    "echo \"$p: Not a directory\" >&2; else echo \"$p: No such file or "
                    "directory\" >&2; fi; exit 2; fi; if [ ! -r \"$p\" ] || [ ! -x \"$p\" ]; then "
                    "echo \"$p: Permission denied\" >&2; exit 13; fi; cd -- \"$p\" && "
                    "pwd -P",
                {*path}),
            64 * 1024);
        if (!where.ok()) return WatchError(where.status());
        if (where->exit_code != 0) return WatchError(ToolError(*where, *path));
        std::string abs = where->out;
        while (!abs.empty() && abs.back() == '\n') abs.pop_back();
        auto vm = vms.Get(req.sandbox);
        if (!vm.ok()) return WatchError(vm.status());
        auto guest = (*vm)->Open({{"op", "watch"}, {"path", abs}, {"recursive", recursive}});
        if (!guest.ok()) return WatchError(Unavailable(guest.status().message()));
        auto first = (*guest)->Next(std::chrono::steady_clock::now() + kWatchStartTimeout);
        if (!first.ok()) {
          (void)(*guest)->Reset("no start");
          return WatchError(
              Unavailable("the guest did not start the watch: " + first.status().message()));
        }
        if (first->kind != channel::Stream::Message::Kind::kEvent) {
          return WatchError(GuestWatchError(first->body, *path));
        }
        auto s = std::make_shared<WatchStream>(*guest, *path, EnvdKeepalive(req), stop);
        HttpResponse r;
        r.content_type = "application/connect+json";
        r.stream = [s](std::string* out) { return s->Next(out); };
        return r;
      });
  // envd's polling watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher), which the
  // SDKs do not call: a clear refusal rather than a silent nothing.
  for (const char* rpc : {"CreateWatcher", "GetWatcherEvents", "RemoveWatcher"}) {
    router.Add("POST", std::string("/filesystem.Filesystem/") + rpc,
               [](const HttpRequest&, const PathParams&) {
                 return connect::UnaryError(
                     FailedPrecondition("polling watchers are not served by trybox: use WatchDir"));
               });
  }

  router.Add("POST", "/files", [&vms](const HttpRequest& req, const PathParams&) {
    auto name = req.query.find("username");
    auto user = EnvdUser(req, name == req.query.end() ? "" : name->second);
    if (!user.ok()) return api::JsonError(400, user.status().message());
    if (!req.Header("content-encoding").empty()) {
      return api::JsonError(400, "Content-Encoding " + req.Header("content-encoding") +
                                     " is not accepted: send the bytes as they are");
    }
    const auto path = req.query.find("path");
    const std::string given = path == req.query.end() ? "" : path->second;
    std::vector<std::pair<std::string, std::string_view>> uploads;
    const std::string type = req.Header("content-type");
    if (type.rfind("multipart/form-data", 0) == 0) {
      for (const api::FormFile& f : req.files) {
        const std::string target = given.empty() ? f.filename : given;
        if (target.empty()) return api::JsonError(400, "a file part has no path");
        uploads.emplace_back(target, f.data);
      }
      if (uploads.empty()) return api::JsonError(400, "the form holds no file");
    } else if (type.rfind("application/octet-stream", 0) == 0) {
      if (given.empty()) return api::JsonError(400, "path is required");
      uploads.emplace_back(given, req.body);
    } else {
      return api::JsonError(400,
                            "Content-Type must be multipart/form-data or application/octet-stream");
    }
    json written = json::array();
    for (const auto& [target, data] : uploads) {
      auto e = WriteAs(vms, req.sandbox, *user, target, data);
      if (!e.ok()) {
        const Status& st = e.status();
        const int code = st.code() == Code::kResourceExhausted ? 507 : HttpStatusFor(st);
        return api::JsonError(code, st.message());
      }
      written.push_back(*e);
    }
    return api::JsonReply(200, written.dump(-1, ' ', false, json::error_handler_t::replace));
  });

  router.Add("GET", "/files", [&vms](const HttpRequest& req, const PathParams&) {
    auto path = req.query.find("path");
    if (path == req.query.end() || path->second.empty()) {
      return api::JsonError(400, "path is required");
    }
    auto name = req.query.find("username");
    auto user = EnvdUser(req, name == req.query.end() ? "" : name->second);
    if (!user.ok()) return api::JsonError(400, user.status().message());
    auto content = ReadFileAs(vms, req.sandbox, *user, path->second);
    if (!content.ok()) {
      return api::JsonError(content.status().code() == Code::kResourceExhausted
                                ? 413
                                : HttpStatusFor(content.status()),
                            content.status().message());
    }
    return HttpResponse{200, "application/octet-stream", {}, std::move(*content)};
  });
}

}  // namespace trybox::daemon
