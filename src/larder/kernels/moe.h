// moe.h — the kernels of routed mixtures of experts: top-k routing and the grouped expert matmul.
//
// A MoE layer routes each token to k of E experts (route_topk: router logits → ids + weights),
// runs each selected expert's MLP on it (matmul_experts: gate/up over the token's row, down over
// the (token, slot)'s hidden row) and sums the k results by weight. Expert weights stay where the
// file maps them (GGUF `ffn_*_exps` [E, rows, cols], MLX `switch_mlp.*` stacked the same way, HF
// checkpoints one tensor per expert): an ExpertsView is one WeightView per expert, so every
// layout is described without a copy (models/weights.h WeightBinder::experts builds it).
#pragma once

#include <cstdint>

#include "larder/kernels/ops.h"

namespace larder::kernels {

// How a family turns router logits [E] into k (id, weight) pairs (mlx-lm's code for each):
//   Qwen3-MoE, Qwen3-Next / Qwen3.5-MoE: softmax over E, top k of the probabilities, then, with
//       norm_topk_prob, weights / Σ weights          {kSoftmaxThenTopK, kLastK, renormalize}
//   GPT-OSS (logits = router(x) with its bias): top k of the logits, softmax over the k
//                                                    {kTopKThenSoftmax, kLastK}
//   Gemma 4: top k of the logits, softmax over the k, times per_expert_scale[id]
//                                                    {kTopKThenSoftmax, kLastK, expert_scale}
//   Mixtral: argpartition(-logits, k-1)[:k], softmax over the k
//                                                    {kTopKThenSoftmax, kFirstKOfNegated}
//   OLMoE: softmax over E, argpartition(-p, k-1)[:k], optional renormalisation
//                                                    {kSoftmaxThenTopK, kFirstKOfNegated}
enum class RouteOrder { kSoftmaxThenTopK, kTopKThenSoftmax };
// Which k ids, and in which order, mlx's argpartition hands out. On mlx's CPU, argpartition is
// libstdc++'s std::nth_element over the indices 0..E-1 ordered by (value, index), so both the
// choice among equal values at the k-th place and the order of the k ids are nth_element's;
// route_topk runs the same nth_element with the same order, so its ids equal mlx's — ties
// included (tests/ref/moe_route_reference.py checks ids exactly, also on tied logits).
//   kLastK:           argpartition(v, kth=E-k)[E-k:]   (Qwen3, Qwen3-Next, GPT-OSS, Gemma 4)
//   kFirstKOfNegated: argpartition(-v, kth=k-1)[:k]    (Mixtral, OLMoE)
// The order matters downstream only through the f32 sum of the k expert outputs.
enum class RouteSelect { kLastK, kFirstKOfNegated };

struct RouteParams {
  int n_experts = 0;  // E
  int k = 0;          // experts per token, 1 <= k <= E
  RouteOrder order = RouteOrder::kSoftmaxThenTopK;
  RouteSelect select = RouteSelect::kLastK;
  bool renormalize = false;               // norm_topk_prob: weights / Σ of the k weights
  const float* expert_scale = nullptr;    // [E] or null: weight *= expert_scale[id] (last)
};

// ids[n, k], weights[n, k] from logits[n, E] (f32). A NaN logit ranks as −∞ (mlx leaves it
// unspecified); the ids stay k distinct experts whatever the logits hold.
// Weights: softmax and renormalisation in double, rounded once, then the f32 scale (mlx: f32
// throughout, its own exp), so they match mlx-lm within a few f32 ulps, and ids exactly.
void route_topk(const float* logits, int64_t n, const RouteParams& p, int32_t* ids, float* weights);

// E matrices of one format and shape [rows, cols] (every view's dtype, bits, group_size,
// scale_dtype, rows and cols equal): expert e is experts[e].
struct ExpertsView {
  const WeightView* experts = nullptr;
  int n_experts = 0;
};

// The selected experts' products: y[n, k, rows] with
//   y[t, j] = x_row(t, j) · experts[ids[t, j]]ᵀ,
// where x_row(t, j) = x[t] (x: [n, cols]; gate/up, every slot reads its token's row) or, with
// x_per_slot, x[t·k + j] (x: [n, k, cols]; down, each slot reads its own hidden row).
// The (token, slot) pairs are grouped by expert; groups of at most 8 rows (decode) run as one
// pool job over (expert, row range) pieces — each piece the active tier's matmul of that expert's
// row slice over the group's rows, so only the selected experts' bytes are read and the layer
// forks and joins once per matrix, not once per expert — and larger groups (prefill) as one GEMM
// per expert (kernels::matmul). A group's result equals kernels::matmul of its expert over its
// rows, bit for bit (tests/unit/kernels_fast/moe_fast_test.cpp). ids must be in [0, n_experts).
void matmul_experts(const ExpertsView& w, const float* x, bool x_per_slot, int64_t n, const int32_t* ids, int k,
                    float* y);

// Several expert matrices over the same inputs and routes (gate and up): ys[i] as
// matmul_experts(ws[i], ..., ys[i]) for i < count (<= kMaxMultiMatmul; every ws[i] with the same
// n_experts and cols, formats and rows may differ), bit for bit, with the decode pieces of all of
// them in one pool job: a MoE layer forks and joins once for gate/up and once for down.
void matmul_experts_multi(const ExpertsView* ws, float* const* ys, int count, const float* x, bool x_per_slot,
                          int64_t n, const int32_t* ids, int k);

}  // namespace larder::kernels
