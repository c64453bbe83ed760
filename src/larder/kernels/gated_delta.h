// gated_delta.h — the Gated DeltaNet kernels of hybrid models (Qwen3.5, Qwen3-Next): the linear
// attention layers that keep a fixed-size recurrent state instead of a KV cache
// (design/model-families.md §4). Math as mlx-lm computes it (mlx_lm/models/gated_delta.py,
// qwen3_5.py); per layer and token batch x[n, hidden]:
//
//   qkv = in_proj_qkv(x)                      [n, 2·H_k·d_k + H_v·d_v]  (q | k | v per token)
//   qkv = silu(causal_conv1d(qkv))            depthwise, kernel K, carried state  → causal_conv1d
//   q   = l2norm(q)·d_k^-½,  k = l2norm(k)    per key head, eps 1e-6 on Σx²       → l2norm_heads
//   log_g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b)     [n, H_v]          → gated_delta_gates
//   y, S = gated delta rule(q, k, v, log_g, β, S)                  [n, H_v, d_v]     → gated_delta_recurrent
//   y   = rmsnorm(y, w, eps)·silu(z)           per value head                       → rmsnorm_gated
//
// The state S of one value head is a [d_v, d_k] f32 matrix (mlx-lm's orientation: state
// [B, H_v, D_v, D_k]); per token, with g = exp(log_g):
//   S ← g·S;  kv = S·k;  δ = (v − kv)·β;  S ← S + δ ⊗ k  (S[i][j] += δ[i]·k[j]);  y = S·q.
// GQA: value head h reads key head h / (H_v / H_k) — mlx-lm's mx.repeat(q, H_v/H_k, axis=-2),
// each key head serving a run of consecutive value heads (not interleaved).
//
// Each row S[i] evolves on its own (it reads k, q, v[i], g, β only), which the kernels use: the
// recurrent form keeps a row in registers for the whole call. All ops forward through the
// dispatch table (dispatch.h); kernels/ref/gated_delta.cpp is the oracle.
#pragma once

#include <cstdint>

namespace larder::kernels {

// Depthwise causal conv1d over channels, with the last K−1 inputs carried between calls.
struct CausalConv1dParams {
  int64_t channels = 0;
  int kernel = 0;                 // K >= 1
  const float* weight = nullptr;  // [channels, K]: HF conv1d.weight [C, 1, K] (mlx [C, K, 1]), same bytes
  const float* bias = nullptr;    // [channels], or nullptr (the Qwen3.5 family has none)
  bool silu = false;              // out = silu(conv) (the family's SiLU after the conv)
};

// out[t][c] = Σ_j weight[c][j] · in[t + j][c] (+ bias[c]), in = state ++ x (K−1 + n rows), i.e. the
// current token meets tap K−1 (mlx/PyTorch cross-correlation over a left-padded sequence).
// x, out: [n, channels]; out must not overlap x. state: [K−1, channels], oldest row first, zeros
// for a fresh sequence; on return it holds the last K−1 rows of `in`. Every output element is the
// same sum in the same order however the tokens are split into calls (bit-identical).
void causal_conv1d(const float* x, int64_t n, const CausalConv1dParams& p, float* state, float* out);

// In place over x[n tokens][heads × dim] with `stride` floats between tokens (>= heads·dim; the
// q or k part of the conv output row): each head's vector v ← v · scale / sqrt(Σv² + eps). The family
// uses eps = 1e-6 and scale d_k^-½ for q, 1 for k (mlx-lm normalize_qk: rms_norm with eps/d_k,
// times d_k^-½ twice for q, once for k — the same function).
struct L2NormParams {
  int heads = 0;
  int dim = 0;
  int64_t stride = 0;
  float eps = 1e-6f;
  float scale = 1.0f;
};
void l2norm_heads(float* x, int64_t n, const L2NormParams& p);

// The per-token decay and write strength of each value head, from the in_proj_a / in_proj_b
// outputs a, b [n, n_v_heads]: log_g = −exp(A_log[h])·softplus(a + dt_bias[h]) (<= 0; the log of
// mlx-lm's compute_g, kept in log space so the chunked form's cumulative decays never underflow to
// 0/0), beta = sigmoid(b). A_log, dt_bias: [n_v_heads]. Outputs [n, n_v_heads].
struct GatedDeltaGateParams {
  int n_v_heads = 0;
  const float* a_log = nullptr;
  const float* dt_bias = nullptr;
};
void gated_delta_gates(const float* a, const float* b, int64_t n, const GatedDeltaGateParams& p, float* log_g,
                       float* beta);

struct GatedDeltaShape {
  int n_k_heads = 0;  // H_k
  int n_v_heads = 0;  // H_v, a multiple of H_k
  int d_k = 0;
  int d_v = 0;
};

// One call's inputs: n tokens. q, k: [n][H_k·d_k] and v: [n][H_v·d_v], each with `qkv_stride`
// floats between tokens (0: dense rows; the conv output row length when they are views into it).
// q, k as l2norm_heads leaves them (q carries the d_k^-½ readout scale). log_g, beta: [n, H_v].
struct GatedDeltaInputs {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t qkv_stride = 0;
  const float* log_g = nullptr;
  const float* beta = nullptr;
  int64_t n = 0;
  int64_t pos0 = 0;  // absolute position of the first token (the chunked form's chunk grid)
};

// The recurrence token by token: y [n, H_v, d_v]; state [H_v, d_v, d_k] f32, updated in place
// (zeros for a fresh sequence). Decode (n = 1) and prefill alike: the form to use for both on CPU.
// Bit-identical however the tokens are split into calls (the state is f32 between tokens in every
// tier, and each (row, token) step is the same arithmetic); thread-count independent. The
// reference accumulates its dot products in double; fast tiers in f32 (within 1e-6 relative:
// tests/unit/kernels_fast/gated_delta_fast_test.cpp). One thread on Zen 5, H_v = 32,
// d_k = d_v = 128 (a Qwen3.5-9B layer; bench/RESULTS.md session 36): prefill 512 tokens in 13–14.5 ms
// CPU (AVX-512, ~27 µs per token, 53–59 % of the FMA pipes) or 23–26 ms (AVX2); decode ~105 µs
// (AVX-512) or 140–175 µs (AVX2) per token with the state cold (a 2 MiB state read and written, at
// one core's read bandwidth).
//
// Prefill uses this form too, not gated_delta_chunked: "one prompt, one answer" — the same output
// whether a prompt is prefilled in one call, many, or decoded token by token — needs the state
// rounded to f32 after every token, which the chunked form does not do (it rounds once per chunk,
// so it can equal the recurrence only within a tolerance, and a decode step after it cannot
// reproduce its bits). Measured, the chunked form has nothing to win on CPU that would pay for
// that: per token it issues 3·d_k·d_v + C·(d_k + d_v) FMAs (C = 64: 65 536 at d = 128) — as many
// vector operations as the recurrence's 3 FMAs + 1 multiply per state element — so its only gain
// is a GEMM's pipe utilisation over the recurrence's 53–59 %: at most ~1.6× on an op that is ~5 % of
// a Qwen3.5-2B prefill (18 layers × ~8 ms CPU per 512 tokens = 0.14 s, against ~3 CPU-seconds of
// the rest), so ~2 % of the prefill.
void gated_delta_recurrent(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y);

// The same recurrence in chunks of kGatedDeltaChunk tokens on a grid of absolute positions
// (chunks start at multiples of kGatedDeltaChunk; a call starting mid-chunk runs the rest of that
// chunk first): within a chunk, the WY form — δ_i = β_i(v_i − e^{L_i}·S₀k_i − Σ_{j<i} e^{L_i−L_j}(k_i·k_j)δ_j),
// y_i = e^{L_i}·S₀q_i + Σ_{j≤i} e^{L_i−L_j}(q_i·k_j)δ_j, S = e^{L_C}S₀ + Σ_j e^{L_C−L_j} δ_j⊗k_j with L the
// cumulative log decays inside the chunk — so the state is rounded to f32 once per chunk, not per token.
// Equal to gated_delta_recurrent within a rounding tolerance (it reorders sums;
// tests/unit/kernels/gated_delta_ref_test.cpp). Bit-identical across call splits that fall on the
// chunk grid (pos0 and the split a multiple of kGatedDeltaChunk); a split inside a chunk changes
// the rounding of the tokens after it in that chunk and of the state, not the math — so a prefix
// cache could resume it bit-exactly only at grid positions. Reference only (no fast tier, and no
// caller: prefill runs gated_delta_recurrent, see there why); it defines and tests the chunked math
// for a backend where a chunk's matmuls are what is fast (a GPU), which would then also have to
// decode in chunk form — keeping the chunk's start state and its pending k, δ — to keep one
// prompt's answer independent of how it was split.
constexpr int64_t kGatedDeltaChunk = 64;
void gated_delta_chunked(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y);

// Gated RMSNorm (Qwen3NextRMSNormGated): per row of `dim`,
// out = (x / sqrt(mean(x²) + eps) rounded to f32) · weight · silu(z). x, z, out: [rows, dim];
// out may alias x. weight [dim] is used as stored (this norm's checkpoint weight has no +1 shift).
void rmsnorm_gated(const float* x, const float* z, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* out);

}  // namespace larder::kernels
