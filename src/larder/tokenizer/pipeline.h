// pipeline.h — the stages of a tokenizer, mirroring the HF `tokenizers` data model:
//   added-token split -> normalizer -> pre-tokenizer -> model -> post-processor   (encode)
//   ids -> token strings -> decoder chain                                          (decode)
// Internal to the tokenizer layer; the public surface is tokenizer.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/core/status.h"
#include "larder/tokenizer/regex.h"

namespace larder::tokenizer::detail {

// std::string keys looked up by string_view without a temporary allocation.
struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StrIdMap = std::unordered_map<std::string, int32_t, StrHash, std::equal_to<>>;

// j[key] without copying (json::value() returns a copy: a deep one for a 30 MB vocabulary);
// a null json when the key is absent or j is not an object.
inline const nlohmann::json& jget(const nlohmann::json& j, const char* key) {
  static const nlohmann::json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

inline std::optional<int32_t> lookup(const StrIdMap& m, std::string_view key) {
  auto it = m.find(key);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

// Rust char::is_whitespace (the White_Space property).
bool is_unicode_space(char32_t cp);
// "<0xAB>" -> 0xAB; -1 for any other token.
int byte_token_value(std::string_view t);

// GPT-2's reversible byte <-> printable-character table.
struct ByteLevelTable {
  std::string byte_to_str[256];   // UTF-8 of the character standing for each byte
  std::unordered_map<char32_t, uint8_t> cp_to_byte;
  static const ByteLevelTable& get();
};

// ---------------------------------------------------------------- normalizers
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string s) const = 0;
};

// ---------------------------------------------------------------- pre-tokenizers
// A pre-tokenizer refines a list of pieces; every piece is later tokenized on its own.
// `at_start` says the first piece begins the original input (Metaspace "first" needs it).
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void split(std::vector<std::string>& pieces, bool at_start) const = 0;
};

// How a Split pattern's matches become pieces (HF SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
// Splits `s` by matches [b,e) (sorted, disjoint) per `behavior`; appends non-empty pieces.
void split_by_matches(std::string_view s, const std::vector<std::pair<size_t, size_t>>& matches,
                      SplitBehavior behavior, bool invert, std::vector<std::string>& out);

// ---------------------------------------------------------------- models
class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of one pre-tokenized piece.
  virtual void tokenize(std::string_view piece, std::vector<int32_t>& out) const = 0;
};

// BPE with a rank per merge (HF BPE; GGUF "gpt2" vocabularies).
// `vocab` is referenced, not copied: it must outlive the model.
struct BpeConfig {
  bool byte_fallback = false;
  bool ignore_merges = false;  // a piece that is itself a vocab entry is taken whole
  bool fuse_unk = false;
  std::optional<int32_t> unk_id;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
};
std::unique_ptr<Model> make_bpe(const StrIdMap& vocab,
                                const std::vector<std::pair<std::string, std::string>>& merges,
                                BpeConfig cfg, std::string* error);

// SentencePiece BPE driven by piece scores (GGUF "llama" vocabularies), as llama.cpp does it.
// `vocab` (text -> id, first id of a duplicated text) is referenced and must outlive the model;
// scores are indexed by id.
std::unique_ptr<Model> make_spm(const StrIdMap& vocab, const std::vector<float>& scores,
                                std::optional<int32_t> unk_id);

// ---------------------------------------------------------------- decoders
// Decoders rewrite the list of token strings, as HF decode_chain does. Strings may hold raw
// bytes (ByteLevel output); the final text is the concatenation made valid UTF-8.
// `continuation` means tokens were decoded before this list (streaming): rules that apply
// only to the very first token (Strip start, Metaspace prefix space) are then skipped.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens, bool continuation) const = 0;
  // True if the output of earlier tokens can be emitted before later tokens are known, given
  // the rules above (only Strip from the end prevents it).
  virtual bool streamable() const { return true; }
  // Byte-fallback tokens ("<0x41>") combine with their neighbours; streaming must hold them.
  virtual bool holds_byte_tokens() const { return false; }
};

// ---------------------------------------------------------------- post-processor
struct PostProcessor {
  std::vector<int32_t> prefix;  // ids before the sequence when add_special
  std::vector<int32_t> suffix;  // ids after it
};

// ---------------------------------------------------------------- added tokens
struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool normalized = false;
  bool lstrip = false, rstrip = false, single_word = false;
};

// Leftmost-longest matcher over a set of strings (a byte trie).
class TokenMatcher {
 public:
  void add(std::string_view pattern, int32_t token_index);
  bool empty() const { return nodes_.size() <= 1; }
  // Longest pattern starting at s[pos]: returns token index and sets *len, or -1.
  int32_t longest_at(std::string_view s, size_t pos, size_t* len) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;  // sorted by byte
    int32_t token = -1;
  };
  std::vector<Node> nodes_{Node{}};
  bool first_byte_[256] = {};
};

// Result of splitting text around added tokens: either text (id < 0) or a token.
struct Segment {
  std::string text;
  int32_t id = -1;
  bool at_start = false;  // text segment that begins the input
};

// ---------------------------------------------------------------- the whole tokenizer
struct Impl {
  std::string source;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<Decoder> decoder;  // null: tokens joined with " " (HF default)
  PostProcessor post;

  std::vector<std::string> id_to_str;  // model vocab and added tokens, by id
  StrIdMap model_vocab;
  StrIdMap added_vocab;
  std::vector<AddedToken> added;        // in declaration order
  std::vector<uint8_t> special_flags;   // by id
  std::vector<uint8_t> added_flags;     // by id: an added token (matched whole, never made by the model)
  TokenMatcher raw_matcher;             // added tokens matched on the raw text
  TokenMatcher normalized_matcher;      // added tokens matched after normalization

  std::optional<int32_t> bos;
  std::vector<int32_t> eos;
  std::string bos_str, eos_str;

  void split_added(const TokenMatcher& m, std::string_view text, bool at_start,
                   std::vector<Segment>& out) const;
  std::vector<int32_t> encode(std::string_view text, bool add_special) const;
  // Token strings of `ids` (unknown ids dropped; specials dropped if skip_special).
  std::vector<std::string> tokens_of(const int32_t* ids, size_t n, bool skip_special) const;
  // Decoded bytes before the final UTF-8 repair.
  std::string decode_raw(const int32_t* ids, size_t n, bool skip_special, bool continuation) const;
  bool is_byte_token(int32_t id) const;
};

// Builders for each JSON section; `what` prefixes error messages ("[tokenizer] <path>").
Result<std::unique_ptr<Normalizer>> build_normalizer(const nlohmann::json& j, const std::string& what);
Result<std::unique_ptr<PreTokenizer>> build_pre_tokenizer(const nlohmann::json& j,
                                                          const std::string& what);
Result<std::unique_ptr<Decoder>> build_decoder(const nlohmann::json& j, const std::string& what);

// Direct constructors used by the GGUF loader.
std::unique_ptr<Normalizer> make_spm_normalizer(bool add_space_prefix);
std::unique_ptr<Decoder> make_spm_decoder(bool strip_leading_space);
std::unique_ptr<Decoder> make_byte_level_decoder();
// BERT (WordPiece) as GGUF stores it, where word-initial pieces carry U+2581 and continuation
// pieces have no "##": HF BertNormalizer (clean text, pad CJK, strip accents, lowercase) and
// BertPreTokenizer (split on whitespace, isolate punctuation), then greedy longest match.
std::unique_ptr<Normalizer> make_bert_normalizer();
std::unique_ptr<PreTokenizer> make_bert_pre_tokenizer();
std::unique_ptr<Model> make_wpm(const StrIdMap& vocab, std::optional<int32_t> unk_id);
// Regex splits in sequence (each Isolated), then byte-level mapping without its own regex.
Result<std::unique_ptr<PreTokenizer>> make_regex_byte_level(const std::vector<std::string>& regexes);

}  // namespace larder::tokenizer::detail
