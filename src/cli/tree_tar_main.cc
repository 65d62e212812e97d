// trybox-tar: the tar stream of a directory tree for `trybox cp`, made from a tree on the
// host or unpacked into one, in a process of its own (cli/tree_tar.h says why). Started by
// the CLI only, which reads the verdict from stderr.
//
// Usage: trybox-tar pack DIR     the tree at DIR as a tar, on stdout
//        trybox-tar unpack DIR   a tar from stdin, into the existing directory DIR
// Exit 0 when done; 1 with the line "trybox-tar: CODE<TAB>message" on stderr; 2 for a usage
// error.
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <iostream>

#include "cli/tree_tar.h"
#include "util/fd.h"

namespace {

int Fail(const trybox::Status& st) {
  std::cerr << trybox::cli::TreeTarFailureLine(st);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The CLI asked for SIGKILL when it dies (SpawnOptions::die_with_parent); a CLI that stops
  // reading is an error here, not a signal.
  ::signal(SIGPIPE, SIG_IGN);
  if (argc != 3 || (std::strcmp(argv[1], "pack") != 0 && std::strcmp(argv[1], "unpack") != 0)) {
    std::cerr << "usage: trybox-tar pack DIR | trybox-tar unpack DIR (started by trybox cp)\n";
    return 2;
  }
  const std::string dir = argv[2];
  if (std::strcmp(argv[1], "pack") == 0) {
    if (::chdir(dir.c_str()) != 0) return Fail(trybox::ErrnoError(dir));
    trybox::Status st = trybox::cli::PackWorkingDirectory(
        [](std::string_view data) { return trybox::WriteFull(1, data); });
    return st.ok() ? 0 : Fail(st);
  }
  std::string buf(1 << 20, '\0');
  trybox::Status st = trybox::cli::ExtractTarSafely(
      [&]() -> trybox::Result<std::string> {
        ASSIGN_OR_RETURN(size_t n, trybox::ReadSome(0, buf.data(), buf.size()));
        return buf.substr(0, n);
      },
      dir);
  return st.ok() ? 0 : Fail(st);
}
