// The tar streams of `trybox cp` for directory trees, made and unpacked by `trybox-tar`
// (cli/tree_tar_main.cc), a process of its own beside the CLI.
//
// Why a process: libarchive and what it brings (libxml2, ICU, nettle, five compressors) cost
// every command of the CLI about 3 ms to map before main, and only a copy of a tree uses
// them (docs/performance.md, "The CLI's start"). A tree from a guest is hostile, so
// unpacking it where nothing else of the CLI runs is no loss either.
//
// The CLI's side, StartTreeTar and FinishTreeTar, talks to the helper over a socket pair on
// its stdin or stdout (send with MSG_NOSIGNAL: a helper that died is an error, never a
// SIGPIPE) and reads its verdict from stderr: exit 0, or 1 with the last line
// "trybox-tar: CODE<TAB>message" (CODE as util/status.h's CodeName), so that a refused
// entry stays kPermissionDenied across the process boundary.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>

#include "util/fd.h"
#include "util/process.h"
#include "util/status.h"

namespace trybox::cli {

// Writes the tree at the working directory as a tar (pax) whose entries are relative to it
// ("./NAME"), through `write`. Symbolic links travel as links; extended attributes are not
// read. (The helper changes into the tree first: libarchive names entries as it opened them.)
Status PackWorkingDirectory(const std::function<Status(std::string_view)>& write);

// Unpacks a tar stream (from `next_chunk`, which returns "" at the end) into `dest`, by the
// rules of workspace::ExtractTar. Devices, fifos and sockets are skipped; an entry that
// tried to leave the tree is an error (kPermissionDenied, "refusing tar entry ..."), and it
// was not written.
Status ExtractTarSafely(const std::function<Result<std::string>()>& next_chunk,
                        const std::string& dest);

// A running `trybox-tar`. `verb` is "pack" (its stdout is `io`: read the tar from it) or
// "unpack" (its stdin is `io`: write the tar to it, then close it).
struct TreeTar {
  ChildProcess child;
  UniqueFd io;
  UniqueFd err;
};
Result<TreeTar> StartTreeTar(const std::string& verb, const std::string& dir);
// Waits for the helper and turns its verdict into a Status (closes `io` first).
Status FinishTreeTar(TreeTar& t);

// The permission bits a file or directory from a guest may keep on the host: never group or
// other write (a guest's 0666 file or 1777 directory must not land writable by every user
// of the host, in a directory root owns), and nothing the process's umask takes away either.
// `umask` is the process's umask as read from /proc/self/status (read without changing it;
// umask(2) cannot be read without setting it, which would race with other threads).
mode_t GuestPermissionMask();
mode_t GuestPermissionMask(mode_t umask);

// The helper's side of the verdict: the line FinishTreeTar reads back.
std::string TreeTarFailureLine(const Status& st);

}  // namespace trybox::cli
