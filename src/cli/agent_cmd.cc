#include "cli/agent_cmd.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include "cli/agent_settings.h"
#include "cli/image_recipe.h"
#include "cli/reply.h"
#include "cli/secret_flags.h"
#include "image/image.h"
#include "util/paths.h"
#include "util/utf8.h"

namespace trybox::cli {

using Json = nlohmann::json;
using Kind = channel::Stream::Message::Kind;

Result<Json> CallAgentVerb(Client& client, const Json& request,
                           const std::function<Status(const Json&)>& on_event) {
  ASSIGN_OR_RETURN(auto s, client.Open(request));
  for (;;) {
    auto m = s->Next();
    if (!m.ok()) return client.Explain(m.status());
    switch (m->kind) {
      case Kind::kEvent:
        if (on_event) {
          Status st = on_event(m->body);
          if (!st.ok()) {
            (void)s->Reset("malformed event");
            return st;
          }
        }
        break;
      case Kind::kEnd: {
        RETURN_IF_ERROR(StatusFromReply(m->body));
        return m->body;
      }
      case Kind::kReset:
        return StatusFromReset(m->body, "the run");
      default:
        break;
    }
  }
}

int AgentExitCode(const Json& report) {
  ReplyView r(report);
  auto outcome = r.StringOr("outcome", "");
  if (!outcome.ok()) return kAgentError;
  if (*outcome == "DONE") {
    auto v = r.StringOr("verdict", "");
    if (v.ok() && *v == "VERIFIED") return kAgentVerified;
    if (v.ok() && *v == "FAILED_VERIFICATION") return kAgentFailedVerification;
    return kAgentUnverified;
  }
  if (*outcome == "NEEDS_INPUT") return kAgentNeedsInput;
  if (*outcome == "IN_PROGRESS") return kAgentInProgress;
  if (*outcome == "CANCELLED") return kAgentCancelled;
  return kAgentError;
}

namespace {

Json Limits(const AgentOptions& a) {
  Json l = Json::object();
  if (a.max_turns > 0) l["max_turns"] = a.max_turns;
  if (a.wall_clock_s > 0) l["wall_clock_s"] = a.wall_clock_s;
  if (a.max_tokens > 0) l["max_tokens"] = a.max_tokens;
  return l;
}

int Fail(std::ostream& err, const Status& st) {
  err << "trybox: " << OneLine(st.message()) << "\n";
  return 125;
}

// What the user reads of an event: its run id, its progress lines, and (following a run)
// each command and how it ended, with the tail of its output.
Result<std::string> DescribeEvent(const Json& ev) {
  ReplyView v(ev);
  std::string text;
  ASSIGN_OR_RETURN(auto run, v.OptionalString("run"));
  if (run) text += "trybox: run " + OneLine(*run) + "\n";
  ASSIGN_OR_RETURN(auto progress, v.OptionalObject("progress"));
  if (progress) {
    ASSIGN_OR_RETURN(std::string message, progress->StringOr("message", ""));
    text += "trybox: " + OneLine(message) + "\n";
  }
  ASSIGN_OR_RETURN(auto exec, v.OptionalObject("exec"));
  if (exec) {
    ASSIGN_OR_RETURN(const Json* argv, exec->Array("argv"));
    std::string line;
    for (const auto& a : *argv)
      line += (line.empty() ? "" : " ") + (a.is_string() ? a.get<std::string>() : a.dump());
    text += "$ " + OneLine(line) + "\n";
  }
  ASSIGN_OR_RETURN(auto output, v.OptionalObject("output"));
  if (output) {
    // A command's output as it is produced (following a run): the bytes as they are.
    auto bytes = GetBytesField(output->json(), "text");
    if (!bytes.ok()) return MalformedReply("output.text", bytes.status().message());
    text += *bytes;
  }
  ASSIGN_OR_RETURN(auto done, v.OptionalObject("exec_end"));
  if (done) {
    // Absent when the output came live, above.
    ASSIGN_OR_RETURN(std::string tail, done->StringOr("output_tail", ""));
    text += tail;
    if (!tail.empty() && tail.back() != '\n') text += "\n";
    ASSIGN_OR_RETURN(auto result, done->Object("result"));
    ASSIGN_OR_RETURN(std::string outcome, result.StringOr("outcome", "?"));
    ASSIGN_OR_RETURN(int64_t code, result.IntOr("exit_code", -1, -1, 255));
    text += "[" + (outcome == "exited" ? "exit " + std::to_string(code) : OneLine(outcome)) + "]\n";
  }
  ASSIGN_OR_RETURN(auto outcome, v.OptionalString("outcome"));
  if (outcome) text += "trybox: the call ended: " + OneLine(*outcome) + "\n";
  return text;
}

// Ctrl-C or SIGTERM while a run works: ask the daemon to cancel it. The run's own call then
// ends with the CANCELLED report, which the caller prints. Before the run has an id, the
// CLI exits, and the daemon takes its caller's loss as a cancellation too.
class CancelOnSignal {
 public:
  explicit CancelOnSignal(Client& client) : client_(client) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    thread_ = std::thread([this, set] {
      int sig = 0;
      if (sigwait(&set, &sig) != 0 || sig == SIGUSR2) return;
      std::string run;
      {
        std::lock_guard<std::mutex> lock(mu_);
        run = run_;
      }
      std::cerr << "trybox: cancelling the run\n";
      if (run.empty()) {
        // No run yet: leaving is the cancellation (the daemon sees its caller gone).
        std::_Exit(kAgentCancelled);
      }
      (void)client_.Call({{"verb", "agent_cancel"}, {"run", run}});
    });
  }
  ~CancelOnSignal() {
    // Wakes the waiting thread without a signal of the user's.
    pthread_kill(thread_.native_handle(), SIGUSR2);
    thread_.join();
  }
  void SetRun(const std::string& run) {
    std::lock_guard<std::mutex> lock(mu_);
    run_ = run;
  }

 private:
  Client& client_;
  std::mutex mu_;
  std::string run_;
  std::thread thread_;
};

std::string Describe(const Json& entry) {
  ReplyView v(entry);
  std::string kind = OneLine(v.StringOr("kind", "?").value_or("?"));
  std::string text = v.StringOr("text", "").value_or("");
  std::string out = "[" + kind + "]";
  if (!text.empty()) out += " " + text;
  out += "\n";
  for (const char* list : {"calls", "results"}) {
    if (!entry.is_object() || !entry.contains(list) || !entry[list].is_array()) continue;
    for (const auto& c : entry[list]) {
      ReplyView cv(c);
      if (std::string(list) == "calls") {
        out += "  -> " + OneLine(cv.StringOr("name", "?").value_or("?")) + " " +
               (c.contains("input") ? c["input"].dump() : std::string()) + "\n";
      } else {
        out += "  <- " + OneLine(cv.StringOr("name", "?").value_or("?")) + ": " +
               cv.StringOr("content", "").value_or("") + "\n";
      }
    }
  }
  return out;
}

}  // namespace

int CmdAgentList(Client& client, const Invocation& inv, std::ostream& out, std::ostream& err) {
  auto r = client.Call({{"verb", "agent_ls"}, {"limit", inv.limit > 0 ? inv.limit : 50}});
  if (!r.ok()) return Fail(err, r.status());
  ReplyView v(*r);
  auto runs = v.Array("runs");
  if (!runs.ok()) return Fail(err, runs.status());
  if (inv.json) {
    out << (*runs)->dump(2) << "\n";
    return 0;
  }
  out << "RUN           OUTCOME      VERDICT              VM            TASK\n";
  for (const auto& run : **runs) {
    ReplyView rv(run);
    auto field = [&](const char* k) { return OneLine(rv.StringOr(k, "").value_or("")); };
    std::string task = rv.StringOr("task", "").value_or("");
    task = OneLine(task.substr(0, task.find('\n')));
    task = task.substr(0, WholeUtf8Prefix(task.substr(0, 60)));
    char line[512];
    std::snprintf(line, sizeof line, "%-13s %-12s %-20s %-13s %s\n", field("run").c_str(),
                  field("outcome").c_str(), field("verdict").c_str(), field("vm").c_str(),
                  task.c_str());
    out << line;
  }
  return 0;
}

int CmdAgentTranscript(Client& client, const Invocation& inv, std::ostream& out,
                       std::ostream& err) {
  auto s = client.Open({{"verb", "agent_transcript"}, {"run", inv.agent.run_id}});
  if (!s.ok()) return Fail(err, s.status());
  std::string data;
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) return Fail(err, m.status());
    if (m->kind == Kind::kData) data += m->data;
    if (m->kind == Kind::kReset) return Fail(err, StatusFromReset(m->body, "the transcript"));
    if (m->kind == Kind::kEnd) {
      Status st = StatusFromReply(m->body);
      if (!st.ok()) return Fail(err, st);
      break;
    }
  }
  Json entries = Json::parse(data, nullptr, false);
  if (!entries.is_array()) return Fail(err, MalformedReply("transcript", "is not a JSON array"));
  if (inv.json) {
    out << entries.dump(2) << "\n";
    return 0;
  }
  for (const auto& e : entries) out << Describe(e);
  return 0;
}

int CmdAgent(Client& client, const Invocation& inv, std::ostream& out, std::ostream& err) {
  const AgentOptions& a = inv.agent;
  if (inv.command == "agent-ls") return CmdAgentList(client, inv, out, err);
  if (inv.command == "agent-transcript") return CmdAgentTranscript(client, inv, out, err);
  Json req;
  if (inv.command == "agent-show") {
    req = {{"verb", "agent_show"}, {"run", a.run_id}, {"follow", a.follow}};
  } else if (inv.command == "agent-cancel") {
    req = {{"verb", "agent_cancel"}, {"run", a.run_id}};
  } else {
    auto model = ResolveModel(Paths::FromEnvironment(), inv.model, ProcessEnv());
    if (!model.ok()) return Fail(err, model.status());
    if (inv.command == "agent") {
      auto image = ResolveAgentImage(Paths::FromEnvironment(), a.image);
      if (!image.ok()) return Fail(err, image.status());
      // Minutes the first time (a developer image installs a toolchain), with its progress.
      Status built = BuildOnFirstUse(Paths::FromEnvironment(), *image, ShowProgress(false), err);
      if (!built.ok()) return Fail(err, built);
      auto internet = ResolveAgentInternet(Paths::FromEnvironment(), inv.vm.agent_internet);
      if (!internet.ok()) return Fail(err, internet.status());
      req = {{"verb", "agent"},       {"task", a.task},        {"image", *image},
             {"internet", *internet}, {"allow", inv.vm.allow}, {"profiles", inv.vm.profiles},
             {"deny", inv.vm.deny},   {"model", *model},       {"limits", Limits(a)}};
      if (!a.verify.empty()) req["verify"] = a.verify;
      if (!inv.vm.secrets.empty()) {
        auto secrets = ResolveSecrets(Paths::FromEnvironment(), inv.vm.secrets);
        if (!secrets.ok()) return Fail(err, secrets.status());
        req["secrets"] = std::move(*secrets);
      }
      if (!inv.vm.http_rules.empty()) req["http_rules"] = inv.vm.http_rules;
      if (!inv.vm.workspace.empty()) {
        char real[PATH_MAX];
        if (!::realpath(inv.vm.workspace.c_str(), real)) {
          return Fail(err, ErrnoError("--workspace " + inv.vm.workspace));
        }
        req["workspace"] = real;
      }
    } else if (inv.command == "agent-answer") {
      req = {{"verb", "agent_answer"},
             {"run", a.run_id},
             {"answer", a.answer},
             {"model", *model},
             {"limits", Limits(a)}};
      if (a.decision == "approve") req["approve"] = true;
      if (a.decision == "deny") req["deny"] = true;
    } else {
      req = {{"verb", "agent_resume"}, {"run", a.run_id}, {"model", *model}, {"limits", Limits(a)}};
    }
  }
  // A call that makes the run work can be cancelled from this terminal.
  std::optional<CancelOnSignal> cancel;
  bool works =
      inv.command == "agent" || inv.command == "agent-answer" || inv.command == "agent-resume";
  if (works) {
    cancel.emplace(client);
    if (!a.run_id.empty()) cancel->SetRun(a.run_id);
  }
  auto end = CallAgentVerb(client, req, [&](const Json& ev) -> Status {
    ASSIGN_OR_RETURN(std::string text, DescribeEvent(ev));
    if (cancel && ev.is_object() && ev.contains("run") && ev["run"].is_string()) {
      cancel->SetRun(ev["run"].get<std::string>());
    }
    err << text;
    err.flush();
    return Status::Ok();
  });
  if (!end.ok()) return Fail(err, end.status());
  ReplyView body(*end);
  auto report = body.Object("report");
  if (!report.ok()) return Fail(err, report.status());
  auto outcome = report->String("outcome");
  if (!outcome.ok()) return Fail(err, outcome.status());
  if (inv.json) {
    out << report->json().dump(2) << "\n";
  } else {
    auto text = body.String("text");
    if (!text.ok()) return Fail(err, text.status());
    out << *text;
  }
  return AgentExitCode(report->json());
}

}  // namespace trybox::cli
