// Text from the untrusted side (guest output, model text, names the model chose), made safe
// to hold in JSON and to show inside a report.
#pragma once

#include <string>
#include <string_view>

namespace trybox::agent {

// Valid UTF-8: each invalid byte becomes U+FFFD. JSON cannot carry anything else.
std::string SanitizeUtf8(std::string_view s);

// At most `max` bytes of `s` (valid UTF-8 in, valid UTF-8 out), keeping the head and the
// tail and marking what was dropped: "[... 12345 bytes omitted ...]". `*truncated` (if
// given) says whether anything was dropped.
std::string CapMiddle(std::string_view s, size_t max, bool* truncated = nullptr);
// The last `max` bytes, cut at a character boundary, marked "[... N bytes before ...]".
std::string CapTail(std::string_view s, size_t max, bool* truncated = nullptr);
// The first `max` bytes, cut at a character boundary; `*truncated` says if anything was cut.
std::string CapHead(std::string_view s, size_t max, bool* truncated = nullptr);

// The first `max_chars` characters (code points) of `s`, sanitised.
std::string CapChars(std::string_view s, size_t max_chars, bool* truncated = nullptr);

// One line, safe to print after a trusted label: a JSON string literal (quotes included), so
// a newline, a carriage return, an escape sequence or a Unicode line separator is shown
// escaped and can never start a line of its own. Capped at `max` bytes of input.
std::string InlineQuote(std::string_view s, size_t max = 400);

// A block of untrusted text for a report: each line prefixed with `prefix`, and every
// character that could move the cursor, end a line or reorder text (C0/C1 controls except
// tab, DEL, U+2028/U+2029, bidi overrides and isolates, zero-width joiners) shown as \u{XXXX}.
// Ends with a newline. An empty input gives one prefixed empty line.
std::string QuoteBlock(std::string_view s, std::string_view prefix);

}  // namespace trybox::agent
