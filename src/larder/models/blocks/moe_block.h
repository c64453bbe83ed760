// moe_block.h — the routed-experts FFN (mixture of experts) of one layer:
//   logits = router(h) [E];  (ids, weights) = route_topk(logits)   (k of E experts per token)
//   out = Σ_j weights[j] · down_ids[j](act(gate_ids[j](h)) ⊙ up_ids[j](h))
//         [+ σ(shared_gate · h) · shared_mlp(h)]   (a shared expert: Qwen3-Next, Qwen3.5-MoE)
// Gemma 4 norms h twice on the way in: the router reads rmsnorm(h)·(scale·hidden^-0.5) and the
// experts pre_feedforward_layernorm_2(h) (MoeWeights::router_norm / expert_norm), and scales each
// selected weight by per_expert_scale (RouteParams::expert_scale).
// The experts run through the grouped kernels (kernels/moe.h): gate and up of every selected
// (token, slot) in one matmul_experts_multi, down in one matmul_experts, so a decode step reads
// only the selected experts' rows and forks the thread pool twice per layer.
// gpt-oss adds a bias to the router and to each expert's gate/up/down rows, and its own activation
// (Activation::kSwigluOai, mlx-lm `swiglu_oai`, transformers `GptOssExperts._apply_gate`;
// kernels::swiglu_oai):
//   g = min(gate, limit);  u = clip(up, −limit, limit);  act = (u + 1) · g · σ(alpha · g)
#pragma once

#include <string>
#include <vector>

#include "larder/kernels/moe.h"
#include "larder/kernels/ops.h"
#include "larder/models/blocks/mlp.h"
#include "larder/models/blocks/norm.h"
#include "larder/models/layer_spec.h"
#include "larder/models/weights.h"

namespace larder::models {

struct MoeWeights {
  // Movable, not copyable: shared_gate may view shared_gate_f32 (a move keeps the buffer).
  MoeWeights() = default;
  MoeWeights(MoeWeights&&) = default;
  MoeWeights& operator=(MoeWeights&&) = default;
  MoeWeights(const MoeWeights&) = delete;
  MoeWeights& operator=(const MoeWeights&) = delete;

  Activation act = Activation::kSilu;
  kernels::RouteParams route;                       // E, k, order, renormalisation
  Projection router;                                // [E, hidden]
  std::vector<kernels::WeightView> gate, up, down;  // E each: [ffn, hidden], [ffn, hidden], [hidden, ffn]
  // Instead of gate and up (which are then empty): E matrices [2·ffn, hidden] with gate and up
  // rows interleaved — row 2i is gate row i, row 2i + 1 up row i — as OpenAI's gpt-oss checkpoints
  // store them (`experts.gate_up_proj_blocks`). No view of the stacked experts selects every other
  // row, so they run fused in place: one grouped matmul of 2·ffn rows, whose output moe_block splits
  // into gate and up (slots × 2·ffn floats a layer, nothing copied at load).
  std::vector<kernels::WeightView> gate_up;
  bool has_shared = false;
  MlpWeights shared;                 // [shared_ffn, hidden] ...
  Projection shared_gate;            // [1, hidden]
  std::vector<float> shared_gate_f32;  // its storage where it is a float tensor (GGUF stores it [hidden])
  // Optional input norms (empty weight: none; Gemma 4 has both): the router reads
  // router_norm(h), the experts expert_norm(h).
  RmsNorm router_norm, expert_norm;
  std::vector<float> expert_scale_f32;  // route.expert_scale's storage (Gemma 4 per_expert_scale)
  // Per-expert biases (gpt-oss; empty: none): [E, ffn] on gate and up, [E, hidden] on down.
  std::vector<float> gate_bias, up_bias, down_bias;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;  // Activation::kSwigluOai
  // Experts the file holds in a layout that cannot be viewed in place (gpt-oss's transformers
  // layout, [E, in, out]): their transposed f32 copy, which gate/up/down view.
  std::vector<float> owned_f32;
  // Bytes of all E experts' gate/up/down, and of the k a token reads (k/E of them).
  uint64_t expert_bytes() const;
  uint64_t active_expert_bytes() const;
};

struct MoeScratch {
  std::vector<float> router_in, expert_in;
  std::vector<float> logits, weights, g, u, gu, y, shared_y, shared_g;
  std::vector<int32_t> ids;
  MlpScratch shared;
};

// Where a family's tensors are: `prefix` is "model.layers.N.mlp."; the router is
// `<prefix><names.router>` (default `gate.weight`), the experts stacked
// `<prefix><names.stacked>{gate,up,down}_proj.weight` (default `switch_mlp.`; MLX,
// and GGUF `ffn_*_exps` through the family's TensorNames), fused `<prefix>experts.gate_up_proj`
// [E, 2·ffn, hidden] + `<prefix>experts.down_proj` (transformers 5 / Qwen3.5-MoE HF checkpoints) or
// one per expert `<prefix>experts.{i}.{gate,up,down}_proj.weight` (HF); with d.shared_ffn the
// shared expert `<prefix>shared_expert.{gate,up,down}_proj.weight` and its gate
// `<prefix>shared_expert_gate.weight` [1, hidden]. OpenAI's MXFP4 layout (gpt-oss on Hugging Face)
// is bound where the file has `<prefix>experts.gate_up_proj_blocks`: gate/up as MoeWeights::gate_up,
// `experts.down_proj_{blocks,scales}`, and with names.biases `experts.gate_up_proj_bias` [E, 2·ffn]
// (interleaved like the rows; split once, it is E·2·ffn floats) and `experts.down_proj_bias`.
struct MoeTensorNames {
  std::string router = "gate";  // the router projection's module; Gemma 4: "router.proj" under "model.layers.N."
  std::string stacked = "switch_mlp.";  // Gemma 4 (MLX): "experts.switch_glu."; gpt-oss: "experts."
  // gpt-oss: the router's `<router>.bias` [E] and the experts' `<stacked>{gate,up,down}_proj.bias`
  // ([E, ffn], [E, ffn], [E, hidden]) are bound too.
  bool biases = false;
  // The experts are bound already (MoeWeights::gate/up/down and biases, e.g. from a layout that
  // needed a copy): bind_moe binds the router only.
  bool experts_bound = false;
};
Status bind_moe(WeightBinder& b, const std::string& prefix, const ExpertDims& d, int64_t hidden,
                const kernels::RouteParams& route, Activation act, MoeWeights* out,
                const MoeTensorNames& names = {});
// out[n, hidden] = moe(h[n, hidden]). Each row's result depends on that row only (routing, the
// grouped kernels' per-expert matmuls and the weighted sum in slot order).
void moe_block(const MoeWeights& w, const float* h, int64_t n, MoeScratch& s, float* out, AdapterRows adapters = {});

}  // namespace larder::models
