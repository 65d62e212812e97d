#include "daemon/supervisor.h"

#include "agent/loop.h"
#include "agent/text.h"
#include "agent/tools.h"
#include "util/fd.h"

namespace trybox::daemon {
namespace {

namespace ws = trybox::workspace;

constexpr int64_t kVerifyTimeoutMs = 900'000;
constexpr int64_t kSetupTimeoutMs = 600'000;
constexpr size_t kVerifyTailBytes = 4096;
constexpr size_t kHookTailBytes = 2048;
constexpr int kVerifyMemoryMib = 1024;

std::string FirstLine(const std::string& s, size_t max = 72) {
  return agent::CapHead(s.substr(0, s.find('\n')), max);
}

// How a step's command ended, into the step.
void Describe(const ExecResult& r, VerifyStep& step) {
  step.outcome = ExecOutcomeName(r.outcome);
  step.exit_code = r.exit_code;
  step.signal = r.signal;
  step.duration_ms = r.duration_ms;
}

}  // namespace

void Supervisor::Finish(const std::string& run_id, const std::string& vm_id, RunState& state,
                        const std::string& summary, const std::string& agent_verify,
                        const std::shared_ptr<const egress::HeldSecrets>& secrets,
                        const std::function<void(const std::string&)>& progress) {
  bool cut = false;
  state.claim =
      RunClaim{agent::CapChars(summary, agent::kMaxSummaryChars, &cut), cut, "unverified"};
  const std::string verify = state.caller_verify.empty() ? agent_verify : state.caller_verify;
  state.agent_verify = agent_verify;

  // 1. The agent's /workspace comes back, is diffed and committed on trybox/<run-id>.
  const std::string collected = state_dir_ + "/runs/" + run_id + "/collected";
  bool have_tree = CollectWork(run_id, vm_id, collected, "", state);
  // 2. The agent's VM is done with.
  (void)vms_.Destroy(vm_id);

  // 3. The supervisor re-runs the verification in a fresh VM from the collected tree.
  if (verify.empty()) {
    state.verdict = "UNVERIFIED";
  } else {
    Verification v;
    v.command = verify;
    v.source = state.caller_verify.empty() ? "agent" : "caller";
    if (!have_tree) {
      v.outcome = "not_run";
      v.error =
          "the workspace could not be collected, so there was nothing to re-run the "
          "verification on";
    } else {
      progress("verifying in a fresh VM");
      Verify(state, vm_id, collected, secrets, v);
    }
    bool passed = v.outcome == "exited" && v.exit_code == 0;
    state.verification = v;
    state.verdict = passed ? "VERIFIED" : "FAILED_VERIFICATION";
    if (!passed) state.claim->status = "contradicted";
  }
  (void)RemoveTree(collected);
}

bool Supervisor::CollectWork(const std::string& run_id, const std::string& vm_id,
                             const std::string& into, const std::string& what, RunState& state) {
  (void)RemoveTree(into);
  (void)MakeDirs(state_dir_ + "/runs/" + run_id, 0700);
  auto vm = vms_.Get(vm_id);
  Status st = vm.ok() ? Status::Ok() : vm.status();
  if (st.ok()) {
    CollectOptions opts;
    opts.into = into;
    opts.commit = true;
    opts.branch_id = run_id;
    opts.command = "vm_agent run " + run_id + what + ": " + FirstLine(state.task);
    auto c = workspaces_.Collect(**vm, opts);
    if (c.ok()) {
      state.collect_id = c->record.id;
      return true;
    }
    st = c.status();
  }
  state.files_note = st.message();
  return false;
}

void Supervisor::Cancel(const std::string& run_id, const std::string& vm_id, RunState& state) {
  const std::string collected = state_dir_ + "/runs/" + run_id + "/collected";
  (void)CollectWork(run_id, vm_id, collected, " (cancelled)", state);
  (void)vms_.Destroy(vm_id);
  (void)RemoveTree(collected);
}

void Supervisor::Verify(const RunState& state, const std::string& run_vm, const std::string& tree,
                        const std::shared_ptr<const egress::HeldSecrets>& secrets,
                        Verification& v) {
  // The hook the caller brought in, from the host's record; nothing in `tree` is consulted.
  auto hook = workspaces_.InjectedHook(run_vm);
  if (!hook.ok()) {
    v.outcome = "not_run";
    v.error = "could not read the caller's setup hook: " + hook.status().message();
    return;
  }
  auto excludes = ws::ExcludesFromLines({});
  auto manifest = ws::ManifestFromTree(tree, *excludes);
  if (!manifest.ok()) {
    v.outcome = "not_run";
    v.error = "could not read the collected workspace: " + manifest.status().message();
    return;
  }
  CreateRequest create;
  create.image = state.image_name;
  create.memory_mib = kVerifyMemoryMib;
  create.internet = state.internet;
  create.allow = state.allow;
  create.profiles = state.profiles;
  create.deny = state.deny;
  create.secrets = secrets;
  auto created = vms_.Create(create);
  if (!created.ok()) {
    v.outcome = "not_run";
    v.error = "could not start the verification VM: " + created.status().message();
    return;
  }
  VmEntry& vm = *created->entry;
  v.vm = vm.id();
  auto fail = [&](const std::string& what, const Status& st) {
    v.outcome = "not_run";
    v.error = what + ": " + st.message();
    (void)vms_.Destroy(vm.id());
  };
  if (!Prepare(vm, tree, *manifest, *hook, v)) return (void)vms_.Destroy(vm.id());

  ExecSpec spec;
  spec.argv = {"/bin/sh", "-c", v.command};
  spec.cwd = ws::kGuestPath;
  spec.timeout_ms = kVerifyTimeoutMs;
  spec.user = kVerifyUser;
  std::string out;
  ExecIo io;
  io.capture = &out;
  int64_t exec_id = 0;
  auto result = vms_.Exec(vm, spec, io, &exec_id);
  if (!result.ok()) return fail("could not run the verification", result.status());
  v.user = kVerifyUser;
  v.outcome = ExecOutcomeName(result->outcome);
  v.exit_code = result->exit_code;
  v.signal = result->signal;
  v.duration_ms = result->duration_ms;
  v.timeout_ms = result->timeout_ms;
  if (!result->message.empty()) v.error = agent::SanitizeUtf8(result->message);
  if (!result->error.empty()) {
    v.error = agent::SanitizeUtf8(result->error + ": " + result->message);
  }
  v.exec_id = exec_id;
  v.output_tail = agent::CapTail(out, kVerifyTailBytes);
  v.output_tail_bytes = static_cast<int64_t>(std::min(out.size(), kVerifyTailBytes));
  v.output_bytes = static_cast<int64_t>(out.size());
  (void)vms_.Destroy(vm.id());
}

bool Supervisor::Prepare(VmEntry& vm, const std::string& tree, const ws::Manifest& manifest,
                         const std::optional<CallerHook>& hook, Verification& v) {
  const std::string user = kVerifyUser;
  auto stop = [&](VerifyStep step, const std::string& error) {
    step.error = agent::SanitizeUtf8(error);
    v.before.push_back(std::move(step));
    v.outcome = "not_run";
    v.error = "the " + v.before.back().step +
              " step failed, so the check did not run: " + v.before.back().error;
    return false;
  };
  // 1. The tree, written by the daemon: entries as collected, root's, no set-id bits.
  VerifyStep copy{.step = "copy",
                  .what = "tryboxd wrote the collected tree to /workspace (" +
                          std::to_string(manifest.size()) +
                          " entries, owned by root, no set-uid or set-gid bits)"};
  if (Status st = workspaces_.SendTree(vm, tree, manifest, ws::Quota{}); !st.ok()) {
    return stop(std::move(copy), st.message());
  }
  copy.outcome = "done";
  v.before.push_back(std::move(copy));

  // 2. /workspace to the check's account: tryboxd's own command, the image's chown; links
  // are changed themselves (-h), never followed, and nothing of the tree runs.
  VerifyStep chown{.step = "chown",
                   .what = "tryboxd handed /workspace to " + user,
                   .argv = {"chown", "-R", "-h", user + ":", ws::kGuestPath},
                   .user = "root"};
  ExecSpec spec;
  spec.argv = chown.argv;
  spec.cwd = "/";
  spec.timeout_ms = kSetupTimeoutMs;
  auto owned = vms_.Exec(vm, spec, ExecIo{}, &chown.exec_id.emplace());
  if (!owned.ok()) return stop(std::move(chown), owned.status().message());
  Describe(*owned, chown);
  if (!owned->Succeeded()) return stop(std::move(chown), agent::DescribeExec(owned->ToJson(), ""));
  v.before.push_back(std::move(chown));

  // 3. The caller's hook as it went in, as `user`; the tree's own never runs.
  VerifyStep setup{.step = "setup", .user = user};
  auto in_tree = manifest.find(ws::kSetupScript);
  setup.tree_hook = in_tree == manifest.end()                        ? "none"
                    : hook && in_tree->second.sha256 == hook->sha256 ? "unchanged"
                                                                     : "changed";
  if (!hook) {
    setup.outcome = "none";
    setup.what = std::string("no setup hook: the caller's workspace had no ") + ws::kSetupScript;
    v.before.push_back(std::move(setup));
    return true;
  }
  setup.what = std::string("the caller's ") + ws::kSetupScript + ", as it went into the run";
  setup.argv = {"/bin/sh", kHookCopyPath};
  setup.blob = hook->blob;
  setup.sha256 = hook->sha256;
  auto ran = workspaces_.RunHookAs(vm, *hook, user, kSetupTimeoutMs);
  if (!ran.ok()) return stop(std::move(setup), ran.status().message());
  Describe(ran->result, setup);
  setup.exec_id = ran->exec_id;
  setup.output_tail = agent::SanitizeUtf8(agent::CapTail(ran->output, kHookTailBytes));
  if (!ran->result.Succeeded()) {
    return stop(std::move(setup), agent::DescribeExec(ran->result.ToJson(), ""));
  }
  v.before.push_back(std::move(setup));
  return true;
}

}  // namespace trybox::daemon
