// lexer.cpp — jinja2's tokenizer, reproduced for the whitespace rules that decide output bytes.
//
// Rules reproduced (jinja2 3.1 lexer.py):
//  * the source's line breaks (\r\n, \r, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029: str.splitlines)
//    become "\n", and one trailing line break is dropped (keep_trailing_newline=False);
//  * "{%-"/"{{-"/"{#-" strip all whitespace before the tag, "-%}"/"-}}"/"-#}" all after it;
//  * lstrip_blocks: spaces/tabs between a line start and "{%" or "{#" are removed, unless "{%+";
//  * trim_blocks: the first "\n" after "%}" or "#}" is removed, unless "+%}".
#include "larder/tokenizer/chat_template/lexer.h"

#include <cstring>

#include "larder/core/status.h"
#include "larder/tokenizer/chat_template/value.h"

namespace larder::chat_template {
namespace {

std::string normalize_newlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  size_t i = 0;
  bool ended_with_break = false;
  while (i < src.size()) {
    unsigned char c = static_cast<unsigned char>(src[i]);
    size_t n = 0;  // length of a line break at i
    if (c == '\r') n = (i + 1 < src.size() && src[i + 1] == '\n') ? 2 : 1;
    else if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) n = 1;
    else if (c == 0xc2 && i + 1 < src.size() && static_cast<unsigned char>(src[i + 1]) == 0x85) n = 2;
    else if (c == 0xe2 && i + 2 < src.size() && static_cast<unsigned char>(src[i + 1]) == 0x80 &&
             (static_cast<unsigned char>(src[i + 2]) == 0xa8 || static_cast<unsigned char>(src[i + 2]) == 0xa9)) n = 3;
    if (n) {
      out += '\n';
      i += n;
      ended_with_break = true;
    } else {
      out += static_cast<char>(c);
      ++i;
      ended_with_break = false;
    }
  }
  if (ended_with_break) out.pop_back();
  return out;
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python str.rstrip() on the data before a "{%-" tag (Unicode whitespace included).
void rstrip_py(std::string& s) {
  while (!s.empty()) {
    size_t k = s.size() - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xc0) == 0x80) --k;
    auto cps = utf8_decode(std::string_view(s).substr(k));
    if (cps.size() == 1 && py_isspace(cps[0])) s.resize(k);
    else break;
  }
}

// Length of the whitespace run at s[i..] (regex \s* in unicode mode).
size_t ws_run(std::string_view s, size_t i) {
  size_t j = i;
  while (j < s.size()) {
    if (is_ws(s[j]) || (s[j] >= 0x1c && s[j] <= 0x1f)) { ++j; continue; }
    unsigned char c = static_cast<unsigned char>(s[j]);
    if (c >= 0x80) {
      size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
      auto cps = utf8_decode(s.substr(j, n));
      if (cps.size() == 1 && py_isspace(cps[0])) { j += n; continue; }
    }
    break;
  }
  return j - i;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    std::string data;
    size_t data_line_pos = 0;
    while (pos_ < s_.size()) {
      size_t open = find_open(pos_);
      data_line_pos = pos_;
      data = s_.substr(pos_, (open == std::string::npos ? s_.size() : open) - pos_);
      if (open == std::string::npos) {
        emit_data(data, data_line_pos);
        pos_ = s_.size();
        break;
      }
      char kind = s_[open + 1];  // '{', '%', '#'
      char sign = open + 2 < s_.size() ? s_[open + 2] : 0;
      bool has_sign = sign == '-' || sign == '+';
      if (has_sign && sign == '-') {
        rstrip_py(data);
      } else if (sign != '+' && kind != '{') {
        size_t l_pos = data.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool only_blank = true;
          for (size_t k = l_pos; k < data.size(); ++k) if (data[k] != ' ' && data[k] != '\t') { only_blank = false; break; }
          if (only_blank) data.resize(l_pos);
        }
      }
      emit_data(data, data_line_pos);
      pos_ = open + 2 + (has_sign ? 1 : 0);
      if (kind == '#') {
        line_starting = lex_comment(open);
      } else if (kind == '%' && try_raw(open, line_starting)) {
        // raw block handled
      } else {
        line_starting = lex_tag(kind == '{', open);
      }
    }
    Token eof{Tok::kEof, "", 0, 0, line_at(s_.size()), 1};
    toks_.push_back(eof);
    return std::move(toks_);
  }

 private:
  std::string s_;
  size_t pos_ = 0;
  std::vector<Token> toks_;
  // line_start_[k] caches newline positions for line:col reporting
  std::vector<size_t> nl_;
  bool nl_built_ = false;

  int line_at(size_t p) {
    if (!nl_built_) {
      for (size_t i = 0; i < s_.size(); ++i) if (s_[i] == '\n') nl_.push_back(i);
      nl_built_ = true;
    }
    size_t lo = 0, hi = nl_.size();
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (nl_[mid] < p) lo = mid + 1; else hi = mid;
    }
    return static_cast<int>(lo) + 1;
  }
  int col_at(size_t p) {
    int line = line_at(p);  // binary search; a backwards scan would be quadratic on long lines
    if (line == 1) return static_cast<int>(p + 1);
    return static_cast<int>(p - nl_[static_cast<size_t>(line) - 2]);
  }
  [[noreturn]] void fail(size_t p, const std::string& msg) {
    throw_error(TemplateError::Kind::kSyntax, strfmt("%d:%d: %s", line_at(p), col_at(p), msg.c_str()), line_at(p));
  }

  size_t find_open(size_t from) {
    size_t p = from;
    while (true) {
      p = s_.find('{', p);
      if (p == std::string::npos || p + 1 >= s_.size()) return std::string::npos;
      char c = s_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      ++p;
    }
  }

  void emit_data(const std::string& data, size_t at) {
    if (data.empty()) return;
    toks_.push_back(Token{Tok::kData, data, 0, 0, line_at(at), col_at(at)});
  }

  // After a closing delimiter at p (just past it): apply '-' / trim_blocks. Returns line_starting.
  bool after_close(bool strip, bool plus, bool trim_newline) {
    size_t start = pos_;
    if (strip) {
      pos_ += ws_run(s_, pos_);
    } else if (!plus && trim_newline && pos_ < s_.size() && s_[pos_] == '\n') {
      ++pos_;
    }
    if (pos_ > start) return s_[pos_ - 1] == '\n';
    return false;
  }

  bool lex_comment(size_t open) {
    // The comment ends at the first "#}", optionally preceded by '-' (strip) or '+'.
    size_t end = s_.find("#}", pos_);
    if (end == std::string::npos) fail(open, "missing end of comment tag");
    bool strip = end > pos_ && s_[end - 1] == '-';
    bool plus = end > pos_ && s_[end - 1] == '+';
    pos_ = end + 2;
    return after_close(strip, plus, true);
  }

  bool try_raw(size_t open, bool& line_starting) {
    size_t p = pos_;
    while (p < s_.size() && is_ws(s_[p])) ++p;
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < s_.size() && (isalnum(static_cast<unsigned char>(s_[p])) || s_[p] == '_')) return false;
    while (p < s_.size() && is_ws(s_[p])) ++p;
    bool strip_after = false;
    if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) { strip_after = s_[p] == '-'; ++p; }
    if (s_.compare(p, 2, "%}") != 0) return false;
    pos_ = p + 2;
    if (strip_after) pos_ += ws_run(s_, pos_);
    // Find {% endraw %}
    size_t q = pos_;
    while (true) {
      q = s_.find("{%", q);
      if (q == std::string::npos) fail(open, "missing end of raw directive");
      size_t r = q + 2;
      bool strip_before = r < s_.size() && s_[r] == '-';
      if (r < s_.size() && (s_[r] == '-' || s_[r] == '+')) ++r;
      while (r < s_.size() && is_ws(s_[r])) ++r;
      if (s_.compare(r, 6, "endraw") == 0) {
        r += 6;
        while (r < s_.size() && is_ws(s_[r])) ++r;
        bool strip_end = false, plus_end = false;
        if (r < s_.size() && (s_[r] == '-' || s_[r] == '+')) { strip_end = s_[r] == '-'; plus_end = s_[r] == '+'; ++r; }
        if (s_.compare(r, 2, "%}") == 0) {
          std::string body = s_.substr(pos_, q - pos_);
          if (strip_before) rstrip_py(body);
          emit_data(body, pos_);
          pos_ = r + 2;
          line_starting = after_close(strip_end, plus_end, true);
          return true;
        }
      }
      q += 2;
    }
  }

  // Tokens inside {{ }} / {% %}; returns line_starting for the following data.
  bool lex_tag(bool is_var, size_t open) {
    toks_.push_back(Token{is_var ? Tok::kVarBegin : Tok::kBlockBegin, "", 0, 0, line_at(open), col_at(open)});
    const char close0 = is_var ? '}' : '%';
    // No bracket tracking: "}}" closes the tag even inside {{ {'a': {}} }}, as in jinja2.
    while (true) {
      while (pos_ < s_.size() && is_ws(s_[pos_])) ++pos_;
      if (pos_ >= s_.size()) fail(open, is_var ? "unexpected end of template, expected '}}' to close '{{'"
                                               : "unexpected end of template, expected '%}' to close '{%'");
      // End delimiters, optionally with a '-' / '+' modifier.
      char c = s_[pos_];
      if ((c == '-' || c == '+') && s_.compare(pos_ + 1, 2, is_var ? "}}" : "%}") == 0) {
        toks_.push_back(Token{is_var ? Tok::kVarEnd : Tok::kBlockEnd, "", 0, 0, line_at(pos_), col_at(pos_)});
        pos_ += 3;
        return after_close(c == '-', c == '+', !is_var);
      }
      if (c == close0 && pos_ + 1 < s_.size() && s_[pos_ + 1] == '}') {
        toks_.push_back(Token{is_var ? Tok::kVarEnd : Tok::kBlockEnd, "", 0, 0, line_at(pos_), col_at(pos_)});
        pos_ += 2;
        return after_close(false, false, !is_var);
      }
      lex_one();
    }
  }

  void lex_one() {
    size_t start = pos_;
    char c = s_[pos_];
    Token t{Tok::kOp, "", 0, 0, line_at(start), col_at(start)};
    if (isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos_;
      while (e < s_.size() && (isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
      t.type = Tok::kName;
      t.text = s_.substr(pos_, e - pos_);
      pos_ = e;
    } else if (c == '\'' || c == '"') {
      t.type = Tok::kString;
      t.text = lex_string(c);
    } else if (isdigit(static_cast<unsigned char>(c))) {
      lex_number(t);
    } else {
      static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                  "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", ";"};
      bool found = false;
      for (const char* op : ops) {
        size_t n = std::strlen(op);
        if (s_.compare(pos_, n, op) == 0) {
          t.text = op;
          pos_ += n;
          found = true;
          break;
        }
      }
      if (!found) fail(start, strfmt("unexpected char '%c'", c));
    }
    toks_.push_back(std::move(t));
  }

  void lex_number(Token& t) {
    size_t start = pos_;
    auto digits = [&]() {
      size_t b = pos_;
      while (pos_ < s_.size() && (isdigit(static_cast<unsigned char>(s_[pos_])) ||
                                  (s_[pos_] == '_' && pos_ + 1 < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_ + 1])) && pos_ > b)))
        ++pos_;
    };
    digits();
    bool is_float = false;
    // A '.' followed by a digit continues the number unless the number itself followed a '.'
    // (jinja2's (?<!\.) lookbehind keeps "x.0.1" as attribute accesses).
    bool after_dot = start > 0 && s_[start - 1] == '.';
    if (!after_dot && pos_ + 1 < s_.size() && s_[pos_] == '.' && isdigit(static_cast<unsigned char>(s_[pos_ + 1]))) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (!after_dot && pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      size_t save = pos_;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_]))) {
        digits();
        is_float = true;
      } else {
        pos_ = save;
      }
    }
    std::string txt;
    for (size_t i = start; i < pos_; ++i) if (s_[i] != '_') txt += s_[i];
    if (is_float) {
      t.type = Tok::kFloat;
      t.fval = std::strtod(txt.c_str(), nullptr);
    } else {
      t.type = Tok::kInt;
      errno = 0;
      long long v = std::strtoll(txt.c_str(), nullptr, 10);
      if (errno == ERANGE) fail(start, "integer literal too large");
      t.ival = v;
    }
    t.text = txt;
  }

  // Python's unicode-escape decoding of a jinja2 string literal.
  std::string lex_string(char q) {
    size_t start = pos_;
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail(start, "unexpected end of string");
      char c = s_[pos_];
      if (c == q) { ++pos_; break; }
      if (c != '\\') { out += c; ++pos_; continue; }
      if (pos_ + 1 >= s_.size()) fail(start, "unexpected end of string");
      char e = s_[pos_ + 1];
      pos_ += 2;
      auto hex = [&](int n) -> uint32_t {
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          if (pos_ >= s_.size() || !isxdigit(static_cast<unsigned char>(s_[pos_])))
            fail(start, "truncated \\x/\\u escape in string literal");
          char h = s_[pos_++];
          v = v * 16 + (isdigit(static_cast<unsigned char>(h)) ? h - '0' : (tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': utf8_append(out, hex(2)); break;
        case 'u': utf8_append(out, hex(4)); break;
        case 'U': {
          uint32_t v = hex(8);
          if (v > 0x10ffff) fail(start, "illegal Unicode character in string literal");
          utf8_append(out, v);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = e - '0';
            for (int k = 0; k < 2 && pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '7'; ++k) v = v * 8 + (s_[pos_++] - '0');
            utf8_append(out, v);
          } else {
            out += '\\';  // unknown escapes are kept verbatim
            out += e;
          }
      }
    }
    return out;
  }
};

}  // namespace

std::vector<Token> lex(std::string_view source) {
  Lexer lx(normalize_newlines(source));
  return lx.run();
}

}  // namespace larder::chat_template
