// A guest's identity: hostname, machine-id, boot_id, and its random and clock state.
//
// A cold-booted guest takes its identity from the kernel command line. A guest restored
// from a template starts as a byte-for-byte copy of every other clone, so the host sends
// an identity request first (docs/protocol/guest.md): it mixes fresh host entropy into
// the kernel pool and forces a reseed of the kernel CRNG, sets the wall clock (the
// template's clock is as old as the template), and writes the new names. Only then is
// boot_id read, which the kernel generates on first read: it is never read in a template.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace trybox::guest {

// Hostname used when the host named none (cmdline absent or invalid).
inline constexpr const char* kDefaultHostname = "trybox";

struct Identity {
  std::string vm_id;
  std::string hostname;       // ValidHostname()
  std::string machine_id;     // NormalizeMachineId(); empty: leave /etc/machine-id alone
  std::vector<uint8_t> seed;  // host entropy; empty: no reseed (cold boot)
  int64_t time_ns = 0;        // host CLOCK_REALTIME; 0: leave the clock alone
};

// sethostname, /etc/hostname, /etc/hosts (127.0.1.1 NAME when absent), /etc/machine-id.
// Logs and goes on past a file it cannot write; a failed sethostname is an error.
Status SetNames(const std::string& hostname, const std::string& machine_id);

// Adds `seed` to the input pool (RNDADDENTROPY, credited) and forces a CRNG reseed
// (RNDRESEEDCRNG), so every read from /dev/urandom afterwards depends on it.
Status ReseedRandom(const std::vector<uint8_t>& seed);

// Microseconds each step took (CLOCK_MONOTONIC), for the host's benchmarks.
struct IdentityTimings {
  int64_t reseed_us = 0, clock_us = 0, names_us = 0;
};

// Applies the whole identity: reseed, clock, names. Stops at the first failure.
Status ApplyIdentity(const Identity& id, IdentityTimings* timings = nullptr);

// Sets the wall clock to the host's `time_ns` and returns how far the guest's clock was from
// it just before (host minus guest, ns): a spare that got its identity earlier is set again
// when it is handed out.
Result<int64_t> SetClock(int64_t time_ns);

// /proc/sys/kernel/random/boot_id, trimmed. The first read generates it.
Result<std::string> ReadBootId();

}  // namespace trybox::guest
