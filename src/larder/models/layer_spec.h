// layer_spec.h — what one layer of a model is: the unit of model and of per-sequence state.
//
// Families differ per layer (model-families.md §1): Gemma 3 interleaves sliding-window and
// global attention with different RoPE bases, Gemma 4 changes head_dim per layer kind, Qwen3.5
// puts recurrent layers between attention layers. Each architecture file declares its layers as
// LayerSpecs; the shared stack (transformer.h) runs them, attention (blocks/attention.h) reads
// the spec for shapes, RoPE table, scale and window, and the model's per-sequence state
// (memory/sequence_state.h) has one slot per spec: the state the spec declares, copied whole.
//
// A layer is a mixer (attention of a kind, or a gated DeltaNet), an FFN and the state it keeps.
#pragma once

#include <cstdint>
#include <span>

#include "larder/memory/sequence_state.h"

namespace larder::models {

// The mixer: what moves information between positions.
enum class LayerKind : uint8_t {
  kFull,        // causal attention over every earlier token: plain KV
  kSliding,     // a key at distance < window is visible: a ring of the window
  kGatedDelta,  // gated DeltaNet (Qwen3.5, Qwen3-Next): a conv window + an f32 recurrent matrix
};
const char* layer_kind_name(LayerKind k);

// The feed-forward part: a dense gated MLP, or routed experts (a mixture of experts: a router
// picks k of E gated MLPs per token, blocks/moe_block.h).
enum class FfnKind : uint8_t { kDense, kRoutedExperts };
const char* ffn_kind_name(FfnKind k);

// Shapes of a routed-experts FFN: E experts of intermediate size `ffn`, k of them per token, and
// (Qwen3-Next / Qwen3.5-MoE) a shared expert of `shared_ffn` that every token runs (0: none).
struct ExpertDims {
  int n_experts = 0, k = 0;
  int64_t ffn = 0;
  int64_t shared_ffn = 0;
};

// Shapes of a gated-DeltaNet mixer (kernels/gated_delta.h): H_k key heads of d_k, H_v value
// heads of d_v (a multiple of H_k), a depthwise causal conv of `conv_kernel` taps over the
// q | k | v channels. Value heads are grouped by key head (HF, mlx-lm: v head h reads key head
// h / (H_v/H_k)) unless `tiled_v_heads` (llama.cpp's GGUF converter reorders every per-value-head
// tensor so v head h reads key head h % H_k, for ggml's broadcast).
struct GatedDeltaDims {
  int n_k_heads = 0, n_v_heads = 0, d_k = 0, d_v = 0, conv_kernel = 0;
  bool tiled_v_heads = false;
  int64_t key_dim() const { return int64_t{n_k_heads} * d_k; }
  int64_t value_dim() const { return int64_t{n_v_heads} * d_v; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// Which of the optional norms a layer has (the input norm is always there).
struct LayerNorms {
  bool qk = false;         // per-head RMSNorm of q and k before RoPE (qwen3, gemma3)
  bool post_attn = false;  // on the attention output before the residual add (gemma "sandwich")
  bool post_ffn = false;   // on the MLP output before the residual add
  bool v = false;          // per-head RMSNorm of v without a gain (gemma4)
};

struct LayerSpec {
  LayerKind kind = LayerKind::kFull;  // the mixer
  FfnKind ffn = FfnKind::kDense;
  ExpertDims experts;  // kRoutedExperts
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
  // Attention with an output gate (Qwen3.5 / Qwen3-Next full attention): q_proj emits, per head,
  // head_dim query values then head_dim gate values, and the output is o_proj(attn ⊙ σ(gate)).
  bool attn_gate = false;
  GatedDeltaDims delta;  // kGatedDelta
  // What this layer keeps per sequence, declared with the layer (declare_state) and copied whole
  // into the model's StateSchema: nothing about a layer's state is re-derived elsewhere.
  memory::LayerStateSpec state;
};

// Fills spec.state from the mixer and its shapes (call once the spec is complete): plain KV for
// full attention, a ring of the window for sliding attention, conv window + recurrent matrix for
// a gated DeltaNet.
void declare_state(LayerSpec& spec);

// The per-sequence state the layers need, one slot per layer that owns state (every layer but
// the KV-sharing ones, which come last): each layer's declared state, whole.
memory::StateSchema state_schema_of(std::span<const LayerSpec> layers);

}  // namespace larder::models
