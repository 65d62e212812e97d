// The "watch" request: changes under a directory, as they happen (inotify), until the host
// resets the stream. Protocol: docs/protocol/guest.md, "watch". The host decides who may
// watch what (it checks the account's access before it asks); the guest watches as root.
#pragma once

#include <nlohmann/json.hpp>

#include "channel/mux.h"

namespace trybox::guest {

// Directories one recursive watch follows at most (each is an inotify watch; the kernel's
// own default limit per user is 8192 or more).
inline constexpr size_t kMaxWatchedDirs = 4096;

// Serves one watch on `stream`: an EVENT {"type":"started","dirs":N} once the watches are
// in place, then one EVENT {"type":"fs","op":OP,"name":REL} per change (OP create, write,
// remove, rename, chmod; REL relative to the directory; "name_b64" instead of "name" for a
// name that is not UTF-8), {"type":"overflow"} when the kernel dropped events, until the
// host resets or ends the stream. ENDs with ok:false when it cannot start (not_found,
// not_a_directory, too_many_directories, ...) or when the directory itself goes (gone).
void ServeWatch(channel::Stream& stream, const nlohmann::json& request);

}  // namespace trybox::guest
