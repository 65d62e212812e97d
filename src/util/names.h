// Validation of names that become paths or identifiers (VM ids, image names).
// Names are rejected, never sanitised: a name that needs fixing is the caller's error.
#pragma once

#include <string>
#include <string_view>

#include "util/status.h"

namespace trybox {

// OK if `name` is 1..64 characters of [A-Za-z0-9_-] and does not start with '-' (so that no
// name can be taken for an option on a child's command line). `what` ("image name", "VM id") leads
// the error text, which quotes the offending name with non-printable bytes escaped.
Status ValidateName(std::string_view what, std::string_view name);

// Quotes `s` for an error message: printable ASCII kept, everything else as \xNN; capped.
std::string QuoteForMessage(std::string_view s, size_t max = 80);

// 12 lowercase hex characters from the kernel's CSPRNG.
std::string NewId();

// `n` random bytes as 2n lowercase hex digits, from getrandom(2).
std::string RandomHex(size_t n);

}  // namespace trybox
