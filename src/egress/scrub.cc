#include "egress/scrub.h"

#include <string.h>

#include <algorithm>
#include <array>
#include <cstdint>

namespace trybox::egress {
namespace {

// The longest escape one byte can be written as: "&#x" + 7 hex digits + ";".
constexpr size_t kMaxEscape = 11;
constexpr size_t kMaxRefDigits = 7;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One decoded unit: up to 4 bytes (a code point's UTF-8) from `consumed` escaped bytes.
struct Unit {
  unsigned char b[4];
  size_t n = 0;
  size_t consumed = 0;
};

bool PutUtf8(uint32_t cp, Unit* u) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  if (cp < 0x80) {
    u->b[0] = static_cast<unsigned char>(cp);
    u->n = 1;
  } else if (cp < 0x800) {
    u->b[0] = static_cast<unsigned char>(0xC0 | (cp >> 6));
    u->b[1] = static_cast<unsigned char>(0x80 | (cp & 0x3F));
    u->n = 2;
  } else if (cp < 0x10000) {
    u->b[0] = static_cast<unsigned char>(0xE0 | (cp >> 12));
    u->b[1] = static_cast<unsigned char>(0x80 | ((cp >> 6) & 0x3F));
    u->b[2] = static_cast<unsigned char>(0x80 | (cp & 0x3F));
    u->n = 3;
  } else {
    u->b[0] = static_cast<unsigned char>(0xF0 | (cp >> 18));
    u->b[1] = static_cast<unsigned char>(0x80 | ((cp >> 12) & 0x3F));
    u->b[2] = static_cast<unsigned char>(0x80 | ((cp >> 6) & 0x3F));
    u->b[3] = static_cast<unsigned char>(0x80 | (cp & 0x3F));
    u->n = 4;
  }
  return true;
}

enum Esc { kNone = 0, kGot = 1, kShort = -1 };

// `n` hex digits at s[q..]: kGot with the number, kShort if the buffer ends first with only
// hex digits so far (and more may come), kNone otherwise.
Esc Hex(std::string_view s, size_t q, size_t n, bool eof, uint32_t* v) {
  *v = 0;
  for (size_t i = 0; i < n; ++i) {
    if (q + i >= s.size()) return eof ? kNone : kShort;
    int d = HexDigit(s[q + i]);
    if (d < 0) return kNone;
    *v = *v * 16 + static_cast<uint32_t>(d);
  }
  return kGot;
}

// "\uXXXX" at s[q] (the backslash), a surrogate pair taken whole.
Esc JsonU(std::string_view s, size_t q, bool eof, Unit* u) {
  uint32_t hi;
  Esc e = Hex(s, q + 2, 4, eof, &hi);
  if (e != kGot) return e;
  if (hi >= 0xDC00 && hi <= 0xDFFF) return kNone;
  if (hi < 0xD800 || hi > 0xDBFF) {
    u->consumed = 6;
    return PutUtf8(hi, u) ? kGot : kNone;
  }
  for (size_t i = 0; i < 2; ++i) {
    if (q + 6 + i >= s.size()) return eof ? kNone : kShort;
    if (s[q + 6 + i] != "\\u"[i]) return kNone;
  }
  uint32_t lo;
  e = Hex(s, q + 8, 4, eof, &lo);
  if (e != kGot) return e;
  if (lo < 0xDC00 || lo > 0xDFFF) return kNone;
  u->consumed = 12;
  return PutUtf8(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00), u) ? kGot : kNone;
}

// "&#NN;", "&#xHH;" or one of five named references at s[q] (the ampersand).
Esc HtmlRef(std::string_view s, size_t q, bool eof, Unit* u) {
  size_t i = q + 1;
  if (i >= s.size()) return eof ? kNone : kShort;
  if (s[i] != '#') {
    static constexpr std::pair<std::string_view, char> kNamed[] = {
        {"amp;", '&'}, {"lt;", '<'}, {"gt;", '>'}, {"quot;", '"'}, {"apos;", '\''}};
    std::string_view rest = s.substr(i);
    for (const auto& [name, c] : kNamed) {
      if (rest.substr(0, name.size()) == name) {
        u->b[0] = static_cast<unsigned char>(c);
        u->n = 1;
        u->consumed = 1 + name.size();
        return kGot;
      }
    }
    if (eof) return kNone;
    for (const auto& [name, c] : kNamed) {
      if (rest.size() < name.size() && name.substr(0, rest.size()) == rest) return kShort;
    }
    return kNone;
  }
  ++i;
  if (i >= s.size()) return eof ? kNone : kShort;
  bool hex = s[i] == 'x' || s[i] == 'X';
  if (hex) ++i;
  uint32_t cp = 0;
  size_t digits = 0;
  for (;; ++i) {
    if (i >= s.size()) return eof ? kNone : kShort;
    char c = s[i];
    if (c == ';') break;
    int d = hex ? HexDigit(c) : (c >= '0' && c <= '9' ? c - '0' : -1);
    if (d < 0 || ++digits > kMaxRefDigits) return kNone;
    cp = cp * (hex ? 16 : 10) + static_cast<uint32_t>(d);
  }
  if (digits == 0) return kNone;
  u->consumed = i + 1 - q;
  return PutUtf8(cp, u) ? kGot : kNone;
}

bool MayEscape(char c) { return c == '%' || c == '+' || c == '&' || c == '\\'; }

// The escape at s[q], if there is one.
Esc Escape(std::string_view s, size_t q, bool eof, Unit* u) {
  char c = s[q];
  if (!MayEscape(c)) return kNone;
  if (c == '%') {
    uint32_t v;
    Esc e = Hex(s, q + 1, 2, eof, &v);
    if (e != kGot) return e;
    u->b[0] = static_cast<unsigned char>(v);
    u->n = 1;
    u->consumed = 3;
    if (v != '%') return kGot;
    // "%25XX": percent-encoded twice, as a URL is when it rides in another's query (a login
    // redirect's next=).
    uint32_t twice;
    e = Hex(s, q + 3, 2, eof, &twice);
    if (e == kShort) return kShort;
    if (e == kGot) {
      u->b[0] = static_cast<unsigned char>(twice);
      u->consumed = 5;
    }
    return kGot;
  }
  if (c == '+') {
    u->b[0] = ' ';
    u->n = 1;
    u->consumed = 1;
    return kGot;
  }
  if (c == '&') return HtmlRef(s, q, eof, u);
  if (c != '\\') return kNone;
  if (q + 1 >= s.size()) return eof ? kNone : kShort;
  char n = s[q + 1];
  if (n == 'u') return JsonU(s, q, eof, u);
  static constexpr std::string_view kFrom = "/\"\\bfnrt", kTo = "/\"\\\b\f\n\r\t";
  size_t at = kFrom.find(n);
  if (at == std::string_view::npos) return kNone;
  u->b[0] = static_cast<unsigned char>(kTo[at]);
  u->n = 1;
  u->consumed = 2;
  return kGot;
}

bool SameByte(unsigned char a, unsigned char b) {
  if (a == b) return true;
  unsigned char la = a | 0x20;
  return la == (b | 0x20) && la >= 'a' && la <= 'z';
}

// A base64 character's 6 bits, either alphabet; -1 for any other byte.
int Sextet(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}

constexpr char kStd[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr char kUrl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

// Bits of a base64 run from byte-aligned alignment `align` (0..2): the value's bits start at
// bit `lead` of the first character that holds any of them.
size_t Lead(int align) { return static_cast<size_t>(8 * align) % 6; }

// Which bits of character `j` of an occurrence at `lead` the value fixes (care) and to what.
void Want(std::string_view v, size_t lead, size_t j, int* want, int* care) {
  // The common case: all six bits inside the value, read from the two bytes that hold them.
  const size_t first = 6 * j;
  if (first >= lead && first - lead + 6 <= 8 * v.size()) {
    const size_t bit = first - lead, byte = bit / 8;
    unsigned w = static_cast<unsigned>(static_cast<unsigned char>(v[byte])) << 8;
    if (byte + 1 < v.size()) w |= static_cast<unsigned char>(v[byte + 1]);
    *want = static_cast<int>((w >> (10 - bit % 8)) & 63);
    *care = 63;
    return;
  }
  *want = 0;
  *care = 0;
  const size_t end = lead + 8 * v.size();
  for (size_t t = 0; t < 6; ++t) {
    size_t bit = 6 * j + t;
    if (bit < lead || bit >= end) continue;
    size_t vb = bit - lead;
    int b = (static_cast<unsigned char>(v[vb / 8]) >> (7 - vb % 8)) & 1;
    *want |= b << (5 - t);
    *care |= 1 << (5 - t);
  }
}

size_t Base64Chars(size_t value_size, int align) { return (Lead(align) + 8 * value_size + 5) / 6; }

constexpr size_t kMinBase64Value = 3;

}  // namespace

Scrubber::Scrubber(std::vector<const Secret*> secrets) : secrets_(std::move(secrets)) {
  starts_.resize(secrets_.size());
  for (size_t i = 0; i < secrets_.size(); ++i) {
    std::array<uint8_t, 256>& m = starts_[i];
    m.fill(0);
    std::string_view v = secrets_[i]->value.view();
    if (v.empty()) continue;
    // Bit 0: the value as text may start with the byte; bit 1 + align: its base64.
    for (unsigned char c : std::string_view("%+&\\")) m[c] = 0x0F;
    auto first = static_cast<unsigned char>(v[0]);
    m[first] |= 1;
    if ((first | 0x20) >= 'a' && (first | 0x20) <= 'z') {
      m[first | 0x20] |= 1;
      m[first & ~0x20] |= 1;
    }
    size_t longest = v.size();
    if (v.size() >= kMinBase64Value) {
      for (int align = 0; align < 3; ++align) {
        int want, care;
        Want(v, Lead(align), 0, &want, &care);
        for (int x = 0; x < 64; ++x) {
          if ((x & care) != want) continue;
          m[static_cast<unsigned char>(kStd[x])] |= static_cast<uint8_t>(2 << align);
          m[static_cast<unsigned char>(kUrl[x])] |= static_cast<uint8_t>(2 << align);
        }
        longest = std::max(longest, Base64Chars(v.size(), align));
      }
    }
    for (int c = 0; c < 256; ++c) start_[c] = start_[c] || m[c] != 0;
    max_encoded_ = std::max(max_encoded_, kMaxEscape * longest);
  }
}

Scrubber::Match Scrubber::ValueAt(const Secret& sec, std::string_view s, size_t p, bool eof,
                                  size_t* len, std::string* replacement) const {
  std::string_view v = sec.value.view();
  size_t i = 0, q = p;
  // How every byte was written, if all alike: the placeholder is written the same way.
  enum Style { kUnset, kRaw, kPercent, kJson, kMixed } style = kUnset;
  bool lower_hex = false;
  auto saw = [&](Style st) { style = style == kUnset || style == st ? st : kMixed; };
  while (i < v.size()) {
    if (q >= s.size()) return eof ? Match::kNo : Match::kPartial;
    Unit u;
    Esc e = Escape(s, q, eof, &u);
    if (e == kShort) return Match::kPartial;
    if (e == kGot && u.n <= v.size() - i) {
      bool same = u.n == 1 ? SameByte(u.b[0], static_cast<unsigned char>(v[i]))
                           : memcmp(u.b, v.data() + i, u.n) == 0;
      if (same) {
        if (s[q] == '%' && u.consumed == 3) {
          saw(kPercent);
          lower_hex = lower_hex || (s[q + 1] >= 'a' && s[q + 1] <= 'f') ||
                      (s[q + 2] >= 'a' && s[q + 2] <= 'f');
        } else if (s[q] == '\\' && u.consumed == 6) {
          saw(kJson);
        } else {
          saw(kMixed);
        }
        i += u.n;
        q += u.consumed;
        continue;
      }
    }
    if (!SameByte(static_cast<unsigned char>(s[q]), static_cast<unsigned char>(v[i]))) {
      return Match::kNo;
    }
    saw(kRaw);
    ++i;
    ++q;
  }
  *len = q - p;
  replacement->clear();
  const char* hex = lower_hex ? "0123456789abcdef" : "0123456789ABCDEF";
  for (char c : sec.placeholder) {
    auto b = static_cast<unsigned char>(c);
    if (style == kPercent) {
      replacement->append({'%', hex[b >> 4], hex[b & 15]});
    } else if (style == kJson) {
      replacement->append({'\\', 'u', '0', '0', hex[b >> 4], hex[b & 15]});
    } else {
      replacement->push_back(c);
    }
  }
  return Match::kFull;
}

Scrubber::Match Scrubber::Base64At(const Secret& sec, int align, std::string_view s, size_t p,
                                   bool eof, size_t* len, std::string* replacement) const {
  std::string_view v = sec.value.view();
  const size_t lead = Lead(align);
  const size_t chars = Base64Chars(v.size(), align);
  size_t q = p;
  bool url = false;
  int first = 0, last = 0;
  for (size_t j = 0; j < chars; ++j) {
    if (q >= s.size()) return eof ? Match::kNo : Match::kPartial;
    int want, care;
    Want(v, lead, j, &want, &care);
    Unit u;
    Esc e = Escape(s, q, eof, &u);
    if (e == kShort) return Match::kPartial;
    int x = -1;
    unsigned char c = 0;
    if (e == kGot && u.n == 1 && (x = Sextet(u.b[0])) >= 0 && (x & care) == want) {
      c = u.b[0];
      q += u.consumed;
    } else if ((x = Sextet(static_cast<unsigned char>(s[q]))) >= 0 && (x & care) == want) {
      c = static_cast<unsigned char>(s[q]);
      ++q;
    } else {
      return Match::kNo;
    }
    url = url || c == '-' || c == '_';
    if (j == 0) first = x;
    last = x;
  }
  *len = q - p;
  // The placeholder at the same alignment, the neighbours' bits kept where they fit.
  std::string_view ph = sec.placeholder;
  const size_t trail = 6 * chars - lead - 8 * v.size();
  const bool keep_trail = ph.size() == v.size();
  const char* alphabet = url ? kUrl : kStd;
  replacement->clear();
  uint32_t acc = 0;
  size_t nbits = 0;
  auto put = [&](uint32_t bits, size_t n) {
    acc = (acc << n) | (bits & ((1u << n) - 1));
    nbits += n;
    while (nbits >= 6) {
      replacement->push_back(alphabet[(acc >> (nbits - 6)) & 63]);
      nbits -= 6;
    }
  };
  if (lead > 0) put(static_cast<uint32_t>(first) >> (6 - lead), lead);
  for (char c : ph) put(static_cast<unsigned char>(c), 8);
  if (keep_trail && trail > 0) put(static_cast<uint32_t>(last), trail);
  if (nbits > 0) put(0, 6 - nbits);
  return Match::kFull;
}

Scrubber::Match Scrubber::At(std::string_view s, size_t p, bool eof, size_t* len,
                             std::string* replacement) const {
  bool partial = false;
  size_t best = 0;
  std::string b64;
  const auto c = static_cast<unsigned char>(s[p]);
  for (size_t i = 0; i < secrets_.size(); ++i) {
    const uint8_t may = starts_[i][c];
    if (may == 0) continue;
    const Secret* sec = secrets_[i];
    size_t n = 0;
    Match m = Match::kNo;
    if (may & 1) m = ValueAt(*sec, s, p, eof, &n, &b64);
    if (m == Match::kPartial) partial = true;
    if (m == Match::kFull && n > best) {
      best = n;
      replacement->swap(b64);
    }
    for (int align = 0; align < 3; ++align) {
      if ((may & (2 << align)) == 0) continue;
      m = Base64At(*sec, align, s, p, eof, &n, &b64);
      if (m == Match::kPartial) partial = true;
      if (m == Match::kFull && n > best) {
        best = n;
        replacement->swap(b64);
      }
    }
  }
  if (partial) return Match::kPartial;
  if (best == 0) return Match::kNo;
  *len = best;
  return Match::kFull;
}

// `rep` made exactly `len` bytes: cut, or lengthened with its own bytes again.
static void Fit(std::string* rep, size_t len) {
  if (rep->size() >= len || rep->empty()) {
    rep->resize(len);
    return;
  }
  for (size_t i = 0; rep->size() < len; ++i) rep->push_back((*rep)[i]);
}

size_t Scrubber::Scan(std::string_view buf, bool eof, bool fit, std::string* out,
                      int* replaced) const {
  if (secrets_.empty()) {
    out->append(buf);
    return buf.size();
  }
  size_t emitted = 0, p = 0;
  std::string rep;
  while (p < buf.size()) {
    if (!start_[static_cast<unsigned char>(buf[p])]) {
      ++p;
      continue;
    }
    size_t len = 0;
    Match m = At(buf, p, eof, &len, &rep);
    if (m == Match::kPartial) break;
    if (m == Match::kNo) {
      ++p;
      continue;
    }
    out->append(buf.substr(emitted, p - emitted));
    if (fit) Fit(&rep, len);
    out->append(rep);
    if (replaced) ++*replaced;
    p += len;
    emitted = p;
  }
  out->append(buf.substr(emitted, p - emitted));
  return p;
}

std::string Scrubber::ScrubAll(std::string_view text, int* replaced) const {
  std::string out;
  out.reserve(text.size());
  int n = 0;
  Scan(text, true, false, &out, &n);
  if (replaced) *replaced += n;
  return out;
}

ScrubStream::~ScrubStream() {
  if (!held_.empty()) ::explicit_bzero(held_.data(), held_.size());
}

void ScrubStream::Feed(std::string_view in, std::string* out) {
  if (held_.empty()) {
    size_t n = s_.Scan(in, false, fit_, out, &replaced_);
    held_.assign(in.substr(n));
    return;
  }
  held_.append(in);
  size_t n = s_.Scan(held_, false, fit_, out, &replaced_);
  held_.erase(0, n);
}

void ScrubStream::Finish(std::string* out) {
  s_.Scan(held_, true, fit_, out, &replaced_);
  ::explicit_bzero(held_.data(), held_.size());
  held_.clear();
}

}  // namespace trybox::egress
