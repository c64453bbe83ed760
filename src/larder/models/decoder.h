// decoder.h — the pre-norm decoder stack shared by the Llama-style architectures:
//   x = embed(tokens)
//   per layer: x += attn(rmsnorm(x)); x += mlp(rmsnorm(x))
//   logits = lm_head(rmsnorm(x))      (lm_head = embed when tied)
// Architecture files (llama.cpp, qwen2.cpp, qwen3.cpp) describe their differences in a
// DecoderSpec and call make_decoder; a new member of the family is one such file plus one
// registry line.
#pragma once

#include <memory>

#include "larder/formats/model_files.h"
#include "larder/kernels/ops.h"
#include "larder/models/config.h"
#include "larder/models/model.h"

namespace larder::models {

struct DecoderSpec {
  bool qkv_bias = false;       // q/k/v projections carry a bias (qwen2)
  bool qk_norm = false;        // per-head RMSNorm of q and k before RoPE (qwen3)
  bool default_tied = false;   // tie_word_embeddings when config.json does not say
  // RoPE pairing for each source. HF checkpoints pair (i, i + d/2) ("rotate_half"). llama.cpp's
  // converter permutes the Q/K rows of `llama` models so the GGUF pairs adjacent dims
  // (interleaved), while it leaves qwen2/qwen3 unpermuted (NeoX pairing).
  kernels::RopePairing hf_pairing = kernels::RopePairing::kHalf;
  kernels::RopePairing gguf_pairing = kernels::RopePairing::kHalf;
};

Result<std::unique_ptr<Model>> make_decoder(const formats::ModelFiles& files, ModelConfig config,
                                            const DecoderSpec& spec);

}  // namespace larder::models
