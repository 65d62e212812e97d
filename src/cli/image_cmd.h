// The CLI's image commands that need the daemon (docs/protocol/daemon.md): commit, image ls,
// image rm, image prune. Each writes its result to `out` and problems to `err`, and returns
// the process's exit code.
#pragma once

#include <functional>
#include <ostream>
#include <string>

#include "cli/client.h"

namespace trybox::cli {

int CmdCommit(Client& c, const std::string& vm, const std::string& name, bool json,
              std::ostream& out, std::ostream& err);
// Needs no daemon: without one serving this images directory it reads the directory.
int CmdImageLs(bool json, std::ostream& out, std::ostream& err);
int CmdImageRm(Client& c, const std::string& name, std::ostream& out, std::ostream& err);
// Removes the image's templates (every shape); prints each directory removed.
int CmdImageRmTemplate(Client& c, const std::string& name, std::ostream& out, std::ostream& err);
// Asks the user a yes/no question; empty when there is no terminal to ask on.
using PruneAsk = std::function<bool(const std::string& question)>;
// `image prune`: `dry_run` lists what would go; `all` removes the rootfs cache too,
// else `ask` (when set) decides, else it is kept and said so.
int CmdImagePrune(Client& c, bool dry_run, bool all, const PruneAsk& ask, bool json,
                  std::ostream& out, std::ostream& err);

}  // namespace trybox::cli
