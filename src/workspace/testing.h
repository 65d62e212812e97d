// Test support shared by the workspace unit tests, e2e tests and the benchmark: shell
// scripts with a private HOME, a planted hostile git configuration, and a fingerprint of a
// whole working tree. Not used by trybox itself.
#pragma once

#include <string>
#include <vector>

#include "util/status.h"

namespace trybox::workspace::testing {

// Runs `script` with /bin/sh, HOME=`home` and a fixed git identity, so the machine's own
// git configuration plays no part. Returns the output (stdout and stderr).
Result<std::string> Sh(const std::string& home, const std::string& script);

// Plants, in `repo`'s .git/config, .git/hooks and .gitattributes, every attack that a
// hostile repository can aim at a tool running git in it: hooks, core.fsmonitor, pager,
// editor, sshCommand, gitProxy, askPass, credential helper, diff.external, textconv,
// clean/smudge filters, aliases shadowing the plumbing trybox runs, and an include.path.
// Each one, if it runs, creates a file named after itself in `marks`.
Status PlantGitConfigAttacks(const std::string& home, const std::string& repo,
                             const std::string& marks);
// The files in `marks` other than the helper files PlantGitConfigAttacks put there.
std::vector<std::string> AttacksThatRan(const std::string& marks);

// sha256 over every path, mode and content below `root` (.git's objects excepted but its
// index, HEAD, config and refs/heads included), so equal means untouched byte for byte.
std::string TreeFingerprint(const std::string& root);

}  // namespace trybox::workspace::testing
