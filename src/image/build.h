// Pieces of BuildImage (image.h) that touch the host, exposed for tests.
#pragma once

#include <string>
#include <vector>

#include "util/status.h"

namespace trybox::image {

struct AptSources {
  std::string path;
  std::string content;
};

// The host's apt sources file that serves `suite`, to hand to mmdebstrap whole (so the
// guest gets the same mirror, plus the updates and security entries beside it). Searches
// APT_DIR/sources.list.d/ in name order, reading only *.sources (deb822: a stanza with
// Types "deb" whose Suites include `suite`) and *.list (one-line: "deb ... URI SUITE ..."),
// then APT_DIR/sources.list. kNotFound if none mentions the suite.
Result<AptSources> FindAptSources(const std::string& apt_dir, const std::string& suite);

// Removes leftovers of builds whose process is gone: DIR/.build-NAME-PID and
// DIR/.old-NAME-PID (images_root), DIR/rootfs-PID-* and DIR/scratch-PID-* (cache tmp).
// A directory with something still mounted under it (an interrupted mmdebstrap) is left
// alone with a warning rather than recursed into. Returns the paths removed.
std::vector<std::string> RemoveStaleBuilds(const std::string& dir);

}  // namespace trybox::image
