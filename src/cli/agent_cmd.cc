#include "cli/agent_cmd.h"

#include <limits.h>
#include <stdlib.h>

#include <iostream>

#include "cli/agent_settings.h"
#include "util/paths.h"

namespace trybox::cli {

using Json = nlohmann::json;
using Kind = channel::Stream::Message::Kind;

Result<Json> CallAgentVerb(Client& client, const Json& request,
                           const std::function<void(const Json&)>& on_event) {
  ASSIGN_OR_RETURN(auto s, client.Open(request));
  for (;;) {
    auto m = s->Next();
    if (!m.ok()) return m.status().Annotate("lost tryboxd during the run");
    switch (m->kind) {
      case Kind::kEvent:
        if (on_event) on_event(m->body);
        break;
      case Kind::kEnd: {
        RETURN_IF_ERROR(StatusFromReply(m->body));
        return m->body;
      }
      case Kind::kReset:
        return Unavailable("tryboxd aborted the run: " + m->body.value("reason", ""));
      default:
        break;
    }
  }
}

int AgentExitCode(const Json& report) {
  std::string outcome = report.value("outcome", "");
  if (outcome == "DONE") {
    std::string v = report.value("verdict", "");
    if (v == "VERIFIED") return kAgentVerified;
    if (v == "FAILED_VERIFICATION") return kAgentFailedVerification;
    return kAgentUnverified;
  }
  if (outcome == "NEEDS_INPUT") return kAgentNeedsInput;
  if (outcome == "IN_PROGRESS") return kAgentInProgress;
  return kAgentError;
}

namespace {

Json Limits(const AgentOptions& a) {
  Json l = Json::object();
  if (a.max_turns > 0) l["max_turns"] = a.max_turns;
  if (a.timeout_s > 0) l["wall_clock_s"] = a.timeout_s;
  if (a.max_tokens > 0) l["max_tokens"] = a.max_tokens;
  return l;
}

int Fail(const Status& st) {
  std::cerr << "trybox: " << st.message() << "\n";
  return 125;
}

}  // namespace

int CmdAgent(Client& client, const Invocation& inv) {
  const AgentOptions& a = inv.agent;
  Json req;
  if (inv.command == "agent-show") {
    req = {{"verb", "agent_show"}, {"run", a.run_id}};
  } else {
    auto model = ResolveModel(Paths::FromEnvironment(), inv.model, ProcessEnv());
    if (!model.ok()) return Fail(model.status());
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
          return Fail(ErrnoError("--workspace " + inv.vm.workspace));
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
  auto end = CallAgentVerb(client, req, [](const Json& ev) {
    if (ev.contains("run")) std::cerr << "trybox: run " << ev["run"].get<std::string>() << "\n";
    if (ev.contains("progress")) {
      std::cerr << "trybox: " << ev["progress"].value("message", "") << "\n";
    }
  });
  if (!end.ok()) return Fail(end.status());
  if (inv.json) {
    std::cout << (*end)["report"].dump(2) << "\n";
  } else {
    std::cout << (*end)["text"].get<std::string>();
  }
  return AgentExitCode((*end)["report"]);
}

}  // namespace trybox::cli
