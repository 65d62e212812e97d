// The in-sandbox API's process service (docs/protocol/e2b.md, "In-sandbox API"): envd's
// `process.Process` over the Connect protocol's JSON codec (api/connect.h), as E2B's SDKs
// call it at E2B_SANDBOX_URL for `sandbox.commands`. A process is a trybox exec, started
// detached (it outlives the request that started it, as envd's do) and recorded like any
// other; its output is streamed from the exec's kept log (ExecLog), so `trybox logs`, `ps`
// and `kill` see the same process. Its "pid" is the exec id.
#include <openssl/crypto.h>

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>

#include "api/connect.h"
#include "daemon/envd.h"
#include "daemon/http_api.h"
#include "util/log.h"
#include "util/numbers.h"

namespace trybox::daemon {
namespace {

using api::HttpRequest;
using api::HttpResponse;
using api::PathParams;
namespace connect = api::connect;
using nlohmann::json;

constexpr size_t kDataChunk = 32 * 1024;
constexpr int64_t kDefaultKeepaliveS = 50;

HttpResponse StreamOf(std::function<bool(std::string*)> next) {
  HttpResponse r;
  r.content_type = "application/connect+json";
  r.stream = std::move(next);
  return r;
}

HttpResponse StreamError(const Status& st) { return EnvdStreamError(st); }

// envd's ProcessSelector: {"pid": N}; a tag names nothing here (none are kept).
Result<int64_t> SelectedPid(const json& msg) {
  auto p = msg.find("process");
  if (p == msg.end() || !p->is_object()) return InvalidArgument("process (a selector) is required");
  if (auto pid = p->find("pid"); pid != p->end()) {
    if (!pid->is_number_unsigned() && !pid->is_number_integer()) {
      return InvalidArgument("process.pid must be a number");
    }
    const int64_t n = pid->get<int64_t>();
    if (n <= 0) return InvalidArgument("process.pid must be positive");
    return n;
  }
  if (auto tag = p->find("tag"); tag != p->end()) {
    return NotFound("no process has tag " + tag->dump() + " (trybox keeps no tags)");
  }
  return InvalidArgument("process must select a pid");
}

// envd's PTY message, {"size": {"cols": C, "rows": R}}: a terminal of that size.
Result<TermSize> PtySize(const json& pty) {
  if (!pty.is_object()) return InvalidArgument("pty must be an object");
  auto size = pty.find("size");
  if (size == pty.end() || !size->is_object()) return InvalidArgument("pty.size is required");
  TermSize t;
  for (auto [name, field] : {std::pair{"cols", &t.cols}, std::pair{"rows", &t.rows}}) {
    auto v = size->find(name);
    if (v == size->end() || !v->is_number_integer() || v->get<int64_t>() < 1 ||
        v->get<int64_t>() > kMaxTermDimension) {
      return InvalidArgument(std::string("pty.size.") + name + " must be a number from 1 to " +
                             std::to_string(kMaxTermDimension));
    }
    *field = v->get<int>();
  }
  return t;
}

// Go's exec status words, which envd sends in an EndEvent's `status`.
std::string SignalWords(int sig) {
  switch (sig) {
    case 9:
      return "signal: killed";
    case 15:
      return "signal: terminated";
    case 2:
      return "signal: interrupt";
    case 1:
      return "signal: hangup";
    default:
      return "signal: " + std::to_string(sig);
  }
}

// The EndEvent for an exec's record.
json EndEventOf(const store::ExecRecord& rec) {
  json end = {{"exitCode", -1}, {"exited", false}};
  if (rec.outcome == "exited" && rec.exit_code) {
    end["exitCode"] = *rec.exit_code;
    end["exited"] = true;
    end["status"] = "exit status " + std::to_string(*rec.exit_code);
  } else if (rec.outcome == "signaled" && rec.signal) {
    end["status"] = SignalWords(*rec.signal);
  } else if (rec.outcome == "timed_out") {
    end["status"] = "timed out";
    end["error"] = "the command's timeout passed; it was killed";
  } else {
    end["status"] = rec.outcome;
    end["error"] = rec.error.empty() ? "the command ended as " + rec.outcome : rec.error;
  }
  return end;
}

// How long a quiet stream waits at a time before it looks at `stop`: it bounds how long a
// server that is stopping waits for a stream whose command prints nothing. Output is
// streamed as it arrives whatever this is.
constexpr auto kStopCheck = std::chrono::seconds(1);

// Streams one exec's output as envd's ProcessEvents: `start`, `data` from the log from the
// given offsets, `keepalive` after each quiet interval, and `end` with the outcome, then the
// end of the stream; or, once `stop` is set (the server is stopping), an end of the stream
// with `unavailable`, which the client sees only if its connection is still open (the
// process runs on: `trybox logs` has its output).
class ProcessStream {
 public:
  // `pty`: the process runs on a terminal, whose output (merged on the log's stdout) is
  // sent as `pty` data.
  ProcessStream(VmService& vms, int64_t pid, bool pty, std::shared_ptr<ExecLog> log,
                int64_t out_offset, int64_t err_offset, std::chrono::seconds keepalive,
                const std::atomic<bool>& stop)
      : vms_(vms), pid_(pid), pty_(pty), log_(std::move(log)), keepalive_(keepalive), stop_(stop) {
    offset_[ExecLog::kStdout] = out_offset;
    offset_[ExecLog::kStderr] = err_offset;
  }

  bool Next(std::string* out) {
    if (!started_) {
      started_ = true;
      *out = connect::Envelope({{"event", {{"start", {{"pid", pid_}}}}}});
      return true;
    }
    if (done_) return false;
    while (true) {
      const bool finished = log_->finished();  // before the reads: nothing after it is missed
      for (ExecLog::Channel ch : {ExecLog::kStdout, ExecLog::kStderr}) {
        if (broken_[ch]) continue;
        auto slice = log_->Read(ch, offset_[ch], kDataChunk);
        if (!slice.ok()) {
          broken_[ch] = true;  // the output could not be kept: nothing to stream
          continue;
        }
        if (slice->skipped_to >= 0) {
          offset_[ch] = slice->skipped_to;  // dropped by the log's cap while we were behind
          return Next(out);
        }
        if (!slice->data.empty()) {
          offset_[ch] += static_cast<int64_t>(slice->data.size());
          const char* name = pty_ ? "pty" : ch == ExecLog::kStdout ? "stdout" : "stderr";
          *out = connect::Envelope({{"event", {{"data", {{name, connect::Base64(slice->data)}}}}}});
          return true;
        }
      }
      if (finished) {
        done_ = true;
        auto rec = vms_.GetExec(pid_);
        if (!rec.ok()) {
          *out = connect::EndStream(rec.status());
          return true;
        }
        *out = connect::Envelope({{"event", {{"end", EndEventOf(*rec)}}}}) +
               connect::EndStream(Status::Ok());
        return true;
      }
      if (stop_) {
        done_ = true;
        *out = connect::EndStream(Unavailable("the HTTP API is stopping; process " +
                                              std::to_string(pid_) + " runs on (trybox logs " +
                                              std::to_string(pid_) + " has its output)"));
        return true;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= keepalive_due_) {
        keepalive_due_ = now + keepalive_;
        *out = connect::Envelope({{"event", {{"keepalive", json::object()}}}});
        return true;
      }
      (void)log_->WaitAnyUntil(offset_[ExecLog::kStdout], offset_[ExecLog::kStderr],
                               std::min(keepalive_due_, now + kStopCheck));
    }
  }

 private:
  VmService& vms_;
  const int64_t pid_;
  const bool pty_;
  std::shared_ptr<ExecLog> log_;
  const std::chrono::seconds keepalive_;
  const std::atomic<bool>& stop_;
  std::chrono::steady_clock::time_point keepalive_due_ =
      std::chrono::steady_clock::now() + keepalive_;
  int64_t offset_[2] = {0, 0};
  bool broken_[2] = {false, false};
  bool started_ = false;
  bool done_ = false;
};

std::chrono::seconds KeepaliveOf(const HttpRequest& req) { return EnvdKeepalive(req); }

// A refusal of the exec service, as envd words it: a process that ended meanwhile is
// NOT_FOUND (the SDK takes that for "gone"); anything else as it is.
Status ProcessGone(VmService& vms, int64_t pid, const Status& st) {
  auto rec = vms.GetExec(pid);
  if (rec.ok() && rec->outcome != "running") {
    return NotFound("process " + std::to_string(pid) + " is not running");
  }
  return st;
}

}  // namespace

HttpResponse EnvdStreamError(const Status& st) {
  return {200, "application/connect+json", {}, connect::EndStream(st)};
}

std::chrono::seconds EnvdKeepalive(const HttpRequest& req) {
  auto n =
      ParseBoundedInt(req.Header("keepalive-ping-interval"), 1, 3600, "Keepalive-Ping-Interval");
  return std::chrono::seconds(n.ok() ? *n : kDefaultKeepaliveS);
}

bool SameSecret(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// The exec `pid` if it is one of this sandbox's; NOT_FOUND otherwise, the same words
// either way.
Result<store::ExecRecord> HttpApi::SandboxExec(const std::string& sandbox, int64_t pid) {
  auto rec = vms_.GetExec(pid);
  if (!rec.ok() || rec->vm_id != sandbox) {
    return NotFound("process " + std::to_string(pid) + " not found");
  }
  return *rec;
}

// `pid` if it is one of this sandbox's and still running; NOT_FOUND otherwise.
Result<store::ExecRecord> HttpApi::RunningSandboxExec(const std::string& sandbox, int64_t pid) {
  ASSIGN_OR_RETURN(store::ExecRecord rec, SandboxExec(sandbox, pid));
  if (rec.outcome != "running") {
    return NotFound("process " + std::to_string(pid) + " is not running");
  }
  return rec;
}

void HttpApi::AddEnvdRoutes() {
  AddFilesystemRoutes(envd_router_, vms_, streams_stop_);
  envd_router_.Add("GET", "/health", [](const HttpRequest&, const PathParams&) {
    return HttpResponse{204, "", {}, ""};
  });

  envd_router_.Add(
      "POST", "/process.Process/Start", [this](const HttpRequest& req, const PathParams&) {
        auto msg = connect::ParseStreamingRequest(req.body);
        if (!msg.ok()) return StreamError(msg.status());
        auto sandbox = book_.Find(req.sandbox);
        auto vm = vms_.Get(req.sandbox);
        if (!sandbox || !vm.ok())
          return StreamError(Unavailable("sandbox " + req.sandbox + " is gone"));
        const json& m = *msg;
        auto p = m.find("process");
        if (p == m.end() || !p->is_object())
          return StreamError(InvalidArgument("process is required"));
        auto cmd = p->find("cmd");
        if (cmd == p->end() || !cmd->is_string() || cmd->get_ref<const std::string&>().empty()) {
          return StreamError(InvalidArgument("process.cmd must be a non-empty string"));
        }
        ExecRequest er;
        er.vm = req.sandbox;
        er.argv.push_back(cmd->get<std::string>());
        if (auto args = p->find("args"); args != p->end() && !args->is_null()) {
          if (!args->is_array())
            return StreamError(InvalidArgument("process.args must be strings"));
          for (const auto& a : *args) {
            if (!a.is_string()) return StreamError(InvalidArgument("process.args must be strings"));
            er.argv.push_back(a.get<std::string>());
          }
        }
        er.env = sandbox->env;  // the sandbox's envVars, under the call's own
        if (auto envs = p->find("envs"); envs != p->end() && !envs->is_null()) {
          if (!envs->is_object())
            return StreamError(InvalidArgument("process.envs must be strings"));
          for (const auto& [k, v] : envs->items()) {
            if (!v.is_string() || k.empty() || k.find('=') != std::string::npos) {
              return StreamError(InvalidArgument("process.envs must map names to strings"));
            }
            er.env[k] = v.get<std::string>();
          }
        }
        if (auto cwd = p->find("cwd"); cwd != p->end() && !cwd->is_null()) {
          if (!cwd->is_string())
            return StreamError(InvalidArgument("process.cwd must be a string"));
          er.cwd = cwd->get<std::string>();
        } else {
          er.cwd = "";  // the account's home, as envd's default
        }
        if (auto pty = m.find("pty"); pty != m.end() && !pty->is_null()) {
          auto size = PtySize(*pty);
          if (!size.ok()) return StreamError(size.status());
          er.tty = *size;
        }
        if (auto in = m.find("stdin"); in != m.end() && !in->is_null()) {
          if (!in->is_boolean()) return StreamError(InvalidArgument("stdin must be a boolean"));
          // A terminal is its own input: stdin is for a process without one.
          er.stdin = in->get<bool>() && !er.tty;
        }
        if (auto tag = m.find("tag"); tag != m.end() && !tag->is_null()) {
          return StreamError(FailedPrecondition("process tags are not served by trybox yet"));
        }
        auto user = EnvdUser(req);
        if (!user.ok()) return StreamError(user.status());
        er.user = *user == "root" ? "" : *user;
        auto timeout = connect::TimeoutMs(req);
        if (!timeout.ok()) return StreamError(timeout.status());
        er.timeout_ms = std::min(*timeout, kMaxTimeoutMs);
        ExecSpec spec = vms_.SpecFor(**vm, er);
        auto started = vms_.ExecDetached(*vm, spec);
        if (!started.ok()) return StreamError(started.status());
        if (started->ended) {
          const ExecResult& r = *started->ended;
          return StreamError(InvalidArgument("the command did not start: " + r.error +
                                             (r.message.empty() ? "" : ": " + r.message)));
        }
        auto log = vms_.OpenExecLog(started->exec_id);
        if (!log.ok()) return StreamError(log.status());
        auto s = std::make_shared<ProcessStream>(vms_, started->exec_id, er.tty.has_value(), *log,
                                                 0, 0, KeepaliveOf(req), streams_stop_);
        return StreamOf([s](std::string* out) { return s->Next(out); });
      });

  envd_router_.Add(
      "POST", "/process.Process/Connect", [this](const HttpRequest& req, const PathParams&) {
        auto msg = connect::ParseStreamingRequest(req.body);
        if (!msg.ok()) return StreamError(msg.status());
        auto pid = SelectedPid(*msg);
        if (!pid.ok()) return StreamError(pid.status());
        auto rec = SandboxExec(req.sandbox, *pid);
        if (!rec.ok()) return StreamError(rec.status());
        if (rec->outcome != "running") {
          return StreamError(NotFound("process " + std::to_string(*pid) + " is not running"));
        }
        auto log = vms_.OpenExecLog(*pid);
        if (!log.ok()) return StreamError(log.status());
        auto input = vms_.ExecInputOf(*pid);
        const bool pty = input.ok() && input->tty;
        // From now on, as envd's Connect: what was printed before is in `trybox logs`.
        auto s = std::make_shared<ProcessStream>(
            vms_, *pid, pty, *log, (*log)->total(ExecLog::kStdout), (*log)->total(ExecLog::kStderr),
            KeepaliveOf(req), streams_stop_);
        return StreamOf([s](std::string* out) { return s->Next(out); });
      });

  envd_router_.Add(
      "POST", "/process.Process/List", [this](const HttpRequest& req, const PathParams&) {
        auto msg = connect::ParseUnaryRequest(req.body);
        if (!msg.ok()) return connect::UnaryError(msg.status());
        auto execs = vms_.Execs(req.sandbox);
        if (!execs.ok()) return connect::UnaryError(execs.status());
        json list = json::array();
        for (const auto& e : *execs) {
          if (e.outcome != "running" || !e.argv.is_array() || e.argv.empty()) continue;
          json args = json::array();
          for (size_t i = 1; i < e.argv.size(); ++i) args.push_back(e.argv[i]);
          list.push_back(
              {{"pid", e.id},
               {"config",
                {{"cmd", e.argv[0]}, {"args", args}, {"envs", json::object()}, {"cwd", e.cwd}}}});
        }
        return connect::UnaryReply({{"processes", list}});
      });

  envd_router_.Add("POST", "/process.Process/SendSignal",
                   [this](const HttpRequest& req, const PathParams&) {
                     auto msg = connect::ParseUnaryRequest(req.body);
                     if (!msg.ok()) return connect::UnaryError(msg.status());
                     auto pid = SelectedPid(*msg);
                     if (!pid.ok()) return connect::UnaryError(pid.status());
                     int sig = 0;
                     const json sj = msg->value("signal", json());
                     if (sj == "SIGNAL_SIGKILL" || sj == 9) sig = 9;
                     if (sj == "SIGNAL_SIGTERM" || sj == 15) sig = 15;
                     if (sig == 0) {
                       return connect::UnaryError(
                           InvalidArgument("signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM"));
                     }
                     auto rec = SandboxExec(req.sandbox, *pid);
                     if (!rec.ok()) return connect::UnaryError(rec.status());
                     Status st = vms_.SignalExec(*pid, sig);
                     if (st.code() == Code::kFailedPrecondition) {
                       return connect::UnaryError(
                           NotFound("process " + std::to_string(*pid) + " is not running"));
                     }
                     if (!st.ok()) return connect::UnaryError(st);
                     return connect::UnaryReply(json::object());
                   });

  // Input, its end, and a terminal's size, for a process started with `stdin: true` or a
  // PTY (VmService::InputExec and its kin). A process of this sandbox that has ended is
  // `not_found`, as envd has it; one that takes no such input is `failed_precondition`
  // naming why.
  envd_router_.Add(
      "POST", "/process.Process/SendInput", [this](const HttpRequest& req, const PathParams&) {
        auto msg = connect::ParseUnaryRequest(req.body);
        if (!msg.ok()) return connect::UnaryError(msg.status());
        auto pid = SelectedPid(*msg);
        if (!pid.ok()) return connect::UnaryError(pid.status());
        auto input = msg->find("input");
        if (input == msg->end() || !input->is_object()) {
          return connect::UnaryError(InvalidArgument("input (stdin or pty bytes) is required"));
        }
        auto stdin_bytes = input->find("stdin");
        auto pty_bytes = input->find("pty");
        const bool to_pty = pty_bytes != input->end();
        if (to_pty == (stdin_bytes != input->end())) {
          return connect::UnaryError(InvalidArgument("input must hold one of stdin and pty"));
        }
        const json& field = to_pty ? *pty_bytes : *stdin_bytes;
        if (!field.is_string()) {
          return connect::UnaryError(InvalidArgument("input bytes must be base64 text"));
        }
        auto data = connect::FromBase64(field.get_ref<const std::string&>());
        if (!data.ok()) return connect::UnaryError(data.status());
        auto running = RunningSandboxExec(req.sandbox, *pid);
        if (!running.ok()) return connect::UnaryError(running.status());
        auto takes = vms_.ExecInputOf(*pid);
        if (!takes.ok()) return connect::UnaryError(ProcessGone(vms_, *pid, takes.status()));
        if (to_pty != takes->tty) {
          return connect::UnaryError(
              FailedPrecondition("process " + std::to_string(*pid) +
                                 (to_pty ? " has no PTY: send its input as stdin"
                                         : " runs on a PTY: send its input as pty")));
        }
        Status st = vms_.InputExec(*pid, *data);
        if (!st.ok()) return connect::UnaryError(ProcessGone(vms_, *pid, st));
        return connect::UnaryReply(json::object());
      });

  envd_router_.Add("POST", "/process.Process/CloseStdin",
                   [this](const HttpRequest& req, const PathParams&) {
                     auto msg = connect::ParseUnaryRequest(req.body);
                     if (!msg.ok()) return connect::UnaryError(msg.status());
                     auto pid = SelectedPid(*msg);
                     if (!pid.ok()) return connect::UnaryError(pid.status());
                     auto running = RunningSandboxExec(req.sandbox, *pid);
                     if (!running.ok()) return connect::UnaryError(running.status());
                     Status st = vms_.CloseExecInput(*pid);
                     if (!st.ok()) return connect::UnaryError(ProcessGone(vms_, *pid, st));
                     return connect::UnaryReply(json::object());
                   });

  envd_router_.Add("POST", "/process.Process/Update",
                   [this](const HttpRequest& req, const PathParams&) {
                     auto msg = connect::ParseUnaryRequest(req.body);
                     if (!msg.ok()) return connect::UnaryError(msg.status());
                     auto pid = SelectedPid(*msg);
                     if (!pid.ok()) return connect::UnaryError(pid.status());
                     auto pty = msg->find("pty");
                     if (pty == msg->end() || pty->is_null()) {
                       return connect::UnaryReply(json::object());  // nothing to change
                     }
                     auto size = PtySize(*pty);
                     if (!size.ok()) return connect::UnaryError(size.status());
                     auto running = RunningSandboxExec(req.sandbox, *pid);
                     if (!running.ok()) return connect::UnaryError(running.status());
                     Status st = vms_.ResizeExec(*pid, *size);
                     if (!st.ok()) return connect::UnaryError(ProcessGone(vms_, *pid, st));
                     return connect::UnaryReply(json::object());
                   });
}

}  // namespace trybox::daemon
