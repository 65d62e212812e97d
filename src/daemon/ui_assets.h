// The dashboard's files (ui/), compiled into tryboxd by cmake/embed_ui.cmake
// (docs/dashboard.md). TRYBOX_UI_DIR, when set in the daemon's environment, serves them from
// that directory instead, read at each request: for working on the pages without a rebuild.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>

namespace trybox::daemon {

struct UiAsset {
  const char* name;  // relative to ui/: "app.js", "pages/vm.js"
  const unsigned char* data;
  size_t size;
};

// Every file of ui/ as built.
std::span<const UiAsset> EmbeddedUiAssets();

struct UiFile {
  std::string content_type;
  std::string body;
};

// The file `name` (relative to ui/: "index.html", "pages/vm.js"), from TRYBOX_UI_DIR when
// set, else as built; nothing for a name that is not a served file (only .html, .js and .css
// files, no "..", no hidden names).
std::optional<UiFile> FindUiFile(const std::string& name);

}  // namespace trybox::daemon
