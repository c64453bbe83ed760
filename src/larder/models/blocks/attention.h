// attention.h — the self-attention block of the Llama family and its variants:
// q/k/v projections (+ optional bias: qwen2, llama attention_bias), optional per-head RMSNorm of
// q and k before RoPE (qwen3), RoPE, append K/V to the cache, causal GQA attention over the
// cache's spans, output projection.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "larder/kernels/ops.h"
#include "larder/memory/kv_cache.h"
#include "larder/models/blocks/norm.h"
#include "larder/models/config.h"
#include "larder/models/weights.h"

namespace larder::models {

struct AttentionOptions {
  bool qkv_bias = false;  // biases on q/k/v (not o): qwen2
  bool qk_norm = false;   // RMSNorm over head_dim on q and k: qwen3
  kernels::RopePairing pairing = kernels::RopePairing::kHalf;
};

struct AttentionWeights {
  kernels::WeightView q, k, v, o;
  std::vector<float> q_b, k_b, v_b, o_b;
  RmsNorm q_norm, k_norm;  // empty unless qk_norm
};

struct AttentionScratch {
  std::vector<float> q, k, v, att;
  std::vector<memory::KvSpan> spans;
  std::vector<kernels::KvSpanView> views;
};

// prefix: "model.layers.N.self_attn."
Status bind_attention(WeightBinder& b, const std::string& prefix, const ModelConfig& c, const AttentionOptions& opt,
                      AttentionWeights* out);

struct AttentionContext {
  const ModelConfig* config;
  const AttentionOptions* options;
  const float* inv_freq;  // [rope_dim/2]
};

// Rows [row0, row0 + n) of a batched attention call belong to one sequence with this cache;
// their positions are cache.length() + 0 .. n-1.
struct AttentionSeq {
  int64_t row0 = 0, n = 0;
  memory::KvCache* cache = nullptr;
};

// out[rows, hidden] = attention(h[rows, hidden]) where the rows are the concatenation of the
// sequences' new tokens (positions[r] is row r's position in its own sequence). Projections run
// once over all rows; RoPE, the K/V write into `layer` of each cache (reserved by the caller,
// not yet advanced) and causal attention run per sequence.
void attention_block(const AttentionContext& ctx, const AttentionWeights& w, const float* h, int64_t rows,
                     const int64_t* positions, int layer, std::span<const AttentionSeq> seqs, AttentionScratch& s,
                     float* out);

}  // namespace larder::models
