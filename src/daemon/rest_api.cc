// trybox's own REST routes (docs/protocol/rest.md): what E2B's API has no words for (the
// egress audit, workspaces, agent runs, the runs waiting for a person), under /trybox/v1,
// for keys of scope `operator`. Each route is one of the socket's verbs, called over a
// connection from inside the daemon (ControlServer::Attach): the same parsers, the same
// services, the same errors as `trybox` on the socket. A verb's END is the reply; a
// streaming verb's EVENTs are server-sent events.
#include <unistd.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "channel/frame.h"
#include "daemon/admission.h"
#include "daemon/envd.h"
#include "daemon/http_api.h"
#include "daemon/requests.h"
#include "daemon/verbs.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/numbers.h"
#include "util/utf8.h"

namespace trybox::daemon {
namespace {

using api::HttpRequest;
using api::HttpResponse;
using api::PathParams;

// How long a quiet event stream waits before it looks at whether the server is stopping,
// and how often it sends a comment line so that a proxy or a client's idle timer does not
// take it for dead.
constexpr auto kStopCheck = std::chrono::seconds(1);
constexpr auto kKeepalive = std::chrono::seconds(15);
// The most a route keeps of a verb's channel 1 (a transcript) before it answers.
constexpr size_t kMaxVerbData = size_t{64} << 20;
// How long an exec's output stream waits for the `logs` verb's first message before it
// answers 200 anyway (a running command may print nothing for a long time).
constexpr auto kFirstLogMessageWait = std::chrono::milliseconds(500);

// A verb's error reply ({"ok":false,"error":{code,message,kind?}}) as an HTTP error in the
// shape of the rest of the server ({"code": HTTP status, "message"}), with the verb's own
// code name and kind beside it.
HttpResponse VerbError(const Json& reply) {
  const Json error = reply.value("error", Json::object());
  const std::string name = error.is_object() ? error.value("code", "INTERNAL") : "INTERNAL";
  const std::string message =
      error.is_object() ? error.value("message", "unknown error") : "unknown error";
  Code code = CodeFromName(name);
  if (code == Code::kOk) code = Code::kInternal;  // an error that names no error is one still
  const int status = HttpStatusFor(Status(code, message));
  Json body = {{"code", status}, {"message", message}, {"status", CodeName(code)}};
  if (error.is_object() && error.contains("kind")) body["kind"] = error["kind"];
  return api::JsonReply(status, body.dump());
}

HttpResponse ErrorOf(const Status& st) {
  return VerbError(
      {{"ok", false}, {"error", {{"code", CodeName(st.code())}, {"message", st.message()}}}});
}

// A JSON request body: an object, or {} for an empty body.
Result<Json> BodyObject(const HttpRequest& req) {
  if (req.body.empty()) return Json::object();
  Json j = Json::parse(req.body, nullptr, false);
  if (j.is_discarded()) return InvalidArgument("the body is not valid JSON");
  if (!j.is_object()) return InvalidArgument("the body must be a JSON object");
  return j;
}

// The request of `verb` on VM `vm` from a POST body that may hold only `fields`; any other
// key is refused, in the words `refusal` gives it.
Result<Json> VmVerbFromBody(const HttpRequest& req, const std::string& vm, const char* verb,
                            const std::set<std::string>& fields,
                            const std::function<std::string(const std::string&)>& refusal) {
  ASSIGN_OR_RETURN(Json body, BodyObject(req));
  for (const auto& [key, value] : body.items()) {
    if (!fields.count(key)) return InvalidArgument(refusal(key));
  }
  body["verb"] = verb;
  body["vm"] = vm;
  return body;
}

// A query parameter as a whole number in [lo, hi] into `request[field]`, when given.
Status QueryInt(const HttpRequest& req, const char* name, int64_t lo, int64_t hi, Json* request,
                const char* field) {
  auto it = req.query.find(name);
  if (it == req.query.end()) return Status::Ok();
  ASSIGN_OR_RETURN(int64_t n, ParseBoundedInt(it->second, lo, hi, name));
  (*request)[field] = n;
  return Status::Ok();
}

// One server-sent event: `event: NAME` and the JSON on one `data:` line (JSON text holds no
// raw newline).
std::string SseEvent(const std::string& name, const Json& data) {
  return "event: " + name + "\ndata: " + data.dump() + "\n\n";
}

// The event name of a verb's EVENT: its one key ({"progress": {...}} is `progress`), or
// `message` for an object of several.
std::string EventName(const Json& body) {
  if (body.is_object() && body.size() == 1) return body.begin().key();
  return "message";
}

// An exec's kept output (the `logs` verb) as server-sent events (docs/dashboard.md): each
// piece an `output` event whose `id` is the position after it, a gap an event of its own,
// and the END an `end` naming where the output stopped. With `both`, stdout (channel 1) and
// stderr (channel 2) come in one stream, each event naming its `stream`, and the `id` is
// both positions, "STDOUT,STDERR". A UTF-8 character split between two pieces waits for
// its rest.
class LogEvents {
 public:
  LogEvents(int64_t out_offset, int64_t err_offset, bool both)
      : offset_{out_offset, err_offset}, both_(both) {}

  std::string Data(uint8_t channel, const std::string& bytes) {
    const int i = channel == channel::kChanErr ? 1 : 0;
    if (i == 1 && !both_) return "";
    pending_[i] += bytes;
    return Output(i, WholeUtf8Prefix(pending_[i]));
  }
  std::string Gap(const Json& body) {
    const int i = both_ && body.value("stream", "") == "stderr" ? 1 : 0;
    const int64_t to = body.value("to", offset_[i]);
    std::string out = Output(i, pending_[i].size());  // bytes before a gap are whole as they are
    Json gap = {{"from", body.value("from", offset_[i])}, {"to", to}};
    if (both_) gap["stream"] = StreamName(i);
    offset_[i] = to;
    return out + "id: " + Id() + "\n" + SseEvent("gap", gap);
  }
  std::string End(const Json& body) {
    std::string out = Output(0, pending_[0].size()) + Output(1, pending_[1].size());
    Json end = body;
    end.erase("ok");
    return out + "id: " + Id() + "\n" + SseEvent("end", end);
  }

 private:
  static const char* StreamName(int i) { return i == 0 ? "stdout" : "stderr"; }
  std::string Id() const {
    return both_ ? std::to_string(offset_[0]) + "," + std::to_string(offset_[1])
                 : std::to_string(offset_[0]);
  }
  // The first `n` pending bytes of stream `i` as one `output` event ("" for none).
  std::string Output(int i, size_t n) {
    if (n == 0) return "";
    Json data = {{"offset", offset_[i]}};
    if (both_) data["stream"] = StreamName(i);
    SetBytesField(data, "text", std::string_view(pending_[i]).substr(0, n));
    offset_[i] += static_cast<int64_t>(n);
    pending_[i].erase(0, n);
    return "id: " + Id() + "\n" + SseEvent("output", data);
  }

  int64_t offset_[2];  // the positions after the bytes sent
  std::string pending_[2];
  const bool both_;
};

// Relays one verb stream as server-sent events: each EVENT as it comes, then `end` with the
// END body, or `error` with the error. The verb's stream is reset when the HTTP client goes
// (the object is destroyed before the verb ended): for `agent`, `answer` and `resume` that
// cancels the call, as a client's reset on the socket does.
class EventRelay {
 public:
  // `first`: the verb's first message, if already read. `log`: the verb is `logs`, relayed
  // as LogEvents.
  EventRelay(std::shared_ptr<channel::Stream> stream, std::optional<channel::Stream::Message> first,
             const std::atomic<bool>& stop, std::optional<LogEvents> log = std::nullopt)
      : stream_(std::move(stream)), first_(std::move(first)), stop_(stop), log_(std::move(log)) {}
  ~EventRelay() {
    if (!stream_->finished()) (void)stream_->Reset("the HTTP client went away");
  }

  bool Next(std::string* out) {
    if (done_) return false;
    for (;;) {
      if (first_) {
        const channel::Stream::Message m = std::move(*first_);
        first_.reset();
        if (Relay(m, out)) return true;
        continue;
      }
      if (stop_) {
        done_ = true;
        *out = SseEvent("error", {{"status", "UNAVAILABLE"},
                                  {"message", "the HTTP API is stopping; the stream ends here"}});
        return true;
      }
      const auto now = std::chrono::steady_clock::now();
      auto m = stream_->Next(std::min(now + kStopCheck, keepalive_due_));
      if (!m.ok()) {
        if (m.status().code() == Code::kDeadlineExceeded) {
          if (std::chrono::steady_clock::now() >= keepalive_due_) {
            keepalive_due_ = std::chrono::steady_clock::now() + kKeepalive;
            *out = ": keepalive\n\n";
            return true;
          }
          continue;
        }
        done_ = true;
        *out = SseEvent("error",
                        {{"status", "UNAVAILABLE"},
                         {"message", "the daemon's stream was lost: " + m.status().message()}});
        return true;
      }
      if (Relay(*m, out)) return true;
    }
  }

 private:
  // One message of the verb as the event it makes; false for one that makes none.
  bool Relay(const channel::Stream::Message& m, std::string* out) {
    switch (m.kind) {
      case channel::Stream::Message::Kind::kEvent:
        keepalive_due_ = std::chrono::steady_clock::now() + kKeepalive;
        *out = log_ && m.body.value("type", "") == "gap" ? log_->Gap(m.body)
                                                         : SseEvent(EventName(m.body), m.body);
        return true;
      case channel::Stream::Message::Kind::kEnd: {
        done_ = true;
        if (m.body.value("ok", false)) {
          *out = log_ ? log_->End(m.body) : SseEvent("end", m.body);
        } else {
          const Json error = m.body.value("error", Json::object());
          *out = SseEvent("error", error.is_object() ? error : Json::object());
        }
        return true;
      }
      case channel::Stream::Message::Kind::kReset:
        done_ = true;
        *out = SseEvent("error", {{"status", "UNAVAILABLE"},
                                  {"message", "the daemon reset the stream: " +
                                                  m.body.value("reason", std::string())}});
        return true;
      case channel::Stream::Message::Kind::kData:
        if (!log_) break;
        keepalive_due_ = std::chrono::steady_clock::now() + kKeepalive;
        *out = log_->Data(m.channel, m.data);
        return !out->empty();
      case channel::Stream::Message::Kind::kEof:
        break;  // the END follows
    }
    return false;
  }

  std::shared_ptr<channel::Stream> stream_;
  std::optional<channel::Stream::Message> first_;
  const std::atomic<bool>& stop_;
  std::optional<LogEvents> log_;
  std::chrono::steady_clock::time_point keepalive_due_ =
      std::chrono::steady_clock::now() + kKeepalive;
  bool done_ = false;
};

// The host's load and memory for the dashboard's overview: /proc/loadavg and /proc/meminfo.
Json HostLoad() {
  Json host = {{"cpus", sysconf(_SC_NPROCESSORS_ONLN)}};
  if (auto loadavg = ReadFileToString("/proc/loadavg"); loadavg.ok()) {
    double l1 = 0, l5 = 0, l15 = 0;
    if (std::sscanf(loadavg->c_str(), "%lf %lf %lf", &l1, &l5, &l15) == 3) {
      host["load1"] = l1;
      host["load5"] = l5;
      host["load15"] = l15;
    }
  }
  if (auto meminfo = ReadFileToString("/proc/meminfo"); meminfo.ok()) {
    if (auto total = ParseMeminfoMib(*meminfo, "MemTotal"); total.ok()) {
      host["mem_total_mib"] = *total;
    }
    if (auto available = ParseMemAvailableMib(*meminfo); available.ok()) {
      host["mem_available_mib"] = *available;
    }
  }
  return host;
}

// A file name for Content-Disposition: the path's last part, as RFC 6266's filename* (UTF-8,
// percent-encoded), so that no byte of a guest's file name is header syntax.
std::string AttachmentName(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string encoded;
  for (unsigned char ch : name.empty() ? std::string("file") : name) {
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
        ch == '.' || ch == '-' || ch == '_') {
      encoded += static_cast<char>(ch);
    } else {
      static const char kHex[] = "0123456789ABCDEF";
      encoded += '%';
      encoded += kHex[ch >> 4];
      encoded += kHex[ch & 15];
    }
  }
  return "attachment; filename*=UTF-8''" + encoded;
}

// A query parameter that must be present and non-empty.
Result<std::string> RequiredQuery(const HttpRequest& req, const char* name) {
  auto it = req.query.find(name);
  if (it == req.query.end() || it->second.empty()) {
    return InvalidArgument(std::string(name) + " is required");
  }
  return it->second;
}

}  // namespace

void HttpApi::SetVerbConnection(UniqueFd fd) {
  auto mux = std::make_shared<channel::Mux>(std::move(fd), channel::Role::kHost);
  mux->OnDeath([](const std::string& why) {
    if (why != "connection closed") LogWarn("http", "the REST routes' verb connection: " + why);
  });
  mux->Start();
  MutexLock lock(mu_);
  verbs_ = std::move(mux);
}

Result<std::shared_ptr<channel::Stream>> HttpApi::OpenVerb(const Json& request) {
  std::shared_ptr<channel::Mux> mux;
  {
    MutexLock lock(mu_);
    mux = verbs_;
  }
  if (!mux) return Unavailable("trybox's REST routes are not connected to the daemon's verbs");
  return mux->Open(request);
}

api::HttpResponse HttpApi::CallVerb(const Json& request, std::string* data) {
  auto s = OpenVerb(request);
  if (!s.ok()) return ErrorOf(s.status());
  for (;;) {
    auto m = (*s)->Next();
    if (m.ok() && data && m->kind == channel::Stream::Message::Kind::kData &&
        m->channel == channel::kChanOut) {
      if (data->size() + m->data.size() > kMaxVerbData) {
        (void)(*s)->Reset("the reply is larger than the HTTP route takes");
        return ErrorOf(Status(Code::kResourceExhausted,
                              "the reply is over " + std::to_string(kMaxVerbData >> 20) + " MiB"));
      }
      *data += m->data;
      continue;
    }
    if (!m.ok())
      return ErrorOf(Unavailable("the daemon's stream was lost: " + m.status().message()));
    if (m->kind == channel::Stream::Message::Kind::kReset) {
      return ErrorOf(
          Unavailable("the daemon reset the request: " + m->body.value("reason", std::string())));
    }
    if (m->kind != channel::Stream::Message::Kind::kEnd) continue;
    if (!m->body.value("ok", false)) return VerbError(m->body);
    Json reply = m->body;
    reply.erase("ok");
    return api::JsonReply(200, reply.dump());
  }
}

api::HttpResponse HttpApi::StreamVerb(const Json& request, bool log) {
  auto s = OpenVerb(request);
  if (!s.ok()) return ErrorOf(s.status());
  // The first message decides the status: a verb that refuses its request at once (a field
  // missing, a run unknown) is an HTTP error like a unary verb's, not a 200 and an event.
  // A log may stay quiet for as long as its command does: after a moment with no message,
  // the stream is answered as open, and a refusal would come as its `error` event.
  auto first = (*s)->Next(
      log ? channel::Stream::Deadline(std::chrono::steady_clock::now() + kFirstLogMessageWait)
          : std::nullopt);
  std::optional<channel::Stream::Message> opening;
  if (first.ok()) {
    if (first->kind == channel::Stream::Message::Kind::kEnd && !first->body.value("ok", false)) {
      return VerbError(first->body);
    }
    opening = std::move(*first);
  } else if (!log || first.status().code() != Code::kDeadlineExceeded) {
    return ErrorOf(Unavailable("the daemon's stream was lost: " + first.status().message()));
  }
  std::optional<LogEvents> events;
  if (log) {
    events.emplace(request.value("offset", int64_t{0}), request.value("stderr_offset", int64_t{0}),
                   request.value("stream", "") == "both");
  }
  auto relay =
      std::make_shared<EventRelay>(*s, std::move(opening), streams_stop_, std::move(events));
  HttpResponse r;
  r.content_type = "text/event-stream";
  r.headers.emplace_back("Cache-Control", "no-store");
  r.stream = [relay](std::string* out) { return relay->Next(out); };
  return r;
}

void HttpApi::AddRestRoutes() {
  router_.Add("GET", "/trybox/v1/vms", [this](const HttpRequest&, const PathParams&) {
    return CallVerb({{"verb", "list"}});
  });
  router_.Add("GET", "/trybox/v1/audit", [this](const HttpRequest& req, const PathParams&) {
    Json verb = {{"verb", "audit"}};
    if (auto vm = req.query.find("vm"); vm != req.query.end()) verb["vm"] = vm->second;
    Status st = QueryInt(req, "limit", 1, 1000, &verb, "limit");
    if (st.ok()) st = QueryInt(req, "before_id", 1, INT64_MAX, &verb, "before_id");
    if (!st.ok()) return ErrorOf(st);
    return CallVerb(verb);
  });
  router_.Add("GET", "/trybox/v1/vms/{id}/diff",
              [this](const HttpRequest& req, const PathParams& p) {
                Json verb = {{"verb", "diff"}, {"vm", p.at("id")}};
                Status st = QueryInt(req, "offset", 0, INT64_MAX, &verb, "offset");
                if (st.ok()) st = QueryInt(req, "limit", 1, kMaxReplyChanges, &verb, "limit");
                if (!st.ok()) return ErrorOf(st);
                if (auto patch = req.query.find("patch"); patch != req.query.end()) {
                  if (patch->second != "1" && patch->second != "0") {
                    return ErrorOf(InvalidArgument("patch must be 1 or 0"));
                  }
                  verb["patch"] = patch->second == "1";
                }
                return CallVerb(verb);
              });
  // A collect commits the VM's workspace into the repository it came from; where a copy
  // lands on the host (`into`) is not for an HTTP caller to choose.
  router_.Add(
      "POST", "/trybox/v1/vms/{id}/collect", [this](const HttpRequest& req, const PathParams& p) {
        auto verb = VmVerbFromBody(
            req, p.at("id"), "collect", {"commit", "command"}, [](const std::string& key) {
              return key == "into" ? "into is not taken over HTTP: a collect lands in the "
                                     "workspace's own repository (and a temporary directory)"
                                   : key + " is not a field of a collect (commit, command)";
            });
        return verb.ok() ? CallVerb(*verb) : ErrorOf(verb.status());
      });

  // A running VM's list grows or shrinks (trybox allow / deny); audited as the daemon's uid.
  router_.Add("POST", "/trybox/v1/vms/{id}/egress",
              [this](const HttpRequest& req, const PathParams& p) {
                auto verb = VmVerbFromBody(
                    req, p.at("id"), "egress", {"allow", "deny"}, [](const std::string& key) {
                      return key + " is not a field of an egress change (allow, deny)";
                    });
                return verb.ok() ? CallVerb(*verb) : ErrorOf(verb.status());
              });

  router_.Add("GET", "/trybox/v1/agent-runs", [this](const HttpRequest& req, const PathParams&) {
    Json verb = {{"verb", "agent_ls"}};
    Status st = QueryInt(req, "limit", 1, 1000, &verb, "limit");
    if (!st.ok()) return ErrorOf(st);
    return CallVerb(verb);
  });
  router_.Add("POST", "/trybox/v1/agent-runs", [this](const HttpRequest& req, const PathParams&) {
    auto body = BodyObject(req);
    if (!body.ok()) return ErrorOf(body.status());
    if (body->contains("verb")) return ErrorOf(InvalidArgument("verb is not a field of a run"));
    Json verb = std::move(*body);
    verb["verb"] = "agent";
    HttpResponse r = StreamVerb(verb);
    // Sent: the route's copies of the key and the secrets' values go now (docs/secrets.md).
    WipeModelKey(&verb);
    WipeSecretValues(&verb);
    return r;
  });
  router_.Add("GET", "/trybox/v1/agent-runs/{id}", [this](const HttpRequest&, const PathParams& p) {
    return CallVerb({{"verb", "agent_show"}, {"run", p.at("id")}});
  });
  router_.Add("GET", "/trybox/v1/agent-runs/{id}/events",
              [this](const HttpRequest&, const PathParams& p) {
                return StreamVerb({{"verb", "agent_show"}, {"run", p.at("id")}, {"follow", true}});
              });
  for (const char* act : {"answer", "resume"}) {
    const std::string verb_name = std::string("agent_") + act;
    router_.Add("POST", std::string("/trybox/v1/agent-runs/{id}/") + act,
                [this, verb_name](const HttpRequest& req, const PathParams& p) {
                  auto body = BodyObject(req);
                  if (!body.ok()) return ErrorOf(body.status());
                  if (body->contains("verb") || body->contains("run")) {
                    return ErrorOf(
                        InvalidArgument("the run is the path's; verb and run are not "
                                        "fields of the body"));
                  }
                  Json verb = std::move(*body);
                  verb["verb"] = verb_name;
                  verb["run"] = p.at("id");
                  HttpResponse r = StreamVerb(verb);
                  WipeModelKey(&verb);
                  return r;
                });
  }
  router_.Add("POST", "/trybox/v1/agent-runs/{id}/cancel",
              [this](const HttpRequest&, const PathParams& p) {
                return CallVerb({{"verb", "agent_cancel"}, {"run", p.at("id")}});
              });

  // The dashboard's reads (docs/dashboard.md), each a verb like the routes above.
  router_.Add("GET", "/trybox/v1/status", [this](const HttpRequest&, const PathParams&) {
    HttpResponse status = CallVerb({{"verb", "daemon_status"}});
    if (status.status != 200) return status;
    Json body = Json::parse(status.body, nullptr, false);
    if (!body.is_object()) return ErrorOf(Internal("daemon_status answered no object"));
    body["host"] = HostLoad();
    return api::JsonReply(200, body.dump());
  });
  router_.Add("GET", "/trybox/v1/images", [this](const HttpRequest&, const PathParams&) {
    return CallVerb({{"verb", "image_ls"}});
  });
  router_.Add("DELETE", "/trybox/v1/vms/{id}", [this](const HttpRequest&, const PathParams& p) {
    return CallVerb({{"verb", "destroy"}, {"vm", p.at("id")}});
  });
  router_.Add("GET", "/trybox/v1/vms/{id}/execs", [this](const HttpRequest&, const PathParams& p) {
    return CallVerb({{"verb", "ps"}, {"vm", p.at("id")}});
  });
  // An exec's kept output as server-sent events, resumed from Last-Event-ID (the position an
  // EventSource saw last: "N", or "STDOUT,STDERR" for both streams) or `offset`.
  router_.Add(
      "GET", "/trybox/v1/execs/{id}/output", [this](const HttpRequest& req, const PathParams& p) {
        auto exec = ParseBoundedInt(p.at("id"), 1, INT64_MAX, "the exec id");
        if (!exec.ok()) return ErrorOf(exec.status());
        Json verb = {{"verb", "logs"}, {"exec", *exec}, {"follow", true}};
        const std::string stream = req.query.count("stream") ? req.query.at("stream") : "stdout";
        if (stream != "stdout" && stream != "stderr" && stream != "both") {
          return ErrorOf(InvalidArgument("stream must be stdout, stderr or both"));
        }
        verb["stream"] = stream;
        Status st = QueryInt(req, "offset", 0, INT64_MAX, &verb, "offset");
        if (st.ok() && stream == "both") {
          st = QueryInt(req, "stderr_offset", 0, INT64_MAX, &verb, "stderr_offset");
        }
        if (!st.ok()) return ErrorOf(st);
        if (const std::string last = req.Header("last-event-id"); !last.empty()) {
          const size_t comma = last.find(',');
          if ((comma != std::string::npos) != (stream == "both")) {
            return ErrorOf(
                InvalidArgument("Last-Event-ID '" + last + "' is not a position of " + stream));
          }
          auto out = ParseBoundedInt(last.substr(0, comma), 0, INT64_MAX, "Last-Event-ID");
          if (!out.ok()) return ErrorOf(out.status());
          verb["offset"] = *out;
          if (comma != std::string::npos) {
            auto err = ParseBoundedInt(last.substr(comma + 1), 0, INT64_MAX, "Last-Event-ID");
            if (!err.ok()) return ErrorOf(err.status());
            verb["stderr_offset"] = *err;
          }
        }
        return StreamVerb(verb, /*log=*/true);
      });
  // A VM's files, read by the guest's own tools as root (envd's ListDir and GET /files).
  router_.Add("GET", "/trybox/v1/vms/{id}/files",
              [this](const HttpRequest& req, const PathParams& p) {
                auto path = RequiredQuery(req, "path");
                if (!path.ok()) return ErrorOf(path.status());
                auto entries = ListDirAs(vms_, p.at("id"), "root", *path);
                if (!entries.ok()) return ErrorOf(entries.status());
                return api::JsonReply(200, SafeDump(Json{{"path", *path}, {"entries", *entries}}));
              });
  router_.Add("GET", "/trybox/v1/vms/{id}/files/content",
              [this](const HttpRequest& req, const PathParams& p) {
                auto path = RequiredQuery(req, "path");
                if (!path.ok()) return ErrorOf(path.status());
                auto content = ReadFileAs(vms_, p.at("id"), "root", *path);
                if (!content.ok()) {
                  HttpResponse e = ErrorOf(content.status());
                  if (content.status().code() == Code::kResourceExhausted) e.status = 413;
                  return e;
                }
                HttpResponse r{200, "application/octet-stream", {}, std::move(*content)};
                r.headers.emplace_back("Content-Disposition", AttachmentName(*path));
                return r;
              });
  router_.Add(
      "GET", "/trybox/v1/agent-runs/{id}/transcript",
      [this](const HttpRequest&, const PathParams& p) {
        std::string data;
        HttpResponse end = CallVerb({{"verb", "agent_transcript"}, {"run", p.at("id")}}, &data);
        if (end.status != 200) return end;
        Json entries = Json::parse(data, nullptr, false);
        if (!entries.is_array()) {
          return ErrorOf(Internal("the run's transcript is not a JSON array"));
        }
        return api::JsonReply(200, SafeDump(Json{{"entries", entries}}));
      });

  // Recipe builds (image_builds.h): started here, each a `trybox image build` child, its
  // output kept for followers.
  router_.Add("GET", "/trybox/v1/image-builds", [this](const HttpRequest&, const PathParams&) {
    return api::JsonReply(200, builds_.List().dump());
  });
  router_.Add("POST", "/trybox/v1/image-builds", [this](const HttpRequest& req, const PathParams&) {
    auto body = BodyObject(req);
    if (!body.ok()) return ErrorOf(body.status());
    for (const auto& [key, value] : body->items()) {
      if (key != "name" && key != "recipe") {
        return ErrorOf(InvalidArgument(key + " is not a field of an image build (name, recipe)"));
      }
    }
    if (!body->contains("name") || !(*body)["name"].is_string()) {
      return ErrorOf(InvalidArgument("name (the image to build) is required"));
    }
    auto id = builds_.Start((*body)["name"], body->value("recipe", Json()));
    if (!id.ok()) return ErrorOf(id.status());
    auto shown = builds_.Show(*id);
    return shown.ok() ? api::JsonReply(202, shown->dump()) : ErrorOf(shown.status());
  });
  router_.Add("GET", "/trybox/v1/image-builds/{id}",
              [this](const HttpRequest&, const PathParams& p) {
                auto shown = builds_.Show(p.at("id"));
                return shown.ok() ? api::JsonReply(200, shown->dump()) : ErrorOf(shown.status());
              });
  router_.Add("POST", "/trybox/v1/image-builds/{id}/cancel",
              [this](const HttpRequest&, const PathParams& p) {
                Status st = builds_.Cancel(p.at("id"));
                if (!st.ok()) return ErrorOf(st);
                auto shown = builds_.Show(p.at("id"));
                return shown.ok() ? api::JsonReply(200, shown->dump()) : ErrorOf(shown.status());
              });
  // A build's output as server-sent events: `line` events whose `id` is the number of the
  // next line (resumed from Last-Event-ID), then `end` with the build.
  router_.Add("GET", "/trybox/v1/image-builds/{id}/events",
              [this](const HttpRequest& req, const PathParams& p) {
                const std::string id = p.at("id");
                int64_t from = 0;
                if (const std::string last = req.Header("last-event-id"); !last.empty()) {
                  auto n = ParseBoundedInt(last, 0, INT64_MAX, "Last-Event-ID");
                  if (!n.ok()) return ErrorOf(n.status());
                  from = *n;
                }
                if (auto shown = builds_.Show(id); !shown.ok()) return ErrorOf(shown.status());
                HttpResponse r;
                r.content_type = "text/event-stream";
                r.headers.emplace_back("Cache-Control", "no-store");
                auto keepalive_due = std::make_shared<std::chrono::steady_clock::time_point>(
                    std::chrono::steady_clock::now() + kKeepalive);
                auto done = std::make_shared<bool>(false);
                r.stream = [this, id, from, keepalive_due, done](std::string* out) mutable {
                  while (!*done) {
                    if (streams_stop_) {
                      *done = true;
                      *out = SseEvent(
                          "error", {{"status", "UNAVAILABLE"},
                                    {"message", "the HTTP API is stopping; the stream ends here"}});
                      return true;
                    }
                    auto chunk =
                        builds_.Follow(id, from, std::chrono::steady_clock::now() + kStopCheck);
                    if (!chunk.ok()) {
                      *done = true;
                      *out = SseEvent("error", {{"status", CodeName(chunk.status().code())},
                                                {"message", chunk.status().message()}});
                      return true;
                    }
                    out->clear();
                    int64_t n = chunk->first;
                    for (const std::string& line : chunk->lines) {
                      ++n;
                      *out += "id: " + std::to_string(n) + "\n" +
                              SseEvent("line", {{"n", n - 1}, {"text", line}});
                    }
                    from = n;
                    if (chunk->ended) {
                      *done = true;
                      auto shown = builds_.Show(id);
                      *out += SseEvent("end", shown.ok() ? *shown : Json::object());
                    }
                    if (!out->empty()) {
                      *keepalive_due = std::chrono::steady_clock::now() + kKeepalive;
                      return true;
                    }
                    if (std::chrono::steady_clock::now() >= *keepalive_due) {
                      *keepalive_due = std::chrono::steady_clock::now() + kKeepalive;
                      *out = ": keepalive\n\n";
                      return true;
                    }
                  }
                  return false;
                };
                return r;
              });

  // What waits for a person (the approvals verb): agent runs that asked for network access
  // or asked a question. Each says how it is answered.
  router_.Add("GET", "/trybox/v1/approvals", [this](const HttpRequest&, const PathParams&) {
    HttpResponse listed = CallVerb({{"verb", "approvals"}});
    if (listed.status != 200) return listed;
    Json waiting = Json::parse(listed.body, nullptr, false).value("approvals", Json::array());
    for (Json& a : waiting) {
      const std::string path = "POST /trybox/v1/agent-runs/" + a.value("run", "") + "/answer ";
      a["answer"] = a.value("kind", "") == "network"
                        ? path + "{\"approve\": true} or {\"deny\": true}"
                        : path + "{\"answer\": TEXT}";
    }
    return api::JsonReply(200, Json{{"approvals", waiting}}.dump());
  });
}

}  // namespace trybox::daemon
