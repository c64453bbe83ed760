// components.cpp — normalizers, pre-tokenizers and decoders of tokenizer.json, each with the
// exact semantics of its HF `tokenizers` namesake (including quirks the goldens depend on).
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "larder/tokenizer/pipeline.h"
#include "larder/tokenizer/utf8.h"

namespace larder::tokenizer::detail {

using nlohmann::json;

const ByteLevelTable& ByteLevelTable::get() {
  static const ByteLevelTable t = [] {
    ByteLevelTable t;
    // Printable bytes stand for themselves; the others are shifted to U+0100.. in byte order.
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      utf8::append_cp(t.byte_to_str[b], cp);
      t.cp_to_byte[cp] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return t;
}

namespace {

std::string jstr(const json& j, const char* key, std::string def = "") {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return def;
  return it->get<std::string>();
}
bool jbool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_boolean()) return def;
  return it->get<bool>();
}
int64_t jint(const json& j, const char* key, int64_t def) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return def;
  return it->get<int64_t>();
}

// A Replace/Split pattern: {"String": s} or {"Regex": r}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;

  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
    if (regex) {
      regex->find_all(s, out);
      return;
    }
    out.clear();
    if (literal.empty()) return;
    for (size_t p = s.find(literal); p != std::string_view::npos; p = s.find(literal, p + literal.size()))
      out.emplace_back(p, p + literal.size());
  }
};

Result<Pattern> parse_pattern(const json& j, const std::string& what) {
  Pattern p;
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    p.literal = j["String"].get<std::string>();
    return p;
  }
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    LARDER_ASSIGN_OR_RETURN(p.regex, Regex::compile(j["Regex"].get<std::string>()));
    return p;
  }
  return invalid_argument(what + ": pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

std::string replace_all(std::string_view s, const Pattern& pat, std::string_view content) {
  std::vector<std::pair<size_t, size_t>> m;
  pat.find_all(s, m);
  if (m.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size() + m.size() * content.size());
  size_t prev = 0;
  for (auto [b, e] : m) {
    out.append(s.substr(prev, b - prev));
    out.append(content);
    prev = e;
  }
  out.append(s.substr(prev));
  return out;
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// ------------------------------------------------------------------ normalizers

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  std::string normalize(std::string s) const override {
    if (is_ascii(s)) return s;  // ASCII is invariant under every normalization form
    utf8proc_uint8_t* dst = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                     static_cast<utf8proc_ssize_t>(s.size()), &dst,
                     static_cast<utf8proc_option_t>(options_));
    if (n < 0) return s;  // input is valid UTF-8 by construction; never fail on text
    std::string out(reinterpret_cast<char*>(dst), static_cast<size_t>(n));
    std::free(dst);
    return out;
  }

 private:
  int options_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string s) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      if (static_cast<unsigned char>(s[i]) < 0x80) {
        char c = s[i++];
        out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
        continue;
      }
      const char32_t cp = utf8::next_cp(s, i);
      // Rust's char::to_lowercase uses the full mapping; U+0130 is the one character whose
      // unconditional full lowercase differs from the simple one utf8proc gives.
      if (cp == 0x130) {
        out += "i\xCC\x87";
        continue;
      }
      utf8::append_cp(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
    }
    return out;
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern p, std::string content) : pat_(std::move(p)), content_(std::move(content)) {}
  std::string normalize(std::string s) const override { return replace_all(s, pat_, content_); }

 private:
  Pattern pat_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  std::string normalize(std::string s) const override {
    return s.empty() ? s : prepend_ + s;  // HF prepends only to non-empty strings
  }

 private:
  std::string prepend_;
};

}  // namespace

bool is_unicode_space(char32_t cp) {
  // Rust char::is_whitespace: White_Space property.
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t i = b;
        if (!is_unicode_space(utf8::next_cp(s, i))) break;
        b = i;
      }
    }
    if (right_) {
      while (e > b) {
        size_t k = e - 1;
        while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t i = k;
        if (!is_unicode_space(utf8::next_cp(s, i))) break;
        e = k;
      }
    }
    return s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> v) : v_(std::move(v)) {}
  std::string normalize(std::string s) const override {
    for (const auto& n : v_) s = n->normalize(std::move(s));
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> v_;
};

// ------------------------------------------------------------------ pre-tokenizers

class SplitPre final : public PreTokenizer {
 public:
  SplitPre(Pattern p, SplitBehavior b, bool invert) : pat_(std::move(p)), behavior_(b), invert_(invert) {}
  void split(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 2);
    std::vector<std::pair<size_t, size_t>> m;
    for (const auto& p : pieces) {
      pat_.find_all(p, m);
      split_by_matches(p, m, behavior_, invert_, out);
    }
    pieces.swap(out);
  }

 private:
  Pattern pat_;
  SplitBehavior behavior_;
  bool invert_;
};

constexpr const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class ByteLevelPre final : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, std::shared_ptr<const Regex> re)
      : add_prefix_space_(add_prefix_space), re_(std::move(re)) {}
  void split(std::vector<std::string>& pieces, bool) const override {
    const auto& t = ByteLevelTable::get();
    std::vector<std::string> out;
    out.reserve(pieces.size());
    std::vector<std::pair<size_t, size_t>> m;
    std::vector<std::string> tmp;
    for (auto& p : pieces) {
      // HF's NormalizedString::prepend is a no-op on an empty string.
      if (add_prefix_space_ && !p.empty() && p[0] != ' ') p.insert(p.begin(), ' ');
      tmp.clear();
      if (re_) {
        re_->find_all(p, m);
        split_by_matches(p, m, SplitBehavior::kIsolated, false, tmp);
      } else if (!p.empty()) {
        tmp.push_back(std::move(p));
      }
      for (auto& q : tmp) {
        std::string mapped;
        mapped.reserve(q.size() * 2);
        for (unsigned char c : q) mapped += t.byte_to_str[c];
        out.push_back(std::move(mapped));
      }
    }
    pieces.swap(out);
  }

 private:
  bool add_prefix_space_;
  std::shared_ptr<const Regex> re_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePre final : public PreTokenizer {
 public:
  MetaspacePre(std::string rep, PrependScheme scheme, bool split)
      : rep_(std::move(rep)), scheme_(scheme), split_(split) {}
  void split(std::vector<std::string>& pieces, bool at_start) const override {
    Pattern space;
    space.literal = " ";
    Pattern rep;
    rep.literal = rep_;
    std::vector<std::string> out;
    std::vector<std::pair<size_t, size_t>> m;
    for (size_t i = 0; i < pieces.size(); ++i) {
      std::string s = replace_all(pieces[i], space, rep_);
      const bool starts = s.compare(0, rep_.size(), rep_) == 0;
      if (!s.empty() && !starts && (scheme_ == PrependScheme::kAlways ||
                      (scheme_ == PrependScheme::kFirst && at_start && i == 0)))
        s = rep_ + s;
      if (split_) {
        rep.find_all(s, m);
        split_by_matches(s, m, SplitBehavior::kMergedWithNext, false, out);
      } else if (!s.empty()) {
        out.push_back(std::move(s));
      }
    }
    pieces.swap(out);
  }

 private:
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

bool is_numeric_cp(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

// Splits on characters selected by `pred` (Digits, WhitespaceSplit).
template <typename Pred>
void split_on_chars(const std::string& s, Pred pred, SplitBehavior b, std::vector<std::string>& out) {
  std::vector<std::pair<size_t, size_t>> m;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const char32_t cp = utf8::next_cp(s, i);
    if (pred(cp)) m.emplace_back(start, i);
  }
  split_by_matches(s, m, b, false, out);
}

class DigitsPre final : public PreTokenizer {
 public:
  explicit DigitsPre(bool individual) : individual_(individual) {}
  void split(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    for (const auto& p : pieces)
      split_on_chars(p, is_numeric_cp,
                     individual_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, out);
    pieces.swap(out);
  }

 private:
  bool individual_;
};

class WhitespaceSplitPre final : public PreTokenizer {
 public:
  void split(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    for (const auto& p : pieces) split_on_chars(p, is_unicode_space, SplitBehavior::kRemoved, out);
    pieces.swap(out);
  }
};

class SequencePre final : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> v) : v_(std::move(v)) {}
  void split(std::vector<std::string>& pieces, bool at_start) const override {
    for (const auto& p : v_) p->split(pieces, at_start);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> v_;
};

// ------------------------------------------------------------------ decoders

struct ChainState {
  bool continuation;
  bool fused = false;  // a Fuse ran: the list is one token covering everything decoded so far
};

class DecoderStep {
 public:
  virtual ~DecoderStep() = default;
  virtual void run(std::vector<std::string>& t, ChainState& st) const = 0;
  virtual bool streamable(bool fused_before) const { return true; }
  virtual bool is_byte_fallback() const { return false; }
  virtual bool is_fuse() const { return false; }
};

class ByteLevelDec final : public DecoderStep {
 public:
  void run(std::vector<std::string>& toks, ChainState&) const override {
    const auto& map = ByteLevelTable::get().cp_to_byte;
    for (auto& tok : toks) {
      std::string bytes;
      bytes.reserve(tok.size());
      bool all = true;
      for (size_t i = 0; i < tok.size();) {
        const size_t n = utf8::char_len(tok, i);
        if (n == 0) {
          all = false;
          break;
        }
        size_t j = i;
        auto it = map.find(utf8::next_cp(tok, j));
        if (it == map.end()) {
          all = false;
          break;
        }
        bytes += static_cast<char>(it->second);
        i += n;
      }
      // HF keeps a token whose characters are not all in the table as its raw UTF-8.
      if (all) tok.swap(bytes);
    }
  }
};

class ReplaceDec final : public DecoderStep {
 public:
  ReplaceDec(Pattern p, std::string c) : pat_(std::move(p)), content_(std::move(c)) {}
  void run(std::vector<std::string>& toks, ChainState&) const override {
    for (auto& t : toks) t = replace_all(t, pat_, content_);
  }

 private:
  Pattern pat_;
  std::string content_;
};

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

int byte_token_value(std::string_view t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  const int h = hexval(t[3]), l = hexval(t[4]);
  if (h < 0 || l < 0) return -1;
  return h * 16 + l;
}

namespace {

class ByteFallbackDec final : public DecoderStep {
 public:
  void run(std::vector<std::string>& toks, ChainState&) const override {
    std::vector<std::string> out;
    out.reserve(toks.size());
    std::string run;
    size_t run_len = 0;
    auto flush = [&] {
      if (!run_len) return;
      // A run of byte tokens becomes its text if it is valid UTF-8 as a whole, else one
      // U+FFFD per byte (not per invalid subpart): HF's exact rule.
      if (utf8::is_valid(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_len; ++i) out.emplace_back(utf8::kReplacement);
      }
      run.clear();
      run_len = 0;
    };
    for (auto& t : toks) {
      const int b = byte_token_value(t);
      if (b >= 0) {
        run += static_cast<char>(b);
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    toks.swap(out);
  }
  bool is_byte_fallback() const override { return true; }
};

class FuseDec final : public DecoderStep {
 public:
  void run(std::vector<std::string>& toks, ChainState& st) const override {
    std::string all;
    for (auto& t : toks) all += t;
    toks.assign(1, std::move(all));
    st.fused = true;
  }
  bool is_fuse() const override { return true; }
};

class StripDec final : public DecoderStep {
 public:
  StripDec(char32_t c, size_t start, size_t stop) : c_(c), start_(start), stop_(stop) {}
  void run(std::vector<std::string>& toks, ChainState& st) const override {
    // After a Fuse, the single token is the whole text: while streaming, its start was
    // already stripped in an earlier call.
    const bool strip_start = !(st.fused && st.continuation);
    for (auto& t : toks) {
      std::vector<size_t> starts;  // byte offset of each character
      for (size_t i = 0; i < t.size(); i += std::max<size_t>(1, utf8::lead_len(t[i]))) starts.push_back(i);
      size_t cut_b = 0, cut_e = starts.size();
      if (strip_start) {
        for (size_t i = 0; i < std::min(start_, starts.size()); ++i) {
          size_t j = starts[i];
          if (utf8::next_cp(t, j) != c_) break;
          cut_b = i + 1;
        }
      }
      for (size_t i = 0; i < stop_ && i < starts.size(); ++i) {
        const size_t idx = starts.size() - i - 1;
        if (idx < cut_b) break;
        size_t j = starts[idx];
        if (utf8::next_cp(t, j) != c_) break;
        cut_e = idx;
      }
      const size_t b = cut_b < starts.size() ? starts[cut_b] : t.size();
      const size_t e = cut_e < starts.size() ? starts[cut_e] : t.size();
      t = e > b ? t.substr(b, e - b) : std::string();
    }
  }
  bool streamable(bool fused_before) const override { return !(fused_before && stop_ > 0); }

 private:
  char32_t c_;
  size_t start_, stop_;
};

class MetaspaceDec final : public DecoderStep {
 public:
  MetaspaceDec(std::string rep, bool drop_first) : rep_(std::move(rep)), drop_first_(drop_first) {}
  void run(std::vector<std::string>& toks, ChainState& st) const override {
    for (size_t i = 0; i < toks.size(); ++i) {
      // HF drops every replacement character of the first token (not only a leading one).
      const bool drop = drop_first_ && i == 0 && !st.continuation;
      std::string out;
      const std::string& t = toks[i];
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, rep_.size(), rep_) == 0) {
          if (!drop) out += ' ';
          p += rep_.size();
        } else {
          out += t[p++];
        }
      }
      toks[i] = std::move(out);
    }
  }

 private:
  std::string rep_;
  bool drop_first_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<DecoderStep>> v) : v_(std::move(v)) {}
  void decode_chain(std::vector<std::string>& tokens, bool continuation) const override {
    ChainState st{continuation};
    for (const auto& d : v_) d->run(tokens, st);
  }
  bool streamable() const override {
    bool fused = false;
    for (const auto& d : v_) {
      if (!d->streamable(fused)) return false;
      fused = fused || d->is_fuse();
    }
    return true;
  }
  bool holds_byte_tokens() const override {
    for (const auto& d : v_)
      if (d->is_byte_fallback()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<DecoderStep>> v_;
};

char32_t first_cp(const std::string& s) {
  size_t i = 0;
  return s.empty() ? U' ' : utf8::next_cp(s, i);
}

Result<std::unique_ptr<DecoderStep>> build_step(const json& j, const std::string& what,
                                                std::vector<std::unique_ptr<DecoderStep>>* flat);

Status flatten(const json& j, const std::string& what, std::vector<std::unique_ptr<DecoderStep>>& v) {
  if (!j.is_object()) return invalid_argument(what + ": decoder must be an object");
  const std::string type = jstr(j, "type");
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) return invalid_argument(what + ": Sequence decoder without 'decoders'");
    for (const auto& d : *it) LARDER_RETURN_IF_ERROR(flatten(d, what, v));
    return Status::ok();
  }
  LARDER_ASSIGN_OR_RETURN(auto step, build_step(j, what, &v));
  v.push_back(std::move(step));
  return Status::ok();
}

Result<std::unique_ptr<DecoderStep>> build_step(const json& j, const std::string& what,
                                                std::vector<std::unique_ptr<DecoderStep>>*) {
  const std::string type = jstr(j, "type");
  if (type == "ByteLevel") return std::unique_ptr<DecoderStep>(new ByteLevelDec());
  if (type == "ByteFallback") return std::unique_ptr<DecoderStep>(new ByteFallbackDec());
  if (type == "Fuse") return std::unique_ptr<DecoderStep>(new FuseDec());
  if (type == "Replace") {
    LARDER_ASSIGN_OR_RETURN(Pattern p, parse_pattern(jget(j, "pattern"), what + ": Replace decoder"));
    return std::unique_ptr<DecoderStep>(new ReplaceDec(std::move(p), jstr(j, "content")));
  }
  if (type == "Strip") {
    return std::unique_ptr<DecoderStep>(new StripDec(first_cp(jstr(j, "content", " ")),
                                                     static_cast<size_t>(jint(j, "start", 0)),
                                                     static_cast<size_t>(jint(j, "stop", 0))));
  }
  if (type == "Metaspace") {
    std::string rep = jstr(j, "replacement", "\xE2\x96\x81");
    std::string scheme = jstr(j, "prepend_scheme", jbool(j, "add_prefix_space", true) ? "always" : "never");
    return std::unique_ptr<DecoderStep>(new MetaspaceDec(std::move(rep), scheme != "never"));
  }
  return unsupported(what + ": unsupported decoder type '" + type + "'");
}

}  // namespace

// ------------------------------------------------------------------ shared helpers

void split_by_matches(std::string_view s, const std::vector<std::pair<size_t, size_t>>& matches,
                      SplitBehavior behavior, bool invert, std::vector<std::string>& out) {
  // Segments covering s, flagged as match or not (HF find_matches + invert).
  struct Seg {
    size_t b, e;
    bool match;
  };
  std::vector<Seg> segs;
  segs.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) segs.push_back({prev, b, invert});
    segs.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < s.size()) segs.push_back({prev, s.size(), invert});

  std::vector<std::pair<size_t, size_t>> res;
  res.reserve(segs.size());
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& g : segs)
        if (!g.match) res.emplace_back(g.b, g.e);
      break;
    case SplitBehavior::kIsolated:
      for (const auto& g : segs) res.emplace_back(g.b, g.e);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const auto& g : segs) {
        if (g.match && !prev_match && !res.empty()) res.back().second = g.e;
        else res.emplace_back(g.b, g.e);
        prev_match = g.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (size_t k = segs.size(); k-- > 0;) {
        const auto& g = segs[k];
        if (g.match && !prev_match && !res.empty()) res.back().first = g.b;
        else res.emplace_back(g.b, g.e);
        prev_match = g.match;
      }
      std::reverse(res.begin(), res.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (const auto& g : segs) {
        if (g.match == prev_match && !res.empty()) res.back().second = g.e;
        else res.emplace_back(g.b, g.e);
        prev_match = g.match;
      }
      break;
    }
  }
  for (auto [b, e] : res)
    if (e > b) out.emplace_back(s.substr(b, e - b));
}

// ------------------------------------------------------------------ builders

Result<std::unique_ptr<Normalizer>> build_normalizer(const json& j, const std::string& what) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  if (!j.is_object()) return invalid_argument(what + ": normalizer must be an object");
  const std::string type = jstr(j, "type");
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) return invalid_argument(what + ": Sequence normalizer without 'normalizers'");
    std::vector<std::unique_ptr<Normalizer>> v;
    for (const auto& n : *it) {
      LARDER_ASSIGN_OR_RETURN(auto x, build_normalizer(n, what));
      if (x) v.push_back(std::move(x));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(v)));
  }
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  if (type == "NFKC")
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  if (type == "NFKD")
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Prepend") return std::unique_ptr<Normalizer>(new PrependNormalizer(jstr(j, "prepend")));
  if (type == "Strip")
    return std::unique_ptr<Normalizer>(new StripNormalizer(jbool(j, "strip_left", true), jbool(j, "strip_right", true)));
  if (type == "Replace") {
    LARDER_ASSIGN_OR_RETURN(Pattern p, parse_pattern(jget(j, "pattern"), what + ": Replace normalizer"));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(p), jstr(j, "content")));
  }
  return unsupported(what + ": unsupported normalizer type '" + type + "'");
}

Result<std::unique_ptr<PreTokenizer>> build_pre_tokenizer(const json& j, const std::string& what) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  if (!j.is_object()) return invalid_argument(what + ": pre_tokenizer must be an object");
  const std::string type = jstr(j, "type");
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) return invalid_argument(what + ": Sequence pre_tokenizer without 'pretokenizers'");
    std::vector<std::unique_ptr<PreTokenizer>> v;
    for (const auto& n : *it) {
      LARDER_ASSIGN_OR_RETURN(auto x, build_pre_tokenizer(n, what));
      if (x) v.push_back(std::move(x));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePre(std::move(v)));
  }
  if (type == "Split") {
    LARDER_ASSIGN_OR_RETURN(Pattern p, parse_pattern(jget(j, "pattern"), what + ": Split pre_tokenizer"));
    const std::string b = jstr(j, "behavior", "Isolated");
    SplitBehavior sb;
    if (b == "Removed") sb = SplitBehavior::kRemoved;
    else if (b == "Isolated") sb = SplitBehavior::kIsolated;
    else if (b == "MergedWithPrevious") sb = SplitBehavior::kMergedWithPrevious;
    else if (b == "MergedWithNext") sb = SplitBehavior::kMergedWithNext;
    else if (b == "Contiguous") sb = SplitBehavior::kContiguous;
    else return unsupported(what + ": unsupported Split behavior '" + b + "'");
    return std::unique_ptr<PreTokenizer>(new SplitPre(std::move(p), sb, jbool(j, "invert", false)));
  }
  if (type == "ByteLevel") {
    std::shared_ptr<const Regex> re;
    if (jbool(j, "use_regex", true)) {
      LARDER_ASSIGN_OR_RETURN(re, Regex::compile(kGpt2Regex));
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPre(jbool(j, "add_prefix_space", true), std::move(re)));
  }
  if (type == "Metaspace") {
    std::string rep = jstr(j, "replacement", "\xE2\x96\x81");
    std::string scheme = jstr(j, "prepend_scheme", jbool(j, "add_prefix_space", true) ? "always" : "never");
    PrependScheme ps = scheme == "first" ? PrependScheme::kFirst
                       : scheme == "never" ? PrependScheme::kNever
                                           : PrependScheme::kAlways;
    return std::unique_ptr<PreTokenizer>(new MetaspacePre(std::move(rep), ps, jbool(j, "split", true)));
  }
  if (type == "Digits") return std::unique_ptr<PreTokenizer>(new DigitsPre(jbool(j, "individual_digits", false)));
  if (type == "WhitespaceSplit") return std::unique_ptr<PreTokenizer>(new WhitespaceSplitPre());
  if (type == "Whitespace") {
    Pattern p;
    LARDER_ASSIGN_OR_RETURN(p.regex, Regex::compile("\\w+|[^\\w\\s]+"));
    return std::unique_ptr<PreTokenizer>(new SplitPre(std::move(p), SplitBehavior::kRemoved, true));
  }
  return unsupported(what + ": unsupported pre_tokenizer type '" + type + "'");
}

Result<std::unique_ptr<Decoder>> build_decoder(const json& j, const std::string& what) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  std::vector<std::unique_ptr<DecoderStep>> v;
  LARDER_RETURN_IF_ERROR(flatten(j, what, v));
  return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(v)));
}

std::unique_ptr<Normalizer> make_spm_normalizer(bool add_space_prefix) {
  std::vector<std::unique_ptr<Normalizer>> v;
  if (add_space_prefix) v.emplace_back(new PrependNormalizer("\xE2\x96\x81"));
  Pattern space;
  space.literal = " ";
  v.emplace_back(new ReplaceNormalizer(std::move(space), "\xE2\x96\x81"));
  return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(v)));
}

std::unique_ptr<Decoder> make_spm_decoder(bool strip_leading_space) {
  std::vector<std::unique_ptr<DecoderStep>> v;
  Pattern rep;
  rep.literal = "\xE2\x96\x81";
  v.emplace_back(new ReplaceDec(std::move(rep), " "));
  v.emplace_back(new ByteFallbackDec());
  v.emplace_back(new FuseDec());
  if (strip_leading_space) v.emplace_back(new StripDec(U' ', 1, 0));
  return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(v)));
}

std::unique_ptr<Decoder> make_byte_level_decoder() {
  std::vector<std::unique_ptr<DecoderStep>> v;
  v.emplace_back(new ByteLevelDec());
  return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(v)));
}

Result<std::unique_ptr<PreTokenizer>> make_regex_byte_level(const std::vector<std::string>& regexes) {
  std::vector<std::unique_ptr<PreTokenizer>> v;
  for (const auto& r : regexes) {
    Pattern p;
    LARDER_ASSIGN_OR_RETURN(p.regex, Regex::compile(r));
    v.emplace_back(new SplitPre(std::move(p), SplitBehavior::kIsolated, false));
  }
  v.emplace_back(new ByteLevelPre(false, nullptr));
  return std::unique_ptr<PreTokenizer>(new SequencePre(std::move(v)));
}

// ------------------------------------------------------------------ BERT (GGUF WordPiece)

namespace {

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

utf8proc_category_t cat(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

// HF bert: whitespace is ' ', \t, \n, \r or category Zs; control is Cc/Cf/Cn/Co except those.
bool bert_space(char32_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || cat(c) == UTF8PROC_CATEGORY_ZS; }
bool bert_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const auto k = cat(c);
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
         k == UTF8PROC_CATEGORY_CO;
}
bool bert_punct(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  const auto k = cat(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

class BertNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string s) const override {
    std::string cleaned;
    cleaned.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      const char32_t c = utf8::next_cp(s, i);
      if (c == 0 || c == 0xFFFD || bert_control(c)) continue;
      if (bert_space(c)) {
        cleaned += ' ';
      } else if (is_cjk(c)) {
        cleaned += ' ';
        utf8::append_cp(cleaned, c);
        cleaned += ' ';
      } else {
        utf8::append_cp(cleaned, c);
      }
    }
    const std::string nfd = UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE).normalize(std::move(cleaned));
    std::string out;
    out.reserve(nfd.size());
    for (size_t i = 0; i < nfd.size();) {
      const char32_t c = utf8::next_cp(nfd, i);
      if (cat(c) == UTF8PROC_CATEGORY_MN) continue;  // strip accents
      utf8::append_cp(out, c);
    }
    return LowercaseNormalizer().normalize(std::move(out));
  }
};

class BertPre final : public PreTokenizer {
 public:
  void split(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    for (const auto& p : pieces) {
      std::string word;
      for (size_t i = 0; i < p.size();) {
        const size_t b = i;
        const char32_t c = utf8::next_cp(p, i);
        if (bert_space(c) || bert_punct(c)) {
          if (!word.empty()) out.push_back(std::move(word));
          word.clear();
          if (!bert_space(c)) out.emplace_back(p.substr(b, i - b));
        } else {
          word.append(p, b, i - b);
        }
      }
      if (!word.empty()) out.push_back(std::move(word));
    }
    pieces.swap(out);
  }
};

}  // namespace

std::unique_ptr<Normalizer> make_bert_normalizer() { return std::make_unique<BertNormalizer>(); }
std::unique_ptr<PreTokenizer> make_bert_pre_tokenizer() { return std::make_unique<BertPre>(); }

}  // namespace larder::tokenizer::detail
