// gated_delta.h — the gated-DeltaNet mixer of hybrid models (Qwen3.5, Qwen3-Next; model-families.md
// §4), over the kernels of kernels/gated_delta.h and the layer's RecurrentState slot:
//   qkv = silu(conv1d(in_proj_qkv(h)))   the conv window carried in the slot's conv state
//   q, k = l2norm per key head (q · d_k^-½);  log_g, β from in_proj_a / in_proj_b, A_log, dt_bias
//   y = gated delta rule over the slot's f32 matrix;  out = out_proj(rmsnorm(y) · silu(in_proj_z(h)))
// Qwen3-Next fuses the input projections per key head: in_proj_qkvz rows are, for each key head g,
// [q_g (d_k) | k_g (d_k) | v of its H_v/H_k value heads | z of them], and in_proj_ba rows [b of
// them | a of them] (mlx-lm qwen3_next.py fix_query_key_value_ordering). Either is bound where the
// file has it (HF, MLX, llama.cpp's legacy GGUF `ssm_in`; GGUF `ssm_ba`) and its output split into
// the qkv / z / b / a order above after the projection (a copy of a few hundred floats per row).
// Projections run once over the batch's rows; conv and recurrence per sequence on its own state.
// The recurrent form runs for prefill and decode alike, so a sequence's result does not depend on
// how its tokens are cut into calls (kernels/gated_delta.h: bit-identical).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "larder/kernels/ops.h"
#include "larder/models/blocks/attention.h"
#include "larder/models/blocks/projection.h"
#include "larder/models/layer_spec.h"
#include "larder/models/weights.h"

namespace larder::models {

struct GatedDeltaWeights {
  Projection qkv, z, b, a, out;  // in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj
  Projection qkvz, ba;           // Qwen3-Next's fused forms, bound instead of qkv + z / b + a
  bool fused_qkvz = false, fused_ba = false;
  std::vector<float> conv;                // [conv_dim, kernel]
  std::vector<float> a_log, dt_bias;      // [H_v]
  std::vector<float> norm;                // [d_v] gated RMSNorm gain, as stored
  float eps = 1e-6f;
};

struct GatedDeltaScratch {
  std::vector<float> qkv, conv, z, a, b, log_g, beta, y;
  std::vector<float> qkvz, ba;  // the fused projections' outputs before they are split
  std::vector<float> tiled;  // tiled_v_heads: q, k repeated per value head, then v
};

// prefix: "model.layers.N.linear_attn." (canonical HF names). `a_log_is_a`: the file stores
// A = −exp(A_log) instead of A_log (llama.cpp's GGUF `ssm_a`); converted back here.
Status bind_gated_delta(WeightBinder& b, const std::string& prefix, const LayerSpec& spec, int64_t hidden, float eps,
                        bool a_log_is_a, GatedDeltaWeights* out);

struct GatedDeltaCall {
  const LayerSpec* spec = nullptr;
  const GatedDeltaWeights* w = nullptr;
  int layer = 0;             // its RecurrentState slot
  const float* h = nullptr;  // [rows, hidden] normed input
  int64_t rows = 0;
  std::span<const AttentionSeq> seqs;
  AdapterRows adapters;  // the rows' adapter deltas (LayerBatch::adapters)
};

// out[rows, hidden]; each sequence's slot absorbs its rows (conv state, matrix, advance).
void gated_delta_block(const GatedDeltaCall& call, GatedDeltaScratch& s, float* out);

}  // namespace larder::models
