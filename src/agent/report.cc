#include "agent/report.h"

#include <sstream>

#include "agent/text.h"
#include "agent/tools.h"

namespace trybox::agent {
namespace {

using Json = nlohmann::json;

constexpr size_t kTextCommands = 200;
constexpr size_t kTextChanges = 200;

std::string Str(const Json& j, const char* k) {
  return j.is_object() && j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : "";
}

// A value tryboxd chose from a fixed vocabulary, or an id / hash it made; anything else is
// quoted, so a malformed document still cannot put free text on a trusted line.
std::string Word(const Json& j, const char* k) {
  std::string s = Str(j, k);
  for (char c : s) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.' || c == '/' || c == ':';
    if (!ok) return InlineQuote(s, 120);
  }
  return s;
}

std::string Num(const Json& j, const char* k) {
  if (!j.is_object() || !j.contains(k) || !j[k].is_number()) return "?";
  if (j[k].is_number_float()) return std::to_string(static_cast<int64_t>(j[k].get<double>()));
  return std::to_string(j[k].get<int64_t>());
}

std::string Argv(const Json& argv) {
  std::string s;
  if (!argv.is_array()) return InlineQuote(argv.dump());
  for (const auto& a : argv) {
    if (!s.empty()) s += " ";
    s += InlineQuote(a.is_string() ? a.get<std::string>() : a.dump(), 300);
  }
  return s;
}

// How a recorded command ended, in the daemon's words.
std::string Ending(const Json& c) {
  std::string o = Str(c, "outcome");
  if (o == "exited") return "exit " + Num(c, "exit_code");
  if (o == "signaled") return "killed by signal " + Num(c, "signal");
  if (o == "timed_out") return "timed out";
  if (o == "running") return "still running";
  if (o.empty()) return "no outcome recorded";
  return Word(c, "outcome");
}

// What ran in the verification VM before the check, in order (docs/agent.md, "Finishing").
void RenderBeforeTheCheck(const Json& v, std::ostringstream& o) {
  const Json& steps = v.value("before", Json::array());
  if (!steps.is_array() || steps.empty()) return;
  o << "  Before the check, in this order:\n";
  size_t n = 0;
  for (const auto& st : steps) {
    o << "    " << ++n << ". ";
    const std::string step = Str(st, "step");
    if (step == "copy") {
      o << "tryboxd wrote the collected tree to /workspace (owned by root, no set-uid or set-gid "
           "bits): "
        << Word(st, "outcome");
    } else if (step == "setup" && Str(st, "outcome") == "none") {
      o << "no setup hook (the caller's workspace had none)";
    } else {
      o << "[" << Ending(st) << "] ";
      if (step == "setup") {
        o << "the caller's .trybox/setup.sh as it went into the run (git blob " << Word(st, "blob")
          << ")";
      } else {
        o << Argv(st.value("argv", Json::array()));
      }
      o << ", as " << Word(st, "user");
    }
    o << "\n";
    if (st.contains("error") && st["error"].is_string()) {
      o << "       error: " << InlineQuote(st["error"].get<std::string>(), 600) << "\n";
      if (st.contains("output_tail") && st["output_tail"].is_string()) {
        o << "       its output (the last bytes, as printed):\n"
          << QuoteBlock(Str(st, "output_tail"), kQuotePrefix);
      }
    }
    const std::string tree_hook = Str(st, "tree_hook");
    if (tree_hook == "changed" || tree_hook == "unchanged") {
      o << "       the collected tree's own .trybox/setup.sh ("
        << (tree_hook == "changed" ? "changed by the run" : "as the caller's")
        << ") was not run: it never is\n";
    }
  }
}

std::string Heading(const std::string& title) {
  return title + "\n" + std::string(title.size() > 78 ? 78 : title.size(), '-') + "\n";
}

}  // namespace

std::string RenderReportText(const Json& r) {
  std::ostringstream o;
  const std::string outcome = Word(r, "outcome");
  o << "trybox vm_agent report, run " << Word(r, "run") << "\n";
  o << "Outcome: " << outcome << "\n";
  if (outcome == "DONE") o << "Verdict: " << Word(r, "verdict") << "\n";
  if (r.contains("reason") && r["reason"].is_string()) {
    o << "Reason: " << InlineQuote(r["reason"].get<std::string>(), 600) << "\n";
  }
  if (outcome == "NEEDS_INPUT") {
    o << "Next: answer with `trybox agent answer " << Word(r, "run")
      << " TEXT` (or vm_agent with run_id and answer)\n";
  } else if (outcome == "IN_PROGRESS") {
    o << "Next: continue with `trybox agent resume " << Word(r, "run")
      << "` (or vm_agent with run_id)\n";
  }
  o << "\n" << Heading("Facts recorded by tryboxd");
  o << "Task: " << InlineQuote(Str(r, "task"), 600) << "\n";
  const Json& img = r.value("image", Json::object());
  o << "Image: " << Word(img, "name") << " (manifest sha256 " << Word(img, "sha256") << ")\n";
  const Json& m = r.value("model", Json::object());
  const Json& u = r.value("usage", Json::object());
  o << "Model: " << Word(m, "provider") << " " << InlineQuote(Str(m, "model"), 120) << ", "
    << Num(u, "turns") << " turns, " << Num(u, "input_tokens") << " input / "
    << Num(u, "output_tokens") << " output tokens\n";
  const Json& vm = r.value("vm", Json::object());
  // A report from before VMs carried "trust" says nothing either way.
  const bool guest_word = Str(vm, "trust") == "guest_word";
  o << "VM: " << Word(vm, "id") << " (" << Word(vm, "state");
  if (guest_word) {
    o << (vm.value("privileged", Json()) == true ? ", created --privileged"
                                                 : ", not recorded as unprivileged");
  }
  o << ")\n";

  const Json& cmds = r.value("commands", Json::array());
  o << "Commands run: " << cmds.size();
  if (!cmds.empty() && guest_word) {
    o << " (in a VM whose commands could reach the guest's control channel: every result "
         "below is the guest's word, any command could have written it)";
  } else if (!cmds.empty()) {
    // The guest's word: commands run as root there, and trybox-init reports how they ended.
    o << " (as root in the VM; their exit codes are what the guest reported)";
  }
  o << "\n";
  size_t n = 0;
  for (const auto& c : cmds) {
    if (++n > kTextCommands) {
      o << "  ... " << (cmds.size() - kTextCommands) << " more in the JSON report\n";
      break;
    }
    o << "  " << n << ". [" << Ending(c) << ", " << Num(c, "duration_ms") << " ms, "
      << Num(c, "stdout_bytes") << "+" << Num(c, "stderr_bytes") << " bytes out] "
      << Argv(c.value("argv", Json::array())) << "\n";
    if (c.contains("error") && c["error"].is_string() && !c["error"].get<std::string>().empty()) {
      o << "     error: " << InlineQuote(c["error"].get<std::string>(), 300) << "\n";
    }
  }

  const Json& others = r.value("other_commands", Json::array());
  if (!others.empty()) {
    o << "Other commands in this VM, not the agent's (run by hand while the run waited): "
      << others.size() << "\n";
  }

  const Json& net = r.value("network", Json());
  if (net.is_object()) {
    const Json& pol = net.value("policy", Json::object());
    o << "Network (tryboxd's audit of every connection the VM asked for): ";
    if (Str(pol, "mode") == "internet") {
      o << "internet mode (any public host)";
    } else {
      std::string list;
      for (const auto& a : pol.value("allow", Json::array())) {
        if (a.is_string()) list += (list.empty() ? "" : ", ") + a.get<std::string>();
      }
      for (const auto& p : pol.value("profiles", Json::array())) {
        if (p.is_string())
          list += (list.empty() ? "profile " : ", profile ") + p.get<std::string>();
      }
      o << "allow-list (" << (list.empty() ? "empty" : InlineQuote(list, 300)) << ")";
    }
    std::string deny;
    for (const auto& d : pol.value("deny", Json::array())) {
      if (d.is_string()) deny += (deny.empty() ? "" : ", ") + d.get<std::string>();
    }
    if (!deny.empty()) o << ", denied " << InlineQuote(deny, 300);
    o << "; " << Num(net, "connections") << " connections\n";
    if (net.contains("error")) o << "  " << InlineQuote(Str(net, "error"), 300) << "\n";
    for (const auto& h : net.value("reached", Json::array())) {
      o << "  reached " << InlineQuote(Str(h, "host"), 255) << ":" << Num(h, "port") << " ("
        << Num(h, "connections") << " connections, " << Num(h, "bytes_up") << " bytes up, "
        << Num(h, "bytes_down") << " down)\n";
    }
    for (const auto& f : net.value("refused", Json::array())) {
      o << "  " << Word(f, "verdict") << " " << InlineQuote(Str(f, "host"), 255) << ":"
        << Num(f, "port") << " x" << Num(f, "count") << ": " << InlineQuote(Str(f, "reason"), 300)
        << "\n";
    }
    for (const auto& c : net.value("changes", Json::array())) {
      o << "  " << InlineQuote(Str(c, "reason"), 300) << "\n";
    }
    if (net.value("truncated", false)) o << "  ... more in the audit (trybox audit --vm)\n";
  }

  const Json& files = r.value("files", Json());
  if (files.is_object()) {
    const Json& changes = files.value("changes", Json::array());
    const Json& counts = files.value("counts", Json::object());
    o << "Files changed in /workspace: "
      << (files.contains("changes_total") ? Num(files, "changes_total")
                                          : std::to_string(changes.size()));
    std::string sep = " (";
    for (const char* k : {"added", "modified", "deleted", "renamed", "mode_changed"}) {
      if (Num(counts, k) != "0" && Num(counts, k) != "?") {
        o << sep << k << " " << Num(counts, k);
        sep = ", ";
      }
    }
    o << (sep == ", " ? ")" : "") << "\n";
    n = 0;
    for (const auto& ch : changes) {
      if (++n > kTextChanges) {
        o << "  ... " << (changes.size() - kTextChanges) << " more in the JSON report\n";
        break;
      }
      o << "  " << Word(ch, "change") << " " << InlineQuote(Str(ch, "path"), 300);
      if (ch.contains("from")) o << " from " << InlineQuote(Str(ch, "from"), 300);
      if (ch.contains("new_size")) o << " (" << Num(ch, "new_size") << " bytes)";
      o << "\n";
    }
  } else {
    o << "Files changed in /workspace: not collected";
    if (r.contains("files_note")) o << " (" << InlineQuote(Str(r, "files_note"), 300) << ")";
    o << "\n";
  }
  const Json& commit = r.value("commit", Json());
  if (commit.is_object()) {
    o << "Commit: " << Word(commit, "sha") << " on branch " << Word(commit, "branch") << " of "
      << InlineQuote(Str(commit, "repo"), 300) << "\n";
  } else {
    o << "Commit: none"
      << (r.contains("commit_note") ? " (" + InlineQuote(Str(r, "commit_note"), 300) + ")" : "")
      << "\n";
  }

  const Json& v = r.value("verification", Json());
  if (v.is_object()) {
    o << "Verification (tryboxd re-ran it in a fresh VM from the collected /workspace):\n";
    o << "  Command: " << InlineQuote(Str(v, "command"), 600) << " (given by the "
      << Word(v, "source") << ")\n";
    o << "  VM: " << Word(v, "vm");
    if (v.contains("user") && v["user"].is_string()) {
      o << ", run as " << Word(v, "user")
        << " with no capabilities and no_new_privs (nothing it ran could reach the guest's "
           "control channel)";
    }
    o << "\n";
    RenderBeforeTheCheck(v, o);
    o << "  Result: " << Ending(v) << " after " << Num(v, "duration_ms") << " ms\n";
    if (v.contains("error") && v["error"].is_string() && !v["error"].get<std::string>().empty()) {
      o << "  Error: " << InlineQuote(v["error"].get<std::string>(), 600) << "\n";
    }
    o << "  Output (the last " << Num(v, "output_tail_bytes") << " of " << Num(v, "output_bytes")
      << " bytes, as printed):\n";
    o << QuoteBlock(Str(v, "output_tail"), kQuotePrefix);
  } else if (outcome == "DONE") {
    o << "Verification: none (no verification command was given; verdict UNVERIFIED)\n";
  }

  const Json& ap = r.value("approval", Json());
  if (ap.is_object()) {
    o << "Approval requested: network access to " << InlineQuote(Str(ap, "host"), 255) << ":"
      << Num(ap, "port") << ", waiting for a person: `trybox approve " << Word(r, "run")
      << "` or `trybox deny " << Word(r, "run") << "` (an answer in words grants nothing)\n";
  }
  const Json& q = r.value("question", Json());
  if (q.is_object()) {
    o << "\n"
      << Heading(ap.is_object() ? "The agent's reason for the request (its words, quoted)"
                                : "The agent's question (its words, quoted)");
    o << QuoteBlock(Str(q, "text"), kQuotePrefix);
    if (q.value("truncated", false)) o << "(cut at " << kMaxQuestionChars << " characters)\n";
  }
  const Json& claim = r.value("claim", Json());
  if (claim.is_object()) {
    std::string status = Str(claim, "status");
    std::string title = status == "contradicted"
                            ? "The agent's summary: a claim CONTRADICTED by the re-run above"
                            : "The agent's summary: an unverified claim";
    o << "\n" << Heading(title);
    o << QuoteBlock(Str(claim, "summary"), kQuotePrefix);
    if (claim.value("truncated", false)) o << "(cut at " << kMaxSummaryChars << " characters)\n";
  }
  o << "(end of report " << Word(r, "run") << ")\n";
  return o.str();
}

}  // namespace trybox::agent
