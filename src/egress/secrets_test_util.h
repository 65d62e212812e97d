// A check shared by the tests of memory that holds secrets (secrets_test.cc, agent's
// model_test.cc): which flags the kernel shows for the mapping holding an address.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

namespace trybox::egress {

// The VmFlags line of the mapping that holds `p`, from /proc/self/smaps; nullopt if no
// mapping holds it (" dd" in the line: left out of core dumps).
inline std::optional<std::string> VmFlagsOf(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_mapping = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {
      in_mapping = addr >= lo && addr < hi;
    } else if (in_mapping && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return std::nullopt;
}

}  // namespace trybox::egress
