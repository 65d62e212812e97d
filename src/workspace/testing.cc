#include "workspace/testing.h"

#include <dirent.h>

#include <algorithm>

#include "util/fd.h"
#include "util/process.h"
#include "util/sha256.h"
#include "workspace/manifest.h"

namespace trybox::workspace::testing {

Result<std::string> Sh(const std::string& home, const std::string& script) {
  ASSIGN_OR_RETURN(CommandResult r, RunCommand({"/bin/sh", "-c",
                                                "export HOME='" + home +
                                                    "' GIT_CONFIG_NOSYSTEM=1 GIT_AUTHOR_NAME=t "
                                                    "GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t "
                                                    "GIT_COMMITTER_EMAIL=t@t; " +
                                                    script}));
  if (!r.exit.exited || r.exit.code != 0) {
    return Internal("script failed (" + r.exit.Describe() + "): " + script + ": " + r.output);
  }
  return r.output;
}

Status PlantGitConfigAttacks(const std::string& home, const std::string& repo,
                             const std::string& marks) {
  std::string evil = marks + "/evil.sh";
  RETURN_IF_ERROR(WriteFileAtomic(evil, "#!/bin/sh\ntouch \"" + marks + "/ran-$1\"\ncat\n", 0755));
  RETURN_IF_ERROR(WriteFileAtomic(marks + "/included.config",
                                  "[core]\n\tpager = " + evil + " included-pager\n"));
  std::string plant = "cd '" + repo + "' && ";
  for (const char* h : {"pre-commit", "post-commit", "commit-msg", "reference-transaction",
                        "post-index-change", "post-checkout", "pre-auto-gc", "post-rewrite"}) {
    plant += "printf '#!/bin/sh\\ntouch " + marks + "/hook-" + h + "\\n' > .git/hooks/" + h +
             " && chmod +x .git/hooks/" + h + " && ";
  }
  auto set = [&](const std::string& key, const std::string& value) {
    plant += "git config '" + key + "' '" + value + "' && ";
  };
  set("core.fsmonitor", evil + " fsmonitor");
  set("core.pager", evil + " pager");
  set("core.editor", evil + " editor");
  set("sequence.editor", evil + " seqeditor");
  set("core.sshCommand", evil + " ssh");
  set("core.gitProxy", evil + " gitproxy");
  set("core.askPass", evil + " askpass");
  set("credential.helper", "!" + evil + " credential");
  set("diff.external", evil + " diffext");
  set("diff.evil.textconv", evil + " textconv");
  set("filter.evil.clean", evil + " clean");
  set("filter.evil.smudge", evil + " smudge");
  set("filter.evil.required", "true");
  for (const char* a : {"ls-files", "hash-object", "cat-file", "rev-parse", "read-tree",
                        "update-index", "write-tree", "commit-tree", "update-ref", "ls-tree"}) {
    set(std::string("alias.") + a, "!" + evil + " alias-" + a);
  }
  set("include.path", marks + "/included.config");
  plant += "printf '* filter=evil diff=evil\\n' > .gitattributes";
  return Sh(home, plant).status();
}

std::vector<std::string> AttacksThatRan(const std::string& marks) {
  std::vector<std::string> out;
  DIR* d = ::opendir(marks.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != ".." && n != "evil.sh" && n != "included.config") out.push_back(n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string TreeFingerprint(const std::string& root) {
  ExcludeList none = ExcludeList::WithProjectFile("").value();
  auto m = ManifestFromTree(root, none);
  std::string acc = m.ok() ? "" : "error: " + m.status().message();
  if (m.ok()) {
    for (const auto& [p, e] : *m) acc += p + " " + e.sha256 + " " + std::to_string(e.mode) + "\n";
  }
  for (const char* f : {"/.git/index", "/.git/HEAD", "/.git/config", "/.git/refs/heads/main"}) {
    acc += f + std::string(" ") + Sha256File(root + f).value_or("absent") + "\n";
  }
  return Sha256Hex(acc);
}

}  // namespace trybox::workspace::testing
