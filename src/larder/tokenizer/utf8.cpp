#include "larder/tokenizer/utf8.h"

namespace larder::tokenizer::utf8 {

size_t char_len(std::string_view s, size_t i, size_t* subpart, bool* truncated) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    if (subpart) *subpart = 1;
    if (truncated) *truncated = false;
    return 0;
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= s.size()) {
      if (subpart) *subpart = k;
      if (truncated) *truncated = true;
      return 0;
    }
    const unsigned char x = b(i + k);
    const bool ok = k == 1 ? (x >= lo && x <= hi) : (x >= 0x80 && x <= 0xBF);
    if (!ok) {
      if (subpart) *subpart = k;
      if (truncated) *truncated = false;
      return 0;
    }
  }
  return need + 1;
}

bool is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = char_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string make_valid(std::string_view s) {
  if (is_valid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    size_t sub = 0;
    const size_t n = char_len(s, i, &sub);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append(kReplacement);
      i += sub;
    }
  }
  return out;
}

size_t complete_prefix(std::string_view s) {
  // Only the last 3 bytes can hold an unfinished character; scan back to its lead byte.
  const size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    size_t sub = 0;
    bool trunc = false;
    if (char_len(s, i, &sub, &trunc) == 0 && trunc && i + sub == s.size()) {
      // A lead byte whose valid continuation runs to the end. Make sure it is not itself the
      // tail of an earlier character (continuation bytes are never leads, so it is not).
      return i;
    }
  }
  return s.size();
}

char32_t next_cp(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = lead_len(c);
  if (n == 1 || i + n > s.size()) {
    ++i;
    return c;
  }
  char32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_cp(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace larder::tokenizer::utf8
