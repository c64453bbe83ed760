// llama.cpp — the llama model file: Llama 1/2/3/3.1/3.2 (GQA, llama3 rope scaling, tied or
// untied embeddings, optional attention/mlp bias) and Mistral (same graph).
//
// Source-specific details:
// - HF checkpoints rotate pairs (i, i + d/2); llama.cpp's convert_hf_to_gguf permutes the Q/K
//   rows of llama models back to Meta's interleaved layout, so GGUF llama pairs (2i, 2i+1).
//   llama2.c-trained models (stories*) are interleaved natively and converted unpermuted.
// - HF LlamaConfig's default is tie_word_embeddings = false (Llama 3.2 1B/3B set it true).
// - Mistral v0.1's `sliding_window: 4096` is not applied (mlx-lm's llama graph ignores it too);
//   results differ from HF only past 4096 tokens. Later Mistrals set it to null.
#include "larder/models/decoder.h"
#include "larder/models/registry.h"

namespace larder::models {

Result<std::unique_ptr<Model>> load_llama(const formats::ModelFiles& files, ModelConfig config) {
  DecoderSpec spec;
  spec.default_tied = false;
  spec.hf_pairing = kernels::RopePairing::kHalf;
  spec.gguf_pairing = kernels::RopePairing::kInterleaved;
  return make_decoder(files, std::move(config), spec);
}

}  // namespace larder::models
