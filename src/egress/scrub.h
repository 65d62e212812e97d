// Secret values taken back out of what a secret's host answers (docs/secrets.md, "What comes
// back"). The relay puts a secret's real value into requests; a host that reflects the request
// (a redirect repeating the path, a 404 page, an API error quoting a parameter, an echo
// endpoint) would hand it to the guest. A Scrubber finds every occurrence of a bound value in
// response text and writes the secret's placeholder instead:
//
//  - the value itself, or written with escapes, each byte as it came or escaped, in any mix:
//    percent-encoding (either hex case, once or twice: `%252F`), `+` for a space, JSON escapes
//    (`\uXXXX`, surrogate pairs, `\/` and the other one-letter escapes), HTML character references
//    (`&#NN;`,
//    `&#xHH;`, `&amp;` `&lt;` `&gt;` `&quot;` `&apos;`); ASCII letters compared without regard
//    to case (a host that changes a value's case has still handed it over);
//  - its base64 (standard or url-safe alphabet, with or without padding) at each of the three
//    byte alignments it can have inside a longer base64 run (`Basic` credentials,
//    `user:value`, a JWT-like blob), the base64 characters themselves read with the escapes
//    above (`\/`, `%2F`). Only for values of 3 bytes or more (fewer pins too few bits).
//
// An occurrence is replaced by the placeholder written the same way: percent-encoded (in the
// same hex case) if every byte was, `\u00XX` if every byte was, else as it is; a base64
// occurrence by the base64 of the placeholder at the same alignment, with the bits of the
// neighbouring bytes kept, so the run still decodes (to the placeholder). A placeholder has
// the value's length (values of 16 bytes or more), so a replacement is as long as what it
// replaces but for mixed escapes and short values; ScrubStream can make it so always.
//
// What it cannot find: a value the host transformed (hashed, reversed, encrypted, split with
// other bytes between its parts, escaped twice in any way but percent-encoding, hex-encoded).
// docs/secrets.md says so.
//
// ScrubStream does the same to a stream in pieces without holding it whole: it releases every
// byte that cannot be the start of an occurrence, so it holds back at most the longest
// encoded form of a value less one byte (11 bytes per value byte in the worst form, HTML
// references), and usually nothing.
//
// The patterns are never copied: matching reads each Secret's value from its own pages.
// Thread-safety: a Scrubber is immutable (shared read-only); a ScrubStream is one thread's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "egress/secrets.h"

namespace trybox::egress {

class Scrubber {
 public:
  Scrubber() = default;
  // The secrets whose values to take out (pointers into a SecretSet that outlives this).
  explicit Scrubber(std::vector<const Secret*> secrets);

  bool empty() const { return secrets_.empty(); }
  // The longest run of bytes one occurrence can take.
  size_t max_encoded() const { return max_encoded_; }

  // `text` with every occurrence replaced; `*replaced` (if given) counts them.
  std::string ScrubAll(std::string_view text, int* replaced = nullptr) const;

  // Scans `buf`: appends the bytes it can release to `out` (scrubbed) and returns how many
  // bytes of `buf` were consumed; with `eof` everything is. With `fit`, each replacement is
  // made exactly as long as the occurrence it replaces (cut, or lengthened with its own bytes
  // again), so that a body keeps its length. Adds the occurrences replaced to `*replaced`.
  size_t Scan(std::string_view buf, bool eof, bool fit, std::string* out, int* replaced) const;

 private:
  enum class Match { kNo, kPartial, kFull };
  // The longest occurrence that starts at `p` (kFull, its length and the replacement), or
  // whether one may start there once more bytes come (kPartial).
  Match At(std::string_view s, size_t p, bool eof, size_t* len, std::string* replacement) const;
  Match ValueAt(const Secret& sec, std::string_view s, size_t p, bool eof, size_t* len,
                std::string* replacement) const;
  Match Base64At(const Secret& sec, int align, std::string_view s, size_t p, bool eof, size_t* len,
                 std::string* replacement) const;

  std::vector<const Secret*> secrets_;
  size_t max_encoded_ = 0;
  bool start_[256] = {};  // bytes an occurrence of any value can start with
  // Per secret, which of its forms can start with each byte (bit 0: as text; 1 << (1 +
  // align): base64 at that alignment). Holds no more of a value than its first byte.
  std::vector<std::array<uint8_t, 256>> starts_;
};

class ScrubStream {
 public:
  // `fit`: every replacement as long as what it replaces (Scrubber::Scan), so the stream
  // keeps its length.
  ScrubStream(const Scrubber& s, bool fit) : s_(s), fit_(fit) {}
  ~ScrubStream();
  ScrubStream(const ScrubStream&) = delete;
  ScrubStream& operator=(const ScrubStream&) = delete;

  // Appends to `*out` what of the stream so far can be released.
  void Feed(std::string_view in, std::string* out);
  // The stream ended: appends the rest.
  void Finish(std::string* out);
  int replaced() const { return replaced_; }
  size_t held() const { return held_.size(); }

 private:
  const Scrubber& s_;
  const bool fit_;
  std::string held_;
  int replaced_ = 0;
};

}  // namespace trybox::egress
