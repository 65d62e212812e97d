// The version of this build: CMake's project version, plus the git commit it was built
// from when the source was a git checkout ("0.1.0 (3f2a9c1d0b7e)"). The same text in
// `trybox --version`, `trybox doctor`, `trybox daemon status` and MCP's serverInfo.
#pragma once

namespace trybox {

const char* Version();

}  // namespace trybox
