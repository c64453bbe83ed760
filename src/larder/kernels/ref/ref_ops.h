// ref_ops.h — scalar reference kernels: the oracle for every faster tier.
//
// Rules for this folder: plain loops, no intrinsics, no cleverness. Dot products and reductions
// accumulate in double: a product of two floats is exact in double, so the only rounding left is
// the final cast to float, which makes these kernels a near-exact oracle (a fast kernel
// accumulating in f32 is then compared with an f32-accumulation tolerance). The cost is nil in
// scalar code (neither float nor double reductions vectorize without -ffast-math).
#pragma once

#include "larder/kernels/dispatch.h"
#include "larder/kernels/moe.h"
#include "larder/kernels/ops.h"

namespace larder::kernels::ref {

// Per-format row dequantization (out[w.cols]).
void dequant_row_f32(const WeightView& w, int64_t row, float* out);
void dequant_row_f16(const WeightView& w, int64_t row, float* out);
void dequant_row_bf16(const WeightView& w, int64_t row, float* out);
void dequant_row_q8_0(const WeightView& w, int64_t row, float* out);
void dequant_row_q4_0(const WeightView& w, int64_t row, float* out);

// GGUF block decoding, shared with tests: `blocks` consecutive 32-element blocks.
void dequant_q8_0(const uint8_t* src, int64_t blocks, float* out);
void dequant_q4_0(const uint8_t* src, int64_t blocks, float* out);

// Q4_1, Q5_0, Q5_1, IQ4_NL (ref/quant32.cpp): `blocks` consecutive 32-element blocks.
void dequant_row_q4_1(const WeightView& w, int64_t row, float* out);
void dequant_row_q5_0(const WeightView& w, int64_t row, float* out);
void dequant_row_q5_1(const WeightView& w, int64_t row, float* out);
void dequant_row_iq4_nl(const WeightView& w, int64_t row, float* out);
void dequant_q4_1(const uint8_t* src, int64_t blocks, float* out);
void dequant_q5_0(const uint8_t* src, int64_t blocks, float* out);
void dequant_q5_1(const uint8_t* src, int64_t blocks, float* out);
void dequant_iq4_nl(const uint8_t* src, int64_t blocks, float* out);

// GGUF K-quants and IQ4_XS (ref/kquant.cpp): `blocks` consecutive 256-element super-blocks.
void dequant_row_q4_k(const WeightView& w, int64_t row, float* out);
void dequant_row_q5_k(const WeightView& w, int64_t row, float* out);
void dequant_row_q6_k(const WeightView& w, int64_t row, float* out);
void dequant_row_q2_k(const WeightView& w, int64_t row, float* out);
void dequant_row_q3_k(const WeightView& w, int64_t row, float* out);
void dequant_row_iq4_xs(const WeightView& w, int64_t row, float* out);
void dequant_q2_k(const uint8_t* src, int64_t blocks, float* out);
void dequant_q3_k(const uint8_t* src, int64_t blocks, float* out);
void dequant_iq4_xs(const uint8_t* src, int64_t blocks, float* out);
void dequant_q4_k(const uint8_t* src, int64_t blocks, float* out);
void dequant_q5_k(const uint8_t* src, int64_t blocks, float* out);
void dequant_q6_k(const uint8_t* src, int64_t blocks, float* out);
// Sub-block j's 6-bit scale and min of a Q4_K/Q5_K block (`s` = its 12 scale bytes).
void kquant_scale_min(const uint8_t* s, int j, int* sc, int* m);
// Sub-block i's signed scale (−32..31) of a Q3_K block (`s` = its 12 scale bytes).
void q3_k_scale(const uint8_t* s, int i, int* scale);

// Microscaling floats (ref/microscaling.cpp; layouts in kernels/microscaling.h): GGUF MXFP4 blocks
// of 32, and MLX's mxfp4 / nvfp4 / mxfp8 rows (codes + the view's U8 scales).
void dequant_mxfp4(const uint8_t* src, int64_t blocks, float* out);
void dequant_row_mxfp4(const WeightView& w, int64_t row, float* out);
void dequant_row_mlx_mxfp4(const WeightView& w, int64_t row, float* out);
void dequant_row_mlx_nvfp4(const WeightView& w, int64_t row, float* out);
void dequant_row_mlx_mxfp8(const WeightView& w, int64_t row, float* out);

// y[n, rows] = x[n, cols] · Wᵀ for any format with a dequant_row entry in the ref table.
void matmul(const WeightView& w, const float* x, int64_t n, float* y);
// The reference matmul for any format: each row dequantized by `deq`, dotted with every token in
// double. matmul and matmul_affine are this with their row decoder.
void matmul_rows(const WeightView& w, DequantRowFn deq, const float* x, int64_t n, float* y);

// MLX affine (ref/affine.cpp; WeightView with bits > 0, any bits in {2,3,4,5,6,8}, any group
// size dividing cols). One function serves every `matmul_affine[bits]` / `dequant_row_affine[bits]`
// slot: the width is read from the view.
void dequant_row_affine(const WeightView& w, int64_t row, float* out);
void matmul_affine(const WeightView& w, const float* x, int64_t n, float* y);
// Code j of a packed row (little-endian bit stream, quantization.md §2.2), and the f32 value of
// a group's scale (bias = false) or bias (bias = true). Shared with tests and the fast tiers.
uint32_t affine_code(const uint8_t* row, int64_t j, int bits);
float affine_scale(const WeightView& w, int64_t row, int64_t group, bool bias);

void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* out);
void rope(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const int64_t* positions,
          const float* inv_freq, RopePairing pairing);
// rope's two halves, which the fast tiers run separately (they reuse the angles across layers):
// cs[t][2i], cs[t][2i + 1] = cos, sin of positions[t]·inv_freq[i] in double, for i < half; and the
// rotation of x[n, n_heads, head_dim] by them (in double, rounded once to f32).
void rope_angles(const int64_t* positions, int64_t n, const float* inv_freq, int half, double* cs);
void rope_rotate(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const double* cs, RopePairing pairing);
void softmax(float* x, int64_t n);
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n);
void swiglu_oai(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit);
void add(const float* a, const float* b, float* out, int64_t n);
void to_f16(const float* x, int64_t n, uint16_t* out);  // f32_to_f16 per element
// One row of logits (ref/logits.cpp): the definitions the fast tiers are tested against.
int64_t argmax(const float* x, int64_t n);
double sum_exp(const float* x, int64_t n, float shift, float scale);  // std::exp in double per term
int64_t select_at_least(const float* x, int64_t n, float t, int32_t* out);
void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
               const AttentionParams& p, float* out);
// Gated DeltaNet (ref/gated_delta.cpp; contracts in gated_delta.h). Dot products in double; the
// recurrent state is rounded to f32 after every token (the chunked form: after every chunk).
void causal_conv1d(const float* x, int64_t n, const CausalConv1dParams& p, float* state, float* out);
void l2norm_heads(float* x, int64_t n, const L2NormParams& p);
void gated_delta_gates(const float* a, const float* b, int64_t n, const GatedDeltaGateParams& p, float* log_g,
                       float* beta);
void gated_delta_recurrent(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y);
void gated_delta_chunked(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y);
void rmsnorm_gated(const float* x, const float* z, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* out);

// Mixture-of-experts routing and the per-pair expert matmul (ref/moe.cpp; contracts in moe.h).
// route_topk is also the active table's (one pass over E logits per token; no fast tier).
void route_topk(const float* logits, int64_t n, const RouteParams& p, int32_t* ids, float* weights);
// kernels::lora_delta in the order lora.h fixes (f32, explicit fma): the fast tiers' bits.
void lora_delta(const LoraFactors& f, const float* const* xs, int64_t nx, float* t, float* const* us);
// The oracle of kernels::matmul_experts: one matmul (`mm`, e.g. ref::matmul or the active tier's)
// per (token, slot) pair, of that pair's expert over its one row.
void matmul_experts(const ExpertsView& w, const float* x, bool x_per_slot, int64_t n, const int32_t* ids, int k,
                    float* y, MatmulFn mm);

}  // namespace larder::kernels::ref
