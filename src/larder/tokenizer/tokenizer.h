// tokenizer.h — text <-> token ids, exactly as the reference tokenizers do it.
//
// Two sources:
//   * HF `tokenizer.json` (+ tokenizer_config.json, generation_config.json when present):
//     BPE models with byte-level or SentencePiece-style (Metaspace / Replace+Prepend, byte
//     fallback) pipelines; encoding equals the HF `tokenizers` library token for token.
//   * GGUF vocabularies (`tokenizer.ggml.*`): SPM ("llama", score-driven merges), BPE
//     ("gpt2", rank-driven merges with the pre-tokenizer named by `tokenizer.ggml.pre`) and
//     BERT WordPiece ("bert"), equal to the HF tokenizers the GGUFs were converted from.
//     Other models (t5/Unigram, rwkv, ...) and unknown pre-tokenizer names are kUnsupported.
// A Tokenizer is immutable after loading, so one instance may be shared by many threads.
//
// tokenizer.json components implemented (each with HF's exact semantics, quirks included):
//   model: BPE (byte_fallback, fuse_unk, ignore_merges, continuing_subword_prefix,
//          end_of_word_suffix; no dropout)
//   normalizer: NFC, NFD, NFKC, NFKD, Lowercase, Replace (string/regex), Prepend, Strip, Sequence
//   pre_tokenizer: Split (string/regex, all five behaviors, invert), ByteLevel, Metaspace,
//          Digits, Whitespace, WhitespaceSplit, Sequence
//   post_processor: TemplateProcessing (single), ByteLevel, Bert/Roberta, Sequence
//   decoder: ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace, Sequence (none: " "-join)
//   added tokens: special/normalized/lstrip/rstrip/single_word, leftmost-longest matching.
// Anything else (Unigram/WordPiece models, Precompiled/Bert normalizers, ...) is refused at
// load with StatusCode::kUnsupported naming the component.
// add_special follows the tokenizer.json post-processor, as HF `tokenizers` does;
// tokenizer_config.json only supplies the BOS/EOS names (bos_id(), eos_ids()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "larder/core/status.h"

namespace larder::formats {
class GgufFile;
}

namespace larder::tokenizer {

namespace detail {
struct Impl;
}

class Tokenizer {
 public:
  // Directory with tokenizer.json (+ optional tokenizer_config.json, generation_config.json).
  static Result<std::unique_ptr<Tokenizer>> from_hf_dir(const std::string& dir);
  // A tokenizer.json file itself (config files are looked up next to it).
  static Result<std::unique_ptr<Tokenizer>> from_hf_file(const std::string& tokenizer_json_path);
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const formats::GgufFile& gguf);
  // A directory (HF files) or a .gguf file, whichever `path` is.
  static Result<std::unique_ptr<Tokenizer>> from_path(const std::string& path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Special/added-token strings inside `text` are always recognized. add_special: apply the
  // post-processor (BOS/EOS as the tokenizer says) — same as HF
  // `encode(text, add_special_tokens=...)`. Invalid UTF-8 in `text` is replaced by U+FFFD
  // (one per maximal invalid subpart, as Python's `bytes.decode("utf-8", "replace")`) first.
  std::vector<int32_t> encode(std::string_view text, bool add_special) const;
  // == HF `Tokenizer.decode(ids, skip_special_tokens)`; ids outside the vocabulary are dropped.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // The bytes token `id` adds to a text it continues (not the first token: a SentencePiece
  // leading space is kept), raw — possibly part of a UTF-8 character. Pieces of consecutive
  // generated tokens concatenate to their decoded text (logprobs, /tokenize with_pieces).
  std::string token_bytes(int32_t id) const;
  int32_t vocab_size() const;  // highest id + 1, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // the vocab string ("" if out of range)
  bool is_special(int32_t id) const;          // added special / control token
  // An added token (tokenizer.json added_tokens; GGUF control, user-defined and unknown types):
  // only its own text, matched whole, encodes to it — the model's merges never produce it.
  bool is_added(int32_t id) const;
  std::optional<int32_t> bos_id() const;      // per tokenizer_config / gguf metadata
  std::vector<int32_t> eos_ids() const;       // all EOS-like ids the tokenizer names
  std::string bos_token() const;              // "" if none
  std::string eos_token() const;              // the primary EOS string, "" if none

  // Where the tokenizer came from, for messages ("hf:<path>" / "gguf:<path>").
  const std::string& source() const;

  const detail::Impl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::unique_ptr<detail::Impl> impl);
  std::unique_ptr<detail::Impl> impl_;
};

// Incremental detokenizer: push ids one at a time, get back only complete UTF-8 text, never
// half a character; flush() at the end. The concatenated output equals
// tokenizer.decode(all ids, skip_special) (SentencePiece leading-space stripping, byte-fallback
// runs and byte-level multi-token characters included). The tokenizer must outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false);
  std::string push(int32_t id);
  std::string flush();
  // Forget everything (as if newly constructed).
  void reset();

 private:
  // Emits the complete characters of `raw` and keeps an unfinished UTF-8 tail for later.
  std::string emit(std::string raw, bool final);

  const Tokenizer* tok_;
  bool skip_special_;
  std::vector<int32_t> window_;  // ids whose text is not final yet
  std::string carry_;            // bytes of an unfinished UTF-8 character
  bool started_ = false;         // text was produced before `window_` (no first-token rules)
  bool streamable_ = true;       // false: the decoder needs the whole sequence (hold to flush)
};

}  // namespace larder::tokenizer
