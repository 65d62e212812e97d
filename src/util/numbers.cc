#include "util/numbers.h"

#include <limits>

#include "util/names.h"

namespace trybox {
namespace {

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Digits to a value; false past `limit`.
bool DigitsToU64(std::string_view s, uint64_t limit, uint64_t* out) {
  uint64_t v = 0;
  for (char c : s) {
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (d > limit || v > (limit - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

}  // namespace

Result<int64_t> ParseBoundedInt(std::string_view text, int64_t min, int64_t max,
                                const std::string& what, const std::string& unit) {
  auto fail = [&] {
    return InvalidArgument(what + " must be a whole number from " + std::to_string(min) + " to " +
                           std::to_string(max) + (unit.empty() ? "" : " (" + unit + ")") +
                           ", got " + QuoteForMessage(text));
  };
  bool negative = min < 0 && !text.empty() && text[0] == '-';
  std::string_view digits = negative ? text.substr(1) : text;
  if (!AllDigits(digits)) return fail();
  uint64_t magnitude;
  // 2^63 is the magnitude of INT64_MIN; anything larger is out of range either way.
  if (!DigitsToU64(digits, uint64_t{1} << 63, &magnitude)) return fail();
  if (!negative && magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return fail();
  }
  int64_t v = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
  if (v < min || v > max) return fail();
  return v;
}

Result<int64_t> ParseSecondsToMs(std::string_view text, int64_t max_ms, const std::string& what) {
  auto fail = [&] {
    std::string max_s = std::to_string(max_ms / 1000);
    if (max_ms % 1000) max_s += "." + std::to_string(1000 + max_ms % 1000).substr(1);
    return InvalidArgument(what + " must be a number of seconds greater than 0 and at most " +
                           max_s + " (digits with an optional fraction, e.g. 2.5), got " +
                           QuoteForMessage(text));
  };
  size_t dot = text.find('.');
  std::string_view whole = text.substr(0, dot);
  std::string_view frac = dot == std::string_view::npos ? "" : text.substr(dot + 1);
  if (!AllDigits(whole) || (dot != std::string_view::npos && !AllDigits(frac))) return fail();
  uint64_t seconds;
  const uint64_t limit_s = static_cast<uint64_t>(max_ms) / 1000 + 1;
  if (!DigitsToU64(whole, limit_s, &seconds)) return fail();
  uint64_t ms = seconds * 1000;
  // Milliseconds from the first three decimals, plus one if anything non-zero follows.
  for (size_t i = 0; i < 3; ++i) {
    uint64_t d = i < frac.size() ? static_cast<uint64_t>(frac[i] - '0') : 0;
    ms += d * (i == 0 ? 100 : i == 1 ? 10 : 1);
  }
  if (frac.size() > 3 && frac.substr(3).find_first_not_of('0') != std::string_view::npos) ++ms;
  if (ms == 0 || ms > static_cast<uint64_t>(max_ms)) return fail();
  return static_cast<int64_t>(ms);
}

Result<uint64_t> ParseByteSize(std::string_view text, uint64_t min, uint64_t max,
                               const std::string& what) {
  auto fail = [&] {
    return InvalidArgument(
        what + " must be a size from " + std::to_string(min) + " to " + std::to_string(max) +
        " bytes, written as bytes or with K, M, G or T (1024-based), got " + QuoteForMessage(text));
  };
  size_t end = 0;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  std::string_view digits = text.substr(0, end), unit = text.substr(end);
  int shift = -1;
  if (unit.empty()) {
    shift = 0;
  } else if (unit == "K" || unit == "k" || unit == "KiB") {
    shift = 10;
  } else if (unit == "M" || unit == "MiB") {
    shift = 20;
  } else if (unit == "G" || unit == "GiB") {
    shift = 30;
  } else if (unit == "T" || unit == "TiB") {
    shift = 40;
  }
  uint64_t n;
  if (shift < 0 || !AllDigits(digits) || !DigitsToU64(digits, max >> shift, &n)) return fail();
  uint64_t bytes = n << shift;
  if (bytes < min || bytes > max) return fail();
  return bytes;
}

}  // namespace trybox
