// Where trybox keeps things, per user, following the XDG base directory spec.
//
//   images   $XDG_DATA_HOME/trybox/images      (~/.local/share/trybox/images)
//   state    $XDG_STATE_HOME/trybox            SQLite record, daemon log, probe result
//   cache    $XDG_CACHE_HOME/trybox            rootfs and kernel build cache
//   runtime  $XDG_RUNTIME_DIR/trybox           daemon socket, per-VM directories
//            (falls back to /tmp/trybox-UID when XDG_RUNTIME_DIR is unset)
//
// TRYBOX_HOME=DIR puts state, runtime and config under DIR (tests use it for isolation);
// TRYBOX_IMAGES and TRYBOX_CACHE override the image and cache directories on their own.
#pragma once

#include <string>

namespace trybox {

struct Paths {
  std::string images;
  std::string state;
  std::string cache;
  std::string runtime;
  std::string config;

  std::string socket() const { return runtime + "/tryboxd.sock"; }
  std::string db() const { return state + "/trybox.db"; }
  std::string vms() const { return runtime + "/vms"; }
  // Saved VM templates (docs/templates.md): derived data, rebuilt when missing.
  std::string templates() const { return state + "/templates"; }

  static Paths FromEnvironment();
};

}  // namespace trybox
