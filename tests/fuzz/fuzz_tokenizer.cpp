// fuzz_tokenizer — text through real Hugging Face tokenizers (tokenizer/: UTF-8 repair,
// normalizers, the pre-tokenizers' Oniguruma splits, ByteLevel/Metaspace, BPE with byte fallback,
// added/special tokens), and back through decode and the streaming detokenizer. Input byte 0
// picks the tokenizer (qwen3: byte-level BPE with a lookahead regex; llama3: byte-level with a
// different split; llama2: SentencePiece-style BPE with byte fallback), byte 1 bit 0 asks for
// special tokens; the rest is the text.
//
// Checked property (tokenizer.h): the StreamDecoder's pieces concatenate to decode(ids).
#include <cstdio>
#include <memory>
#include <vector>

#include "fuzz_util.h"
#include "larder/tokenizer/tokenizer.h"

using namespace larder;

namespace {

std::vector<std::unique_ptr<tokenizer::Tokenizer>> load() {
  std::vector<std::unique_ptr<tokenizer::Tokenizer>> out;
  for (const char* name : {"qwen3", "llama3", "llama2"}) {
    auto t = tokenizer::Tokenizer::from_hf_dir(fuzz::shared_dir() + "/tokenizers/hf/" + name);
    if (!t.is_ok()) {
      std::fprintf(stderr, "fuzz_tokenizer: %s\n", t.status().to_string().c_str());
      std::abort();
    }
    out.push_back(std::move(*t));
  }
  return out;
}

}  // namespace

std::vector<std::unique_ptr<tokenizer::Tokenizer>> toks;

// Loading (three tokenizer.json files, seconds under ASan) runs before libFuzzer's per-input timer.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet();
  toks = load();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const tokenizer::Tokenizer& tok = *toks[data[0] % toks.size()];
  const bool special = data[1] & 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const std::vector<int32_t> ids = tok.encode(text, special);
  for (int32_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  for (const bool skip : {false, true}) {
    const std::string whole = tok.decode(ids, skip);
    tokenizer::StreamDecoder sd(tok, skip);
    std::string streamed;
    for (int32_t id : ids) streamed += sd.push(id);
    streamed += sd.flush();
    if (streamed != whole) {
      std::fprintf(stderr, "stream decode differs from decode (skip_special=%d):\n  decode: %s\n  stream: %s\n", skip,
                   whole.c_str(), streamed.c_str());
      std::abort();
    }
  }
  return 0;
}
