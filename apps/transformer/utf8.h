// apps/transformer: UTF-8 as the tokenizers read and write it: encoding a code point, stepping
// over a well-formed sequence, and the unit an ill-formed one is replaced by (one U+FFFD per
// maximal ill-formed part, as Unicode recommends and `tokenizers` does).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace weft::apps::utf8 {

inline void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6)), out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3f)), out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f)), out += char(0x80 | (cp & 0x3f));
  }
}

// The length of the sequence a lead byte starts (1 for a stray continuation byte).
inline size_t length(char lead) {
  const auto b = uint8_t(lead);
  return b < 0xc0 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
}

// Decodes one sequence at s[i] (well-formed input), advancing i.
inline uint32_t next(std::string_view s, size_t& i) {
  const auto b = uint8_t(s[i]);
  const size_t len = length(s[i]);
  uint32_t cp = len == 1 ? b : len == 2 ? b & 0x1f : len == 3 ? b & 0x0f : b & 0x07;
  for (size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3f);
  i += len;
  return cp;
}

// Length of the well-formed sequence at s[i], or of its maximal ill-formed prefix negated (at
// least one byte): the unit that is replaced by one U+FFFD.
inline int unit(std::string_view s, size_t i) {
  const auto b = uint8_t(s[i]);
  if (b < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xbf;
  if (b >= 0xc2 && b <= 0xdf) len = 2;
  else if (b == 0xe0) len = 3, lo = 0xa0;
  else if (b >= 0xe1 && b <= 0xec) len = 3;
  else if (b == 0xed) len = 3, hi = 0x9f;
  else if (b >= 0xee && b <= 0xef) len = 3;
  else if (b == 0xf0) len = 4, lo = 0x90;
  else if (b >= 0xf1 && b <= 0xf3) len = 4;
  else if (b == 0xf4) len = 4, hi = 0x8f;
  else return -1;
  for (int k = 1; k < len; ++k) {
    if (i + size_t(k) >= s.size()) return -k;
    const auto c = uint8_t(s[i + size_t(k)]);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xbf)) return -k;
  }
  return len;
}

inline bool valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = unit(s, i);
    if (n < 0) return false;
    i += size_t(n);
  }
  return true;
}

// `bytes` with each maximal ill-formed part replaced by U+FFFD.
inline std::string lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const int n = unit(bytes, i);
    if (n > 0) out.append(bytes, i, size_t(n)), i += size_t(n);
    else append(out, 0xfffd), i += size_t(-n);
  }
  return out;
}

// `s` with each occurrence of `from` (not empty), left to right, replaced by `to`.
inline std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t i = 0;;) {
    const size_t hit = s.find(from, i);
    out.append(s, i, (hit == std::string::npos ? s.size() : hit) - i);
    if (hit == std::string::npos) return out;
    out += to;
    i = hit + from.size();
  }
}

// Unicode White_Space (what `tokenizers` strips around an added token with lstrip or rstrip).
inline bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

}  // namespace weft::apps::utf8
