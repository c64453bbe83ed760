// utf8.h — the UTF-8 primitives the tokenizer needs, with one policy for invalid input:
// each maximal invalid subpart becomes one U+FFFD (Unicode ch. 3 "substitution of maximal
// subparts", which is what Rust's from_utf8_lossy and Python's errors="replace" both do), so
// our replacement matches the reference libraries byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace larder::tokenizer::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the well-formed character at s[i], or 0 if none starts there. When 0, *subpart is
// the length of the maximal invalid subpart (>= 1) and *truncated says whether that subpart is
// a valid prefix cut short by the end of `s` (more bytes could still complete it).
size_t char_len(std::string_view s, size_t i, size_t* subpart = nullptr, bool* truncated = nullptr);

bool is_valid(std::string_view s);
// Replaces each maximal invalid subpart by U+FFFD.
std::string make_valid(std::string_view s);
// Length of the prefix of `s` that can be converted now: everything except a trailing valid
// prefix of a multi-byte character (at most 3 bytes) that later bytes could complete.
size_t complete_prefix(std::string_view s);

// Decodes the (valid) character at s[i]; advances i.
char32_t next_cp(std::string_view s, size_t& i);
void append_cp(std::string& out, char32_t cp);
inline size_t lead_len(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
}

}  // namespace larder::tokenizer::utf8
