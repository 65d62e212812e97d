// Debian packages for a recipe, fetched on the host (docs/images.md, "Recipes"): apt
// resolves them against the guest's own dpkg status and downloads the signed .debs from the
// host's apt sources, exactly as the base build does with mmdebstrap. Nothing here runs a
// package's scripts: the .debs are installed inside the build VM.
//
// State: lists and downloaded .debs are kept under CACHE/apt (a warm cache makes the next
// build download nothing); everything else of one resolution lives in a private temporary
// directory. Thread-safety: one fetch per cache at a time (apt locks are off: the CLI's
// image lock serialises builds).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "util/status.h"

namespace trybox::image {

struct DebToInstall {
  std::string package;
  std::string version;
  std::string arch;
  std::string file;  // the .deb's file name as apt stores it in archives/
};

// The packages `apt-get -s install` would install ("Inst NAME [OLD] (VERSION REPO [ARCH])"
// lines), in apt's order. Other lines are ignored; a malformed Inst line is an error.
Result<std::vector<DebToInstall>> ParseAptSimulation(const std::string& output);

struct FetchDebsOptions {
  std::vector<std::string> packages;
  std::string suite;        // of the base: "bookworm"
  std::string dpkg_status;  // a copy of the guest's /var/lib/dpkg/status
  std::string cache_dir;    // Paths::cache
  std::string apt_dir = "/etc/apt";
  std::function<void(const std::string&)> progress;
};

struct FetchedDebs {
  std::vector<DebToInstall> debs;
  std::string archives;  // the directory holding them
};

// apt-get update (into CACHE/apt/lists), a simulated install against `dpkg_status`, and a
// download-only install. Nothing to install is an empty list. Errors carry apt's output tail.
Result<FetchedDebs> FetchDebs(const FetchDebsOptions& opts);

}  // namespace trybox::image
