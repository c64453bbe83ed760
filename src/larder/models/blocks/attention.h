// attention.h — the self-attention block shared by every attention layer:
// q/k/v projections (+ optional bias: qwen2, llama attention_bias), optional per-head RMSNorm of
// q and k before RoPE (qwen3, gemma3), RoPE with the layer's table, the K/V write into the
// layer's slot of each sequence state, causal GQA attention over the spans that slot hands out
// (plain KV: shared prefix + private tail; ring: up to two spans of the window, plus the chunk's
// own rows), output projection. Shapes, scale, window and RoPE table come from the LayerSpec.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "larder/kernels/ops.h"
#include "larder/memory/sequence_state.h"
#include "larder/models/adapter.h"
#include "larder/models/blocks/norm.h"
#include "larder/models/blocks/projection.h"
#include "larder/models/config.h"
#include "larder/models/layer_spec.h"
#include "larder/models/weights.h"

namespace larder::models {

struct AttentionOptions {
  bool qkv_bias = false;  // biases on q/k/v (not o): qwen2
  kernels::RopePairing pairing = kernels::RopePairing::kHalf;
};

struct AttentionWeights {
  Projection q, k, v, o;  // biases per bind_attention; k/v unbound in a KV-sharing layer, v in a k_eq_v one
  RmsNorm q_norm, k_norm;  // empty unless spec.norms.qk
  RmsNorm v_norm;          // spec.norms.v: unit gain (the reference's norm has no weight)
  // Attention sinks (gpt-oss `self_attn.sinks`): [n_heads] logits in each head's softmax
  // denominator (kernels::AttentionParams::sinks); empty: none. Bound by the family.
  std::vector<float> sinks;
};

// KV sharing (LayerSpec::kv_source): what a source layer whose state is a ring attended over in
// this forward, per sequence in batch order, kept for the layers that share its K/V — by the time
// they run, the ring has absorbed the chunk and may have dropped rows the chunk's first queries
// still see. A plain source needs no copy: its KvCache holds every row.
struct KvKeep {
  std::vector<float> k, v;  // rows [start, start + len) of [n_kv_heads * head_dim]
  int64_t start = 0, len = 0;
};

struct AttentionScratch {
  std::vector<float> q, k, v, att;
  std::vector<float> qg, gate;  // spec.attn_gate: q_proj's [query | gate] rows, and the gate
  std::vector<memory::KvSpan> spans;
  std::vector<kernels::KvSpanView> views;
  // Per sequence, when the sequences of a batch are attended in parallel (attention.cpp).
  std::vector<std::vector<memory::KvSpan>> seq_spans;
  std::vector<std::vector<kernels::KvSpanView>> seq_views;
};

// prefix: "model.layers.N.self_attn." (canonical HF names; the binder's table maps them).
// Biases: q/k/v with opt.qkv_bias or c.attention_bias, o with c.attention_bias. A KV-sharing
// spec binds q and o only; a k_eq_v spec has no v_proj.
Status bind_attention(WeightBinder& b, const std::string& prefix, const LayerSpec& spec, const ModelConfig& c,
                      const AttentionOptions& opt, AttentionWeights* out);

// Rows [row0, row0 + n) of a batched attention call belong to one sequence with this state;
// their positions are state.length() + 0 .. n-1.
struct AttentionSeq {
  int64_t row0 = 0, n = 0;
  memory::SequenceState* state = nullptr;
};

// One attention call: the layer, its weights, the batch's rows and where they go. Families build
// it with designated initializers, so a new need is a new field, not a longer argument list.
struct AttentionCall {
  const LayerSpec* spec = nullptr;
  const AttentionOptions* opt = nullptr;
  const float* inv_freq = nullptr;  // the RoPE table spec->rope names
  const AttentionWeights* w = nullptr;
  int layer = 0;                    // the model layer (its state slot, unless spec->kv_source >= 0)
  const float* h = nullptr;         // [rows, hidden] normed input
  int64_t rows = 0;
  const int64_t* positions = nullptr;  // row r's position in its own sequence
  std::span<const AttentionSeq> seqs;
  // KV sharing: a source layer's call fills it (ring slots only), a sharing layer's call reads it.
  std::vector<KvKeep>* keep = nullptr;
  AdapterRows adapters;  // the rows' adapter deltas, for every projection (LayerBatch::adapters)
};

// out[rows, hidden] = attention(h[rows, hidden]) where the rows are the concatenation of the
// sequences' new tokens (positions[r] is row r's position in its own sequence). Projections run
// once over all rows; RoPE, the K/V write into slot `layer` of each state and causal attention
// run per sequence. A plain slot's rows are written into its KvCache (reserved by the caller,
// published by the caller's advance); a ring slot is read first and then absorbs the new rows
// (its memory stays at the window).
// KV sharing: a spec with kv_source >= 0 projects only q and attends over slot kv_source (a plain
// slot in place; a ring slot through `keep`, which the source layer's call filled). A source
// layer's call fills `keep` when given one (ring slots only).
// Output gate (spec.attn_gate): q_proj's rows per head are [query | gate]; the attention output
// is multiplied by σ(gate) before o_proj.
void attention_block(const AttentionCall& call, AttentionScratch& s, float* out);

}  // namespace larder::models
