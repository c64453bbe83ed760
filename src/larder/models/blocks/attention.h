// attention.h — the self-attention block of the Llama family and its variants:
// q/k/v projections (+ optional bias: qwen2, llama attention_bias), optional per-head RMSNorm of
// q and k before RoPE (qwen3), RoPE, append K/V to the cache, causal GQA attention over the
// cache's spans, output projection.
#pragma once

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

// out[n, hidden] = attention(h[n, hidden]) for tokens at positions[0..n) = cache.length() + t;
// writes their K/V rows into `layer` of the cache (reserved by the caller; not yet advanced).
void attention_block(const AttentionContext& ctx, const AttentionWeights& w, const float* h, int64_t n,
                     const int64_t* positions, int layer, memory::KvCache& cache, AttentionScratch& s, float* out);

}  // namespace larder::models
