// Byte strings in JSON. nlohmann::json::dump throws on a string that is not valid UTF-8, and
// names from a guest (file names, tar members, symlink targets) are arbitrary bytes. These
// helpers make any byte string safe to dump, and carry it exactly where it must round-trip:
//
//   "path": the name itself when it is valid UTF-8; otherwise a display form in which each
//           byte that is not part of a valid UTF-8 sequence is written as the four characters
//           \xNN (lowercase hex);
//   "path_b64": present only in the second case: the exact bytes, standard base64 (RFC 4648,
//           with padding). When present it is the value; "path" is then for display only.
//
// Format: docs/workspace.md ("Names in JSON"). Plain functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "util/status.h"

namespace trybox {

// The length of the longest prefix of `s` that does not end inside a UTF-8 sequence: a reader
// of a stream sends that much and keeps the rest for the next read, so that a character split
// between two reads goes out whole.
size_t WholeUtf8Prefix(std::string_view s);

// Strict UTF-8 as nlohmann::json checks it on dump: no overlong forms, no surrogates, nothing
// past U+10FFFF, no truncated sequences.
bool IsValidUtf8(std::string_view s);

// `s` unchanged if it is valid UTF-8; otherwise each byte that is not part of a valid
// sequence becomes "\xNN". The result is always valid UTF-8, so it always dumps.
std::string JsonSafe(std::string_view s);

// obj[key] = JsonSafe(bytes), and obj[key + "_b64"] = base64(bytes) when `bytes` is not valid
// UTF-8 (any stale "_b64" field is removed otherwise).
void SetBytesField(nlohmann::json& obj, const std::string& key, std::string_view bytes);

// The exact bytes of a field written by SetBytesField: key + "_b64" if present, else key.
// kInvalidArgument when the field is missing, not a string, or not valid base64.
Result<std::string> GetBytesField(const nlohmann::json& obj, const std::string& key);

std::string Base64Encode(std::string_view bytes);
// Strict: standard alphabet, padding required, no whitespace.
Result<std::string> Base64Decode(std::string_view text);

// Two lowercase hex digits per byte.
std::string HexEncode(std::string_view bytes);
// Hex digits (either case, an even number of them) back into bytes; nullopt otherwise.
std::optional<std::string> HexDecode(std::string_view hex);

// `s` made safe to print as (part of) one line of text, in a log, a commit message or on a
// terminal: JsonSafe (each byte of invalid UTF-8 as \xNN), then every character that could
// end a line, move the cursor, start an escape sequence or reorder the text (C0 and C1
// controls but tab, ESC and DEL included, U+2028/U+2029, bidi embeddings, overrides,
// isolates and marks) written as \u{XXXX}; ordinary UTF-8 is kept. The one escaping function
// for every string from a guest (or a model) that trybox itself prints: file names in diff,
// collect and cp messages, audit hosts, ps commands, image names, error messages
// (docs/security.md, "What the CLI prints").
std::string OneLine(std::string_view s);

// json.dump() that never throws: a string that is not valid UTF-8 (one that did not go
// through the helpers above) has its bad bytes replaced by U+FFFD instead.
std::string SafeDump(const nlohmann::json& j, int indent = -1);

}  // namespace trybox
