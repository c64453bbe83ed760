// layer_spec.h — what one layer of a model is: the unit of model and of per-sequence state.
//
// Families differ per layer (model-families.md §1): Gemma 3 interleaves sliding-window and
// global attention with different RoPE bases, Gemma 4 changes head_dim per layer kind, Qwen3.5
// puts recurrent layers between attention layers. Each architecture file declares its layers as
// LayerSpecs; the shared stack (transformer.h) runs them, attention (blocks/attention.h) reads
// the spec for shapes, RoPE table, scale and window, and the model's per-sequence state
// (memory/sequence_state.h) has one slot per spec, of the kind the spec implies.
#pragma once

#include <cstdint>
#include <span>

#include "larder/memory/sequence_state.h"

namespace larder::models {

enum class LayerKind : uint8_t {
  kFull,       // causal attention over every earlier token: plain KV
  kSliding,    // a key at distance < window is visible: a ring of the window
  kRecurrent,  // SSM / gated DeltaNet: constant-size recurrent state
};
const char* layer_kind_name(LayerKind k);

// Which of the optional norms a layer has (the input norm is always there).
struct LayerNorms {
  bool qk = false;         // per-head RMSNorm of q and k before RoPE (qwen3, gemma3)
  bool post_attn = false;  // on the attention output before the residual add (gemma "sandwich")
  bool post_ffn = false;   // on the MLP output before the residual add
  bool v = false;          // per-head RMSNorm of v without a gain (gemma4)
};

struct LayerSpec {
  LayerKind kind = LayerKind::kFull;
  int64_t window = 0;  // kSliding
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int rope_dim = 0;     // rotated dims per head (<= head_dim)
  int rope = 0;         // index of the model's RoPE frequency table this layer rotates with
  float attn_scale = 0;  // softmax scale (1/sqrt(head_dim), or 1/sqrt(query_pre_attn_scalar))
  LayerNorms norms;
  // Values are the keys' projection (no v_proj; k_norm/RoPE apply to keys only): Gemma 4's
  // `attention_k_eq_v` global layers.
  bool k_eq_v = false;
  // KV sharing (Gemma 4 `num_kv_shared_layers`): >= 0 makes this layer attend over the K/V that
  // layer `kv_source` (an earlier layer of the same kind and shape) wrote in this forward. It has
  // no K/V projections and no state slot of its own. Sharing layers come after every layer that
  // owns state, so state slot i is layer i (state_schema_of checks it).
  int kv_source = -1;
};

// The per-sequence state the layers need, one slot per layer that owns state (every layer but
// the KV-sharing ones, which come last).
memory::StateSchema state_schema_of(std::span<const LayerSpec> layers);

}  // namespace larder::models
