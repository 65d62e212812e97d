// `trybox prune` and the store's lines in `trybox doctor` (docs/store.md, "Retention").
#pragma once

#include <iosfwd>
#include <string>

#include "cli/client.h"
#include "cli/reply.h"

namespace trybox::cli {

// `trybox prune [--dry-run] [--json]`: what the retention freed (or would free).
int CmdPrune(Client& client, bool dry_run, bool json, std::ostream& out, std::ostream& err);
// The text of a prune reply's `pruned` object.
Result<std::string> RenderPrune(const ReplyView& pruned);
// doctor's `store` object as lines of text.
Result<std::string> RenderStoreHealth(const ReplyView& store);

}  // namespace trybox::cli
