// Numbers typed by a person (command-line flags): parsed exactly, as 64-bit values, with
// explicit bounds. Anything else is refused with an error that names the flag, the allowed
// range and the text given: no sign where none is allowed, no spaces, no exponents, no
// "inf" or "nan", no silent wrap to 32 bits and no silent truncation of a fraction.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/status.h"

namespace trybox {

// A decimal integer in [min, max] (a leading '-' only when min < 0). `what` names the flag
// ("--memory") and `unit` the unit for the message ("MiB"; may be empty).
Result<int64_t> ParseBoundedInt(std::string_view text, int64_t min, int64_t max,
                                const std::string& what, const std::string& unit = "");

// A number of seconds, DIGITS[.DIGITS], greater than zero and at most `max_ms` milliseconds
// once converted, returned in milliseconds rounded up (so 0.0001 is 1 ms, never 0).
Result<int64_t> ParseSecondsToMs(std::string_view text, int64_t max_ms, const std::string& what);

// A size in bytes: DIGITS with an optional unit K, M, G or T (also KiB, MiB, GiB, TiB; k for
// K; powers of 1024), in [min, max] bytes once multiplied.
Result<uint64_t> ParseByteSize(std::string_view text, uint64_t min, uint64_t max,
                               const std::string& what);

}  // namespace trybox
