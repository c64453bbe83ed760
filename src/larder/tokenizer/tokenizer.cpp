// tokenizer.cpp — the encode/decode pipeline and the two loaders (tokenizer.json, GGUF).
#include "larder/tokenizer/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "larder/core/mmap_file.h"
#include "larder/formats/gguf.h"
#include "larder/tokenizer/pipeline.h"
#include "larder/tokenizer/utf8.h"

namespace larder::tokenizer {

using nlohmann::json;
using namespace detail;

// ====================================================================== added-token matching

void TokenMatcher::add(std::string_view pattern, int32_t token_index) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (unsigned char c : pattern) {
    auto& next = nodes_[node].next;
    auto it = std::lower_bound(next.begin(), next.end(), c,
                               [](const std::pair<unsigned char, int32_t>& p, unsigned char v) { return p.first < v; });
    if (it != next.end() && it->first == c) {
      node = it->second;
    } else {
      const auto child = static_cast<int32_t>(nodes_.size());
      next.insert(it, {c, child});
      nodes_.emplace_back();
      node = child;
    }
  }
  // The first pattern registered for a string wins, like aho-corasick's pattern order.
  if (nodes_[node].token < 0) nodes_[node].token = token_index;
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

int32_t TokenMatcher::longest_at(std::string_view s, size_t pos, size_t* len) const {
  if (!first_byte_[static_cast<unsigned char>(s[pos])]) return -1;
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const auto& next = nodes_[node].next;
    auto it = std::lower_bound(next.begin(), next.end(), c,
                               [](const std::pair<unsigned char, int32_t>& p, unsigned char v) { return p.first < v; });
    if (it == next.end() || it->first != c) break;
    node = it->second;
    if (nodes_[node].token >= 0) {
      best = nodes_[node].token;
      *len = i + 1 - pos;
    }
  }
  return best;
}

namespace {

bool is_word_cp(char32_t cp) {
  if (cp == '_') return true;
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
         (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

char32_t last_cp(std::string_view s, size_t end) {
  size_t k = end - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return utf8::next_cp(s, k);
}

}  // namespace

void Impl::split_added(const TokenMatcher& m, std::string_view text, bool at_start,
                       std::vector<Segment>& out) const {
  if (m.empty()) {
    if (!text.empty()) out.push_back({std::string(text), -1, at_start});
    return;
  }
  size_t start_offset = 0, pos = 0;
  while (pos < text.size()) {
    size_t len = 0;
    const int32_t ti = m.longest_at(text, pos, &len);
    if (ti < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = added[ti];
    size_t start = pos, stop = pos + len;
    pos = stop;  // the scan resumes after the match even when the match is rejected below
    if (tok.single_word) {
      const bool start_ok = start == 0 || !is_word_cp(last_cp(text, start));
      size_t k = stop;
      const bool stop_ok = stop == text.size() || !is_word_cp(utf8::next_cp(text, k));
      if (!start_ok || !stop_ok) continue;
    }
    if (tok.lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t k = b - 1;
        while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
        size_t j = k;
        if (!is_unicode_space(utf8::next_cp(text, j))) break;
        b = k;
      }
      start = std::max(b, start_offset);
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        size_t j = stop;
        if (!is_unicode_space(utf8::next_cp(text, j))) break;
        stop = j;
      }
    }
    if (start_offset < start)
      out.push_back({std::string(text.substr(start_offset, start - start_offset)), -1,
                     at_start && start_offset == 0});
    out.push_back({std::string(), tok.id, false});
    start_offset = stop;
  }
  if (start_offset < text.size())
    out.push_back({std::string(text.substr(start_offset)), -1, at_start && start_offset == 0});
}

std::vector<int32_t> Impl::encode(std::string_view input, bool add_special) const {
  const std::string text = utf8::make_valid(input);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special) ids.insert(ids.end(), post.prefix.begin(), post.prefix.end());
  std::vector<Segment> raw, norm;
  split_added(raw_matcher, text, true, raw);
  std::vector<std::string> pieces;
  for (auto& seg : raw) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string n = normalizer ? normalizer->normalize(std::move(seg.text)) : std::move(seg.text);
    norm.clear();
    split_added(normalized_matcher, n, seg.at_start, norm);
    for (auto& sub : norm) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      pieces.clear();
      pieces.push_back(std::move(sub.text));
      if (pre_tokenizer) pre_tokenizer->split(pieces, sub.at_start);
      for (const auto& p : pieces) model->tokenize(p, ids);
    }
  }
  if (add_special) ids.insert(ids.end(), post.suffix.begin(), post.suffix.end());
  return ids;
}

std::vector<std::string> Impl::tokens_of(const int32_t* ids, size_t n, bool skip_special) const {
  std::vector<std::string> toks;
  toks.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= id_to_str.size()) continue;
    if (id_to_str[id].empty() && !lookup(model_vocab, "") && !lookup(added_vocab, "")) continue;
    if (skip_special && special_flags[id]) continue;
    toks.push_back(id_to_str[id]);
  }
  return toks;
}

std::string Impl::decode_raw(const int32_t* ids, size_t n, bool skip_special, bool continuation) const {
  std::vector<std::string> toks = tokens_of(ids, n, skip_special);
  std::string out;
  if (decoder) {
    decoder->decode_chain(toks, continuation);
    for (const auto& t : toks) out += t;
  } else {
    // No decoder: HF joins the tokens with single spaces.
    for (size_t i = 0; i < toks.size(); ++i) {
      if (i > 0 || continuation) out += ' ';
      out += toks[i];
    }
  }
  return out;
}

bool Impl::is_byte_token(int32_t id) const {
  if (!decoder || !decoder->holds_byte_tokens()) return false;
  if (id < 0 || static_cast<size_t>(id) >= id_to_str.size()) return false;
  return byte_token_value(id_to_str[id]) >= 0;
}

// ====================================================================== Tokenizer

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  return impl_->encode(text, add_special);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return utf8::make_valid(impl_->decode_raw(ids.data(), ids.size(), skip_special, false));
}

std::string Tokenizer::token_bytes(int32_t id) const {
  // A byte-fallback token is its byte (the decoder would turn a lone invalid one into U+FFFD).
  if (impl_->is_byte_token(id)) return std::string(1, static_cast<char>(byte_token_value(impl_->id_to_str[id])));
  return impl_->decode_raw(&id, 1, /*skip_special=*/false, /*continuation=*/true);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_str.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = lookup(impl_->added_vocab, token)) return id;
  return lookup(impl_->model_vocab, token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_str.size()) return {};
  return impl_->id_to_str[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special_flags.size() && impl_->special_flags[id];
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->added_flags.size() && impl_->added_flags[id];
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::vector<int32_t> Tokenizer::eos_ids() const { return impl_->eos; }
std::string Tokenizer::bos_token() const { return impl_->bos_str; }
std::string Tokenizer::eos_token() const { return impl_->eos_str; }
const std::string& Tokenizer::source() const { return impl_->source; }

// ====================================================================== shared finishing

namespace {

void push_unique(std::vector<int32_t>& v, int32_t id) {
  if (std::find(v.begin(), v.end(), id) == v.end()) v.push_back(id);
}

// HF ignores the ids written next to added tokens in tokenizer.json: AddedVocabulary::add_tokens
// gives a token the id its content already has (added or model vocabulary), else the next free
// id after the model vocabulary. Real files agree with that; we reproduce it so that a file
// where they disagree still encodes exactly as HF does.
void assign_hf_added_ids(Impl& t) {
  const auto model_size = static_cast<int32_t>(t.model_vocab.size());
  std::optional<int32_t> max_added;
  StrIdMap seen;
  std::vector<AddedToken> kept;
  for (auto& a : t.added) {
    if (a.content.empty()) continue;
    if (auto id = lookup(seen, a.content)) {
      a.id = *id;
    } else if (auto mid = lookup(t.model_vocab, a.content)) {
      a.id = *mid;
    } else {
      a.id = !max_added ? model_size : (*max_added >= model_size ? *max_added + 1 : model_size);
    }
    seen.emplace(a.content, a.id);
    max_added = std::max(max_added.value_or(a.id), a.id);
    kept.push_back(std::move(a));
  }
  t.added.swap(kept);
}

// Fills id_to_str / special flags / matchers from model_vocab and `added`.
void finish_vocab(Impl& t) {
  int32_t max_id = -1;
  for (const auto& [s, id] : t.model_vocab) max_id = std::max(max_id, id);
  for (const auto& a : t.added) max_id = std::max(max_id, a.id);
  t.id_to_str.assign(static_cast<size_t>(max_id + 1), std::string());
  t.special_flags.assign(static_cast<size_t>(max_id + 1), 0);
  t.added_flags.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [s, id] : t.model_vocab) t.id_to_str[id] = s;
  for (const auto& a : t.added) {
    t.id_to_str[a.id] = a.content;
    t.added_vocab[a.content] = a.id;
    if (a.special) t.special_flags[a.id] = 1;
    t.added_flags[a.id] = 1;
  }
  // Declaration order: for two tokens with the same text the first one wins, as in HF.
  for (size_t i = 0; i < t.added.size(); ++i) {
    const AddedToken& a = t.added[i];
    if (a.normalized) {
      // Normalized tokens are matched after normalization, so match their normalized form.
      // HF also uses that form as the token's string (id_to_token, and thus decoding: with a
      // Prepend normalizer "xyz" decodes as " xyz"), while token_to_id takes the content.
      const std::string pat = t.normalizer ? t.normalizer->normalize(a.content) : a.content;
      t.id_to_str[a.id] = pat;
      t.normalized_matcher.add(pat, static_cast<int32_t>(i));
    } else {
      t.raw_matcher.add(a.content, static_cast<int32_t>(i));
    }
  }
}

// ---------------------------------------------------------------------- tokenizer.json

std::string token_string(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return {};
}

Status parse_post_processor(const json& j, const Impl& t, const std::string& what, PostProcessor& pp) {
  if (j.is_null()) return Status::ok();
  if (!j.is_object()) return invalid_argument(what + ": post_processor must be an object");
  const std::string type = j.value("type", "");
  if (type == "ByteLevel") return Status::ok();  // only adjusts offsets
  if (type == "Sequence") {
    for (const auto& p : jget(j, "processors"))
      LARDER_RETURN_IF_ERROR(parse_post_processor(p, t, what, pp));
    return Status::ok();
  }
  if (type == "TemplateProcessing") {
    const json& single = jget(j, "single");
    const json& specials = jget(j, "special_tokens");
    bool seen_seq = false;
    for (const auto& item : single) {
      if (item.contains("Sequence")) {
        seen_seq = true;
        continue;
      }
      if (!item.contains("SpecialToken")) return invalid_argument(what + ": bad TemplateProcessing item");
      const std::string name = item["SpecialToken"].value("id", "");
      auto it = specials.find(name);
      if (it == specials.end() || !it->contains("ids"))
        return invalid_argument(what + ": TemplateProcessing names unknown special token '" + name + "'");
      for (const auto& id : (*it)["ids"]) (seen_seq ? pp.suffix : pp.prefix).push_back(id.get<int32_t>());
    }
    return Status::ok();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    // {"cls": ["[CLS]", 101], "sep": ["[SEP]", 102]}
    pp.prefix.push_back(j.at("cls").at(1).get<int32_t>());
    pp.suffix.push_back(j.at("sep").at(1).get<int32_t>());
    return Status::ok();
  }
  return unsupported(what + ": unsupported post_processor type '" + type + "'");
}

// tokenizer.json as a DOM, except model.vocab and model.merges (nearly all of the file: 260k
// entries and 500k merges for Gemma 3), which are streamed into flat vectors: building them as
// JSON maps and arrays first would triple load time and peak memory.
class TokenizerJsonSax {
 public:
  json root;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool has_vocab = false, has_merges = false;
  std::string error;

  bool null() { return value(json()); }
  bool boolean(bool b) { return value(json(b)); }
  bool number_integer(json::number_integer_t v) { return integer(v); }
  bool number_unsigned(json::number_unsigned_t v) {
    return integer(v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
  }
  bool number_float(json::number_float_t v, const std::string&) {
    if (mode() != kDom) return fail("model.vocab ids and merges must not be numbers with fractions");
    return value(json(v));
  }
  bool string(std::string& s) {
    switch (mode()) {
      case kVocab:
        return fail("model.vocab entry '" + stack_.back().key + "' has no integer id");
      case kMerges: {
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          return fail("merge '" + s + "' is not two tokens separated by one space");
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        return true;
      }
      case kMergePair:
        pair_.push_back(std::move(s));
        return true;
      case kDom:
        return value(json(std::move(s)));
    }
    return true;
  }
  bool binary(json::binary_t&) { return fail("binary values are not JSON"); }
  bool start_object(size_t) {
    if (mode() != kDom) return fail("model.vocab / model.merges hold an unexpected object");
    if (in_model() && stack_.back().key == "vocab") {
      has_vocab = true;
      stack_.push_back({nullptr, {}, kVocab});
      return true;
    }
    json* node = insert(json::object());
    stack_.push_back({node, {}, kDom});
    return true;
  }
  bool key(std::string& k) {
    stack_.back().key = std::move(k);
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(size_t) {
    if (mode() == kMerges) {
      pair_.clear();
      stack_.push_back({nullptr, {}, kMergePair});
      return true;
    }
    if (mode() != kDom) return fail("model.vocab / model.merges hold an unexpected array");
    if (in_model() && stack_.back().key == "merges") {
      has_merges = true;
      stack_.push_back({nullptr, {}, kMerges});
      return true;
    }
    json* node = insert(json::array());
    stack_.push_back({node, {}, kDom});
    return true;
  }
  bool end_array() {
    if (mode() == kMergePair) {
      if (pair_.size() != 2) return fail("merges must be strings or pairs of strings");
      merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(size_t pos, const std::string&, const nlohmann::detail::exception& e) {
    return fail(strfmt("not valid JSON (byte %zu: %s)", pos, e.what()));
  }

 private:
  enum Mode { kDom, kVocab, kMerges, kMergePair };
  struct Frame {
    json* node;
    std::string key;
    Mode mode;
  };
  Mode mode() const { return stack_.empty() ? kDom : stack_.back().mode; }
  // The container on top is the object under the top-level key "model".
  bool in_model() const { return stack_.size() == 2 && stack_[0].key == "model" && stack_[1].node->is_object(); }
  bool fail(std::string m) {
    if (error.empty()) error = std::move(m);
    return false;
  }
  bool integer(int64_t v) {
    switch (mode()) {
      case kVocab:
        if (v < 0 || v > INT32_MAX) return fail("model.vocab entry '" + stack_.back().key + "' has an invalid id");
        vocab.emplace_back(std::move(stack_.back().key), v);
        return true;
      case kMerges:
      case kMergePair:
        return fail("merges must be strings or pairs of strings");
      case kDom:
        return value(json(v));
    }
    return true;
  }
  bool value(json v) {
    if (mode() != kDom) return fail("model.vocab / model.merges hold an unexpected value");
    insert(std::move(v));
    return true;
  }
  json* insert(json v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    json* parent = stack_.back().node;
    if (parent->is_array()) {
      parent->push_back(std::move(v));
      return &parent->back();
    }
    json& slot = (*parent)[stack_.back().key];
    slot = std::move(v);
    return &slot;
  }

  std::vector<Frame> stack_;
  std::vector<std::string> pair_;
};

Result<std::unique_ptr<Impl>> load_hf(const std::string& path, const std::string& dir) {
  const std::string what = "[tokenizer] " + path;
  auto text = read_text_file(path);
  if (!text.is_ok()) return not_found(what + ": cannot read tokenizer.json (" + text.status().message() + ")");
  TokenizerJsonSax sax;
  if (!json::sax_parse(*text, &sax)) return corrupt(what + ": " + (sax.error.empty() ? "not valid JSON" : sax.error));
  const json& j = sax.root;
  if (!j.is_object()) return corrupt(what + ": top level is not a JSON object");
  auto t = std::make_unique<Impl>();
  t->source = "hf:" + path;
  try {
    const json& model = jget(j, "model");
    if (!model.is_object()) return corrupt(what + ": missing 'model'");
    const std::string type = model.value("type", sax.has_merges ? "BPE" : "");
    if (type != "BPE") return unsupported(what + ": unsupported model type '" + type + "' (only BPE)");
    if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0)
      return unsupported(what + ": BPE dropout is not supported");
    // Well-formed vocab/merges never reach the DOM (the SAX handler takes them).
    if (!sax.has_vocab || model.contains("vocab")) return corrupt(what + ": model.vocab must be an object");
    if (model.contains("merges")) return corrupt(what + ": model.merges must be an array");
    t->model_vocab.reserve(sax.vocab.size());
    for (auto& [tok, id] : sax.vocab) t->model_vocab[std::move(tok)] = static_cast<int32_t>(id);
    sax.vocab.clear();
    const auto& merges = sax.merges;
    BpeConfig cfg;
    cfg.byte_fallback = model.value("byte_fallback", false);
    cfg.fuse_unk = model.value("fuse_unk", false);
    cfg.ignore_merges = model.value("ignore_merges", false);
    if (model.contains("continuing_subword_prefix") && model["continuing_subword_prefix"].is_string())
      cfg.continuing_subword_prefix = model["continuing_subword_prefix"].get<std::string>();
    if (model.contains("end_of_word_suffix") && model["end_of_word_suffix"].is_string())
      cfg.end_of_word_suffix = model["end_of_word_suffix"].get<std::string>();
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      const std::string unk = model["unk_token"].get<std::string>();
      cfg.unk_id = lookup(t->model_vocab, unk);
    }
    std::string err;
    t->model = make_bpe(t->model_vocab, merges, cfg, &err);
    if (!t->model) return corrupt(what + ": " + err);

    for (const auto& a : jget(j, "added_tokens")) {
      AddedToken tok;
      tok.content = a.at("content").get<std::string>();
      tok.id = a.at("id").get<int32_t>();
      if (tok.id < 0) return corrupt(what + ": added token '" + tok.content + "' has a negative id");
      tok.special = a.value("special", false);
      tok.normalized = a.value("normalized", !tok.special);
      tok.lstrip = a.value("lstrip", false);
      tok.rstrip = a.value("rstrip", false);
      tok.single_word = a.value("single_word", false);
      t->added.push_back(std::move(tok));
    }

    LARDER_ASSIGN_OR_RETURN(t->normalizer, build_normalizer(jget(j, "normalizer"), what));
    LARDER_ASSIGN_OR_RETURN(t->pre_tokenizer, build_pre_tokenizer(jget(j, "pre_tokenizer"), what));
    LARDER_ASSIGN_OR_RETURN(t->decoder, build_decoder(jget(j, "decoder"), what));
    assign_hf_added_ids(*t);
    finish_vocab(*t);
    LARDER_RETURN_IF_ERROR(parse_post_processor(jget(j, "post_processor"), *t, what, t->post));

    // BOS/EOS names come from tokenizer_config.json (what transformers and chat templates use).
    const std::string cfg_path = dir + "/tokenizer_config.json";
    if (file_exists(cfg_path)) {
      auto ctext = read_text_file(cfg_path);
      if (!ctext.is_ok()) return ctext.status();
      json c = json::parse(*ctext, nullptr, false);
      if (c.is_discarded() || !c.is_object()) return corrupt("[tokenizer] " + cfg_path + ": not a valid JSON object");
      t->bos_str = token_string(jget(c, "bos_token"));
      t->eos_str = token_string(jget(c, "eos_token"));
    } else {
      if (t->post.prefix.size() == 1) t->bos_str = t->id_to_str[t->post.prefix[0]];
      if (t->post.suffix.size() == 1) t->eos_str = t->id_to_str[t->post.suffix[0]];
    }
    auto id_of = [&](const std::string& s) -> std::optional<int32_t> {
      if (s.empty()) return std::nullopt;
      if (auto id = lookup(t->added_vocab, s)) return id;
      return lookup(t->model_vocab, s);
    };
    t->bos = id_of(t->bos_str);
    if (auto e = id_of(t->eos_str)) push_unique(t->eos, *e);
    const std::string gen_path = dir + "/generation_config.json";
    if (file_exists(gen_path)) {
      auto gtext = read_text_file(gen_path);
      if (gtext.is_ok()) {
        json g = json::parse(*gtext, nullptr, false);
        if (g.is_object() && g.contains("eos_token_id")) {
          const json& e = g["eos_token_id"];
          if (e.is_number_integer()) push_unique(t->eos, e.get<int32_t>());
          if (e.is_array())
            for (const auto& x : e)
              if (x.is_number_integer()) push_unique(t->eos, x.get<int32_t>());
        }
      }
    }
    if (t->eos_str.empty() && !t->eos.empty()) t->eos_str = t->id_to_str[t->eos[0]];
  } catch (const json::exception& e) {
    return corrupt(what + ": unexpected JSON structure: " + e.what());
  }
  return t;
}

// ---------------------------------------------------------------------- GGUF

// Token types of tokenizer.ggml.token_type (llama.cpp's llama_token_type).
enum GgufTokenType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// The split regexes of each `tokenizer.ggml.pre`, applied in order (each split Isolated),
// as the HF tokenizers these vocabularies were converted from do it. Where llama.cpp rewrote a
// pattern for std::regex, the original tokenizer.json pattern is used: Oniguruma runs it as is.
struct PreSpec {
  std::vector<std::string> regexes;
  bool ignore_merges = false;
  bool add_bos = false;
  // The HF tokenizer NFC-normalizes first (Qwen2/2.5/3). llama.cpp skips that step; HF is the
  // reference, so we apply it (it only matters for text with decomposed characters).
  bool nfc = false;
};

const char* kLlama3Re =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* kQwen2Re =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* kGpt2Re = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

std::optional<PreSpec> pre_spec(const std::string& pre) {
  auto is = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (pre == n) return true;
    return false;
  };
  if (is({"default"}))
    return PreSpec{{"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2Re, "\\p{N}+", "[0-9][0-9][0-9]"}};
  if (is({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}))
    return PreSpec{{kLlama3Re}, true, true};
  if (is({"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"})) return PreSpec{{kLlama3Re}};
  if (is({"deepseek-llm"}))
    // Cased-letter classes spelled as code points: several of these characters (U+1F7D, U+1FBE,
    // U+2126, U+212A...) have singleton canonical decompositions, and an editor or tool that
    // NFC-normalizes source text would silently turn the ranges into different or empty ones.
    return PreSpec{{"[\\r\\n]",
                    "\\s?["
                    "\\x{0041}-\\x{005A}\\x{0061}-\\x{007A}\\x{00B5}\\x{00C0}-\\x{00D6}\\x{00D8}-\\x{00F6}"
                    "\\x{00F8}-\\x{01BA}\\x{01BC}-\\x{01BF}\\x{01C4}-\\x{0293}\\x{0295}-\\x{02AF}"
                    "\\x{0370}-\\x{0373}\\x{0376}-\\x{0377}\\x{037B}-\\x{037D}\\x{037F}\\x{0386}"
                    "\\x{0388}-\\x{038A}\\x{038C}\\x{038E}-\\x{03A1}\\x{03A3}-\\x{03F5}\\x{03F7}-\\x{0481}"
                    "\\x{048A}-\\x{052F}\\x{0531}-\\x{0556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
                    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"
                    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
                    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"
                    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"
                    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"
                    "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"
                    "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"
                    "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}-\\x{2184}"
                    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}-\\x{2CF3}"
                    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"
                    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"
                    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
                    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
                    "\\x{1E900}-\\x{1E943}"
                    "]+",
                    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
                    "\\s+$", "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", "\\p{N}+"}};
  if (is({"deepseek-coder"}))
    return PreSpec{{"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"}};
  if (is({"deepseek-v3", "hunyuan-dense"}))
    return PreSpec{{"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
                    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}};
  if (is({"falcon"})) return PreSpec{{"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2Re, "[0-9][0-9][0-9]"}};
  if (is({"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}))
    return PreSpec{{"\\p{N}", kGpt2Re}};
  if (is({"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es", "jina-v2-de",
          "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
          "a.x-4.0", "mellum"}))
    return PreSpec{{kGpt2Re}};
  if (is({"qwen2", "deepseek-r1-qwen"})) return PreSpec{{kQwen2Re}, false, false, true};
  if (is({"megrez", "stablelm2", "hunyuan", "grok-2"})) return PreSpec{{kQwen2Re}};
  if (is({"poro-chat", "bloom", "gpt3-finnish"})) return PreSpec{{" ?[^(\\s|.,!?…。，、।۔،)]+"}};
  if (is({"viking"})) return PreSpec{{" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"}};
  if (is({"tekken"}))
    return PreSpec{{"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
                    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| "
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
                   true, true};
  if (is({"gpt-4o", "llama4", "minimax-m2"}))
    return PreSpec{{"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}};
  if (is({"seed-coder"}))
    return PreSpec{{"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}};
  if (is({"chameleon"}))
    return PreSpec{{"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
                    "[\\p{P}!-/:-@\\[-`{-~]", kGpt2Re},
                   false, true};
  return std::nullopt;
}

std::optional<int64_t> gguf_int(const formats::GgufFile& g, const char* key) {
  const formats::GgufValue* v = g.find(key);
  if (!v || !v->is_int()) return std::nullopt;
  return v->i;
}

std::optional<bool> gguf_bool(const formats::GgufFile& g, const char* key) {
  const formats::GgufValue* v = g.find(key);
  if (!v || v->is_array() || v->is_string() || v->is_float()) return std::nullopt;
  return v->i != 0;
}

Result<std::unique_ptr<Impl>> load_gguf(const formats::GgufFile& g) {
  const std::string what = "[tokenizer] " + g.path();
  auto t = std::make_unique<Impl>();
  t->source = "gguf:" + g.path();
  const std::string model = g.get_string("tokenizer.ggml.model").value_or("");
  if (model.empty()) return not_found(what + ": no tokenizer.ggml.model (the file carries no vocabulary)");
  if (model != "llama" && model != "gpt2" && model != "bert") {
    const char* kind = model == "t5" ? " (Unigram)" : model == "rwkv" ? " (RWKV trie)" : "";
    return unsupported(what + ": unsupported GGUF tokenizer model '" + model + "'" + kind +
                       "; supported: llama (SPM), gpt2 (BPE), bert (WordPiece)");
  }
  const formats::GgufValue* toks = g.find("tokenizer.ggml.tokens");
  if (!toks || !toks->is_array() || toks->strs.empty()) return corrupt(what + ": tokenizer.ggml.tokens missing or empty");
  const std::vector<std::string>& tokens = toks->strs;
  const size_t n = tokens.size();
  std::vector<int64_t> types(n, kNormal);
  if (const auto* tt = g.find("tokenizer.ggml.token_type"); tt && tt->ints.size() == n) types = tt->ints;

  auto valid_id = [&](const char* key) -> std::optional<int32_t> {
    auto v = gguf_int(g, key);
    if (!v || *v < 0 || *v >= static_cast<int64_t>(n)) return std::nullopt;
    return static_cast<int32_t>(*v);
  };
  const auto unk = valid_id("tokenizer.ggml.unknown_token_id");

  for (size_t i = 0; i < n; ++i) {
    if (tokens[i].empty()) continue;
    // The first id of a duplicated string wins lookups.
    t->model_vocab.emplace(tokens[i], static_cast<int32_t>(i));
  }

  bool add_bos = false, add_eos = false;
  if (model == "llama") {
    std::vector<float> scores(n, 0.0f);
    if (const auto* sc = g.find("tokenizer.ggml.scores"); sc && sc->floats.size() == n)
      for (size_t i = 0; i < n; ++i) scores[i] = static_cast<float>(sc->floats[i]);
    const bool add_space_prefix = gguf_bool(g, "tokenizer.ggml.add_space_prefix").value_or(true);
    t->model = make_spm(t->model_vocab, scores, unk);
    t->normalizer = make_spm_normalizer(add_space_prefix);
    t->decoder = make_spm_decoder(add_space_prefix);
    add_bos = true;
  } else if (model == "bert") {
    t->model = make_wpm(t->model_vocab, unk);
    t->normalizer = make_bert_normalizer();
    t->pre_tokenizer = make_bert_pre_tokenizer();
    t->decoder = make_spm_decoder(true);  // word starts carry U+2581: same text rules as SPM
  } else {
    const std::string pre = g.get_string("tokenizer.ggml.pre").value_or("default");
    auto spec = pre_spec(pre);
    if (!spec) return unsupported(what + ": unsupported GGUF pre-tokenizer '" + pre + "'");
    const formats::GgufValue* mv = g.find("tokenizer.ggml.merges");
    if (!mv || !mv->is_array()) return corrupt(what + ": BPE vocabulary without tokenizer.ggml.merges");
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(mv->strs.size());
    for (const auto& m : mv->strs) {
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) return corrupt(what + ": merge '" + m + "' has no separating space");
      merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    BpeConfig cfg;
    cfg.ignore_merges = spec->ignore_merges;
    cfg.unk_id = unk;
    t->model = make_bpe(t->model_vocab, merges, cfg, nullptr);  // lenient, as llama.cpp
    LARDER_ASSIGN_OR_RETURN(t->pre_tokenizer, make_regex_byte_level(spec->regexes));
    if (spec->nfc) {
      LARDER_ASSIGN_OR_RETURN(t->normalizer, build_normalizer(json{{"type", "NFC"}}, what));
    }
    t->decoder = make_byte_level_decoder();
    add_bos = spec->add_bos;
  }
  add_bos = gguf_bool(g, "tokenizer.ggml.add_bos_token").value_or(add_bos);
  add_eos = gguf_bool(g, "tokenizer.ggml.add_eos_token").value_or(add_eos);

  // Control, user-defined and unknown tokens are recognized inside text (llama.cpp's
  // "parse_special"), never split by the model.
  for (size_t i = 0; i < n; ++i) {
    const int64_t ty = types[i];
    if ((ty != kControl && ty != kUserDefined && ty != kUnknown) || tokens[i].empty()) continue;
    AddedToken a;
    a.content = tokens[i];
    a.id = static_cast<int32_t>(i);
    a.special = ty != kUserDefined;
    a.normalized = false;
    t->added.push_back(std::move(a));
  }
  finish_vocab(*t);

  t->bos = valid_id("tokenizer.ggml.bos_token_id");
  if (t->bos) t->bos_str = tokens[*t->bos];
  if (auto e = valid_id("tokenizer.ggml.eos_token_id")) push_unique(t->eos, *e);
  if (auto e = valid_id("tokenizer.ggml.eot_token_id")) push_unique(t->eos, *e);
  if (auto e = valid_id("tokenizer.ggml.eom_token_id")) push_unique(t->eos, *e);
  // End-of-turn tokens known by name (llama.cpp does the same for older conversions).
  for (const char* name : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                           "<|eom_id|>", "<EOT>", "<|end_of_text|>", "<｜end▁of▁sentence｜>"}) {
    auto id = lookup(t->model_vocab, name);
    if (id && types[*id] == kControl) push_unique(t->eos, *id);
  }
  if (!t->eos.empty()) t->eos_str = tokens[t->eos[0]];
  if (model == "bert") {
    // BERT wraps the sequence as [CLS] ... [SEP].
    const auto cls = valid_id("tokenizer.ggml.cls_token_id");
    const auto sep = valid_id("tokenizer.ggml.seperator_token_id");
    if (!t->bos && cls) {
      t->bos = cls;
      t->bos_str = tokens[*cls];
    }
    if (gguf_bool(g, "tokenizer.ggml.add_bos_token").value_or(true) && cls) t->post.prefix.push_back(*cls);
    if (gguf_bool(g, "tokenizer.ggml.add_sep_token").value_or(true) && sep) t->post.suffix.push_back(*sep);
    if (t->eos.empty() && sep) {
      t->eos.push_back(*sep);
      t->eos_str = tokens[*sep];
    }
  } else {
    if (add_bos && t->bos) t->post.prefix.push_back(*t->bos);
    if (add_eos) {
      if (auto e = valid_id("tokenizer.ggml.eos_token_id")) t->post.suffix.push_back(*e);
    }
  }
  return t;
}

bool ends_with(const std::string& s, std::string_view suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_hf_dir(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  if (!file_exists(path)) return not_found("[tokenizer] " + dir + ": no tokenizer.json in this directory");
  LARDER_ASSIGN_OR_RETURN(auto impl, load_hf(path, dir));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_hf_file(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  if (!file_exists(path)) return not_found("[tokenizer] " + path + ": file not found");
  LARDER_ASSIGN_OR_RETURN(auto impl, load_hf(path, dir));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const formats::GgufFile& gguf) {
  LARDER_ASSIGN_OR_RETURN(auto impl, load_gguf(gguf));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_path(const std::string& path) {
  if (is_directory(path)) return from_hf_dir(path);
  if (ends_with(path, ".gguf")) {
    LARDER_ASSIGN_OR_RETURN(auto g, formats::GgufFile::open(path));
    return from_gguf(*g);
  }
  if (ends_with(path, ".json")) return from_hf_file(path);
  return invalid_argument("[tokenizer] " + path + ": expected a directory with tokenizer.json or a .gguf file");
}

// ====================================================================== StreamDecoder

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special) : tok_(&tok), skip_special_(skip_special) {
  const Impl& im = tok.impl();
  streamable_ = !im.decoder || im.decoder->streamable();
}

void StreamDecoder::reset() {
  window_.clear();
  carry_.clear();
  started_ = false;
}

std::string StreamDecoder::emit(std::string raw, bool final) {
  std::string all = std::move(carry_);
  all += raw;
  carry_.clear();
  const size_t cut = final ? all.size() : utf8::complete_prefix(all);
  carry_ = all.substr(cut);
  all.resize(cut);
  return utf8::make_valid(all);
}

std::string StreamDecoder::push(int32_t id) {
  const Impl& im = tok_->impl();
  if (id < 0 || static_cast<size_t>(id) >= im.id_to_str.size()) return {};
  if (skip_special_ && im.special_flags[id]) return {};
  window_.push_back(id);
  // Hold while the text may still change: the decoder needs the whole sequence, or the last
  // token is a byte-fallback byte (a run of them decodes as a unit).
  if (!streamable_ || im.is_byte_token(id)) return {};
  std::string raw = im.decode_raw(window_.data(), window_.size(), skip_special_, started_);
  // Nothing produced yet: keep the tokens, so the first-token rules see them again next time.
  if (raw.empty() && !started_) return {};
  window_.clear();
  started_ = true;
  return emit(std::move(raw), false);
}

std::string StreamDecoder::flush() {
  const Impl& im = tok_->impl();
  std::string raw;
  if (!window_.empty()) raw = im.decode_raw(window_.data(), window_.size(), skip_special_, started_);
  std::string out = emit(std::move(raw), true);
  reset();
  return out;
}

}  // namespace larder::tokenizer
