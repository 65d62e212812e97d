#include "cli/agent_cmd.h"

#include <limits.h>
#include <stdlib.h>

#include <iostream>

#include "cli/agent_settings.h"
#include "cli/reply.h"
#include "util/paths.h"

namespace trybox::cli {

using Json = nlohmann::json;
using Kind = channel::Stream::Message::Kind;

Result<Json> CallAgentVerb(Client& client, const Json& request,
                           const std::function<Status(const Json&)>& on_event) {
  ASSIGN_OR_RETURN(auto s, client.Open(request));
  for (;;) {
    auto m = s->Next();
    if (!m.ok()) return m.status().Annotate("lost tryboxd during the run");
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
  err << "trybox: " << st.message() << "\n";
  return 125;
}

// What the user reads of an event: its run id, then its progress lines.
Result<std::string> DescribeEvent(const Json& ev) {
  ReplyView v(ev);
  std::string text;
  ASSIGN_OR_RETURN(auto run, v.OptionalString("run"));
  if (run) text += "trybox: run " + *run + "\n";
  ASSIGN_OR_RETURN(auto progress, v.OptionalObject("progress"));
  if (progress) {
    ASSIGN_OR_RETURN(std::string message, progress->StringOr("message", ""));
    text += "trybox: " + message + "\n";
  }
  return text;
}

}  // namespace

int CmdAgent(Client& client, const Invocation& inv, std::ostream& out, std::ostream& err) {
  const AgentOptions& a = inv.agent;
  Json req;
  if (inv.command == "agent-show") {
    req = {{"verb", "agent_show"}, {"run", a.run_id}};
  } else {
    auto model = ResolveModel(Paths::FromEnvironment(), inv.model, ProcessEnv());
    if (!model.ok()) return Fail(err, model.status());
    if (inv.command == "agent") {
      req = {{"verb", "agent"},
             {"task", a.task},
             {"image", inv.vm.image},
             {"allow", inv.vm.allow},
             {"profiles", inv.vm.profiles},
             {"model", *model},
             {"limits", Limits(a)}};
      if (!a.verify.empty()) req["verify"] = a.verify;
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
    } else {
      req = {{"verb", "agent_resume"}, {"run", a.run_id}, {"model", *model}, {"limits", Limits(a)}};
    }
  }
  auto end = CallAgentVerb(client, req, [&err](const Json& ev) -> Status {
    ASSIGN_OR_RETURN(std::string text, DescribeEvent(ev));
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
