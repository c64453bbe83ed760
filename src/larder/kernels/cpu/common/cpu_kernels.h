// cpu_kernels.h — the fast CPU matmul tiers and how they enter the dispatch table.
//
// Tiers (one translation unit each, compiled with that tier's flags; see src/larder/CMakeLists.txt):
//   avx2/    AVX2 + FMA + F16C: Q8_0, Q4_0, Q4_K, Q6_K, Q4_K/Q5_K decode on integer super-block
//            sums, the other GGUF formats (Q4_1, Q5_0, Q5_1,
//            IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS) on one unpacker-driven kernel (IQ4_XS decode: integer
//            super-block sums, decode_iq4_avx2.cpp), BF16, F16, F32, MLX affine (all widths; BMI2 for
//            2/3/5/6 bits). Runs on every x86-64-v3 machine.
//   avx512/  AVX-512 F/BW/VL/DQ + VNNI + BF16: Q8_0, Q4_0, Q4_K, Q6_K, the other GGUF formats and MLX affine prefill on one
//            16-token-lane vpdpbusd GEMM (gemm16_avx512.h); decode kernels with 64 weights per zmm
//            for Q4_0, Q4_K, Q5_K, Q3_K, Q2_K (integer super-block sums over QuantizedActsK), Q6_K, IQ4_NL, IQ4_XS, MLX 4/8-bit (the other MLX widths decode on AVX2), VNNI Q8_0;
//            BF16 prefill and decode on vdpbf16ps. Where the CPU has AMX (amx_avx512.cpp), the
//            integer GEMM's block sums run on TDPBUSD and the BF16 GEMM on TDPBF16PS.
//            Its functions may only be *called* after cpu_features().has_avx512_tier().
// Both tiers run on the process-wide core/threadpool.h pool.
#pragma once

#include "larder/kernels/dispatch.h"

namespace larder {
class ThreadPool;
}

namespace larder::kernels::cpu {

// Overwrites the matmul entries the CPU can run faster than the ref set: the AVX2 tier always
// (the baseline flags already require AVX2), then the AVX-512 tier when CPUID reports the whole
// tier (LARDER_ISA=avx2 hides it; LARDER_ISA=ref skips both). Entries it does not implement are
// left as they are; row lookup (dequant_row) stays on the reference. LARDER_QUANT_ACT=0 keeps the
// reference for the GGUF integer formats and MLX affine (whose fast kernels quantize activations to int8) — see
// register.cpp.
void register_fast_kernels(KernelTable& t);

// Batch-invariant decode (issue 41 item 1): whether the AVX-512 tier's integer formats (the GGUF
// quantizations and MLX affine) decode (n below the prefill GEMM's threshold) in the prefill GEMM's
// arithmetic, so a row's bits do not depend on how many tokens share the call: Q4_K, Q5_K, Q6_K
// and IQ4_XS on decode kernels of their own that follow it (tile_inv / Q6KDecodeInv /
// IQ4XSDecodeInv; with AMX, Q4_K/Q5_K/IQ4_XS on Gemv16), Q4_0, Q8_0 and Q4_1 on ZeroPointGemv, the
// rest on Gemv16 (avx512/gemm16_avx512.h). Off by default: it is slower than the per-format
// decode kernels (bench/RESULTS.md, issue 41 and session 37). LARDER_BATCH_INVARIANT=1 turns
// it on; set_batch_invariant_decode is for tests and benchmarks (call before kernels run on other
// threads). The numerics fingerprint (kernels/numerics.cpp) follows it.
bool batch_invariant_decode();
void set_batch_invariant_decode(bool on);

// Startup self-check of an untested-here tier: `fast` must agree with `trusted` on a small
// ragged problem in `dtype` (within 2^-6 of the output scale). register_fast_kernels applies it
// to every AVX-512 matmul before installing it.
bool fast_matmul_agrees(DType dtype, MatmulFn fast, MatmulFn trusted);
// The same for MLX affine weights of `bits` (groups 64/128/32 with bf16/f16/f32 scales and biases).
bool fast_matmul_affine_agrees(int bits, MatmulFn fast, MatmulFn trusted);

// Direct entry points (tests, kernel_bench). Same contract as kernels::matmul.
namespace avx2 {
void matmul_q8_0(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q4_0(const WeightView& w, const float* x, int64_t n, float* y);
// kernels::matmul_multi for weights all in one format (decode: one quantization, one pool job).
void matmul_multi_q8_0(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q4_0(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q4_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q5_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_bf16(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_f16(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_f32(const WeightView& w, const float* x, int64_t n, float* y);
// MLX affine, any bits in {2,3,4,5,6,8} (read from the view), group sizes that are multiples of
// 32; int8-quantized activations like Q8_0/Q4_0 (matmul_affine_avx2.cpp).
void matmul_affine(const WeightView& w, const float* x, int64_t n, float* y);
// kernels::matmul_multi for MLX affine weights of one width, group size and scale dtype (decode
// fused: one quantization, one pool job; prefill one matmul_affine per weight).
void matmul_multi_affine(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// GGUF Q4_K / Q6_K, int8-quantized activations like Q8_0/Q4_0 (matmul_kquant_avx2.cpp).
void matmul_q4_k(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q6_k(const WeightView& w, const float* x, int64_t n, float* y);
// Q4_K / Q5_K decode (n < 8; the matmul entry points call them): integer super-block
// accumulation over QuantizedActsK (decode_q4k_q5k_avx2.cpp).
void decode_q4_k(const WeightView& w, const float* x, int64_t n, float* y);
void decode_q5_k(const WeightView& w, const float* x, int64_t n, float* y);
// Q2_K / Q3_K decode (n < 8; the matmul entry points call them) and their fused decode, integer
// super-block accumulation over QuantizedActsK (decode_q2k_q3k_avx2.cpp).
void decode_q2_k(const WeightView& w, const float* x, int64_t n, float* y);
void decode_q3_k(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_multi_q2_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q3_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// GGUF Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS over the unpackers of gguf_unpack.h,
// int8-quantized activations: decode tiles, and for n >= 8 a token-lane maddubs GEMM that unpacks
// each 4-row tile once per chunk of token groups (matmul_gguf_avx2.cpp).
void matmul_q4_1(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q5_0(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q5_1(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_iq4_nl(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q2_k(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q3_k(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q5_k(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y);
// IQ4_XS decode (n < 8, called by matmul_iq4_xs) with integer super-block accumulation over
// QuantizedActsK, and its fused decode (decode_iq4_avx2.cpp).
void decode_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_multi_iq4_xs(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// IQ4_NL fused decode (the linear decode kernel of matmul_gguf_avx2.cpp, one quantization per group).
void matmul_multi_iq4_nl(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// Causal GQA attention over f32/f16/q8_0 K/V, f32 online softmax, on the thread pool
// (attention_driver.h, attention_avx2.cpp). Same contract as kernels::attention.
void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
               const AttentionParams& p, float* out);
// Elementwise ops on the pool (elementwise_avx2.cpp). Same contracts as kernels::rmsnorm, rope,
// silu_mul, add; rope and add are bit-identical to the reference, rmsnorm and silu_mul within a few ulps.
void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* out);
void rope(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const int64_t* positions,
          const float* inv_freq, RopePairing pairing);
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
// gelu_tanh(g)·u as g·u / (1 + e^(−2z)), z = √(2/π)(g + 0.044715 g³) (= ½(1 + tanh z)); a few ulps.
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n);
void add(const float* a, const float* b, float* out, int64_t n);
// f32 → f16 with F16C (vcvtps2ph, round to nearest even): bit-identical to f32_to_f16 for every
// non-NaN input; a NaN stays a NaN (its payload is not the reference's canonical 0x7e00).
void to_f16(const float* x, int64_t n, uint16_t* out);
// One row of logits (logits_avx2.cpp), same contracts as kernels::argmax, sum_exp and
// select_at_least: argmax and select exact, sum_exp within 2e-6 relative of the double reference.
int64_t argmax(const float* x, int64_t n);
double sum_exp(const float* x, int64_t n, float shift, float scale);
int64_t select_at_least(const float* x, int64_t n, float t, int32_t* out);
// Gated DeltaNet (gated_delta_avx2.cpp), same contracts as kernels::causal_conv1d, l2norm_heads,
// gated_delta_recurrent and rmsnorm_gated; f32 accumulation (tolerances:
// tests/unit/kernels_fast/gated_delta_fast_test.cpp).
void causal_conv1d(const float* x, int64_t n, const CausalConv1dParams& p, float* state, float* out);
void l2norm_heads(float* x, int64_t n, const L2NormParams& p);
void gated_delta_recurrent(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y);
void rmsnorm_gated(const float* x, const float* z, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* out);
// Microscaling floats (matmul_mx_avx2.cpp; kernels/microscaling.h): GGUF MXFP4, MLX mxfp4 / nvfp4
// (int8 dot products) and MLX mxfp8 (f32). Row-major chains: decode and prefill share arithmetic.
void matmul_mxfp4(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_mlx_mxfp4(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_mlx_nvfp4(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_mlx_mxfp8(const WeightView& w, const float* x, int64_t n, float* y);
// kernels::lora_delta, 16 lanes as two 8-lane halves: the reference's bits (lora_avx2.cpp).
void lora_delta(const LoraFactors& f, const float* const* xs, int64_t nx, float* t, float* const* us);
}  // namespace avx2

namespace avx512 {
// kernels::lora_delta on one zmm per 16 lanes: the reference's bits (lora_avx512.cpp).
void lora_delta(const LoraFactors& f, const float* const* xs, int64_t nx, float* t, float* const* us);
// Microscaling fp4 (matmul_mx_avx512.cpp): GGUF MXFP4, MLX mxfp4 / nvfp4 on the VNNI GEMM, decode on
// Gemv16 (its arithmetic); matmul_multi_mx takes weights of one of those dtypes.
void matmul_mxfp4(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_mlx_mxfp4(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_mlx_nvfp4(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_multi_mx(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// Same contract as avx2::attention; each block is computed for tiles of (row, head) pairs as two
// register-blocked matrix products (attention_avx512.cpp).
void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
               const AttentionParams& p, float* out);
// Same contracts as avx2::argmax and avx2::sum_exp, 16 lanes (logits_avx512.cpp).
int64_t argmax(const float* x, int64_t n);
double sum_exp(const float* x, int64_t n, float shift, float scale);
// Same contract as avx2::gelu_tanh_mul, 16 lanes (elementwise_avx512.cpp).
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n);
// Gated DeltaNet (gated_delta_avx512.cpp), same contracts as the avx2 ones above plus
// kernels::gated_delta_gates; 16 lanes, the recurrent form in one pass per token (tolerances:
// tests/unit/kernels_fast/gated_delta_fast_test.cpp).
void causal_conv1d(const float* x, int64_t n, const CausalConv1dParams& p, float* state, float* out);
void l2norm_heads(float* x, int64_t n, const L2NormParams& p);
void gated_delta_gates(const float* a, const float* b, int64_t n, const GatedDeltaGateParams& p, float* log_g,
                       float* beta);
void gated_delta_recurrent(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y);
void rmsnorm_gated(const float* x, const float* z, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* out);
void matmul_q8_0(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q4_0(const WeightView& w, const float* x, int64_t n, float* y);
// kernels::matmul_multi for weights all in one format (decode: one quantization, one pool job).
void matmul_multi_q8_0(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q4_0(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q5_0(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q4_1(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q5_1(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q4_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q5_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q6_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q3_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_q2_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_bf16(const WeightView& w, const float* x, int64_t n, float* y);
// One bf16 activation conversion and one pool job for all weights (decode and prefill).
void matmul_multi_bf16(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// F16: decode (n <= 8) widening 16 halves per instruction; prefill on the AVX2 kernel.
void matmul_f16(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_multi_f16(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// MLX affine, bits {2,3,4,5,6,8}: prefill on the VNNI GEMM; decode of 4/8 bits with groups of
// 64/128 on AVX-512, the rest on the AVX2 kernel (matmul_affine_avx512.cpp).
void matmul_affine(const WeightView& w, const float* x, int64_t n, float* y);
// kernels::matmul_multi for MLX affine weights of one width, group size and scale dtype: the 4/8-bit
// decode fused (one quantization, one pool job), everything else one matmul_affine per weight.
void matmul_multi_affine(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// GGUF Q4_K / Q6_K: prefill on the VNNI GEMM, decode 64 codes per zmm (matmul_kquant_avx512.cpp).
void matmul_q4_k(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q6_k(const WeightView& w, const float* x, int64_t n, float* y);
// Q4_K / Q5_K decode (n <= 8; the matmul entry points call them): integer super-block
// accumulation over QuantizedActsK (decode_q4k_q5k_avx512.cpp).
void decode_q4_k(const WeightView& w, const float* x, int64_t n, float* y);
void decode_q5_k(const WeightView& w, const float* x, int64_t n, float* y);
// Q6_K / Q3_K / Q2_K decode (n <= 8; the Q3_K/Q2_K matmul and matmul_multi entry points call them):
// integer super-block accumulation over QuantizedActsK (decode_q2k_q3k_q6k_avx512.cpp). Q6_K's is
// not registered yet (register.cpp: a gemma-3 greedy parity test fails with it); tests call it.
void decode_q6_k_superblock(const WeightView& w, const float* x, int64_t n, float* y);
void decode_q3_k(const WeightView& w, const float* x, int64_t n, float* y);
void decode_q2_k(const WeightView& w, const float* x, int64_t n, float* y);
void decode_multi_q3_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void decode_multi_q2_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// GGUF Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS: one kernel over the unpackers of
// gguf_unpack.h, prefill on the VNNI GEMM, decode on the tier's own decode kernels (decode_q4_1,
// decode_q5_0, decode_q5_1, decode_iq4_nl, decode_q2_k, decode_q3_k, decode_q5_k, decode_iq4_xs)
// (matmul_gguf_avx512.cpp).
void matmul_q4_1(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q5_0(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q5_1(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_iq4_nl(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q2_k(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q3_k(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_q5_k(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y);
// Prefill (n >= kGemm16MinTokens) of several weights in one format against one x, for the
// matmul_multi entry points (q/k/v, gate/up): one activation quantization for all. Q4_K
// (matmul_kquant_avx512.cpp); Q5_K, IQ4_XS, IQ4_NL (matmul_gguf_avx512.cpp).
void gemm_multi_q4_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// Whether the prefill GEMM of n tokens of this format runs the super-block path (gemm16_avx512.h
// kSuperBlocks: Q4_K, Q5_K and IQ4_XS, activations quantized per 256 values) rather than the
// per-32-block one (other formats, and those three where AMX computes the block sums). Tests
// replay the quantizer it names.
bool gemm_super_blocks(DType dtype, int64_t n);
// That path for any of the three (matmul_gguf_avx512.cpp), where gemm_super_blocks says so.
void gemm_multi_super(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void gemm_multi_gguf(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// Batch-invariant decode (batch_invariant_decode(), gemm16_avx512.h Gemv16) of Q4_1, Q5_0, Q5_1,
// IQ4_NL, Q2_K, Q3_K, and (where AMX moves their GEMM off the super-block path) Q5_K, IQ4_XS and
// Q4_K: the prefill GEMM's format adapter and arithmetic for n below its threshold.
void gemv_multi_gguf(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// Q4_1 on its own kernel (matmul_avx512.cpp ZeroPointGemv), and on Gemv16 (gemv_q4_1_rows: what
// gemv_multi_gguf runs for the others).
void gemv_q4_1(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void gemv_q4_1_rows(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// The same for Q4_K on either GEMM path (matmul_kquant_avx512.cpp).
void gemv_q4_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// Q5_0 / Q4_1 / Q5_1 decode (n <= 8; their matmul entry points call them): four blocks per step,
// vpdpbusd (matmul_avx512.cpp LowBitQuad).
void decode_q5_0(const WeightView& w, const float* x, int64_t n, float* y);
void decode_q4_1(const WeightView& w, const float* x, int64_t n, float* y);
void decode_q5_1(const WeightView& w, const float* x, int64_t n, float* y);
// IQ4_XS / IQ4_NL decode (n <= 8; the matmul entry points call them): vpshufb codebook lookup into
// vpdpbusd, IQ4_XS over QuantizedActsK super-blocks (decode_iq4_avx512.cpp); and their fused decode.
void decode_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y);
void decode_iq4_nl(const WeightView& w, const float* x, int64_t n, float* y);
void matmul_multi_iq4_xs(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
void matmul_multi_iq4_nl(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
// Compute ceilings of the tier's prefill instructions on all pool threads (peak_avx512.cpp):
// zmm vpdpbusd, GOP/s (1 MAC = 2 OP), and zmm vdpbf16ps, GFLOP/s.
double int8_dot_peak(ThreadPool& pool);
// zmm f32 FMA (the AVX-512 Gated DeltaNet kernels' ceiling; core/roofline.h's probe is ymm).
double f32_fma_peak(ThreadPool& pool);
double bf16_dot_peak(ThreadPool& pool);
// AMX TDPBUSD on all pool threads, GOP/s (gemm16's block sums where gemm_uses_amx()).
double amx_int8_peak(ThreadPool& pool);
// AMX TDPBF16PS on all pool threads, GFLOP/s (the BF16 GEMM where AMX-BF16 is used).
double amx_bf16_peak(ThreadPool& pool);
// Whether the prefill GEMM computes its block sums on AMX (amx_avx512.cpp): cpu_features().amx
// unless set_gemm_amx changed it. set_gemm_amx(true) is ignored where AMX is not usable; tests
// and kernel_bench use it to run both paths in one process.
bool gemm_uses_amx();
void set_gemm_amx(bool on);
// The BF16 GEMM's AMX path: gemm_uses_amx() on a CPU that also has AMX-BF16.
bool bf16_gemm_uses_amx();
// The AMX tile configurations: gemm16's int8 blocks (gemm16_avx512.h) and the BF16 GEMM's
// (matmul_avx512.cpp Bf16Amx).
enum class AmxTiles { kBlocks, kBf16 };
// Loads a tile configuration into the calling thread's tile registers, unless it is the one
// loaded last.
void amx_configure_thread(AmxTiles tiles);
}  // namespace avx512

// The ceiling of what the active table's prefill kernels issue, for benchmarks: int8 dot products
// (integer formats and MLX affine) and BF16 dot products. 0 when the active tier has no probe of
// its own (AVX2: core/roofline.h's maddubs and f32 FMA probes are its ceilings).
double active_int8_peak(ThreadPool& pool);
double active_bf16_peak(ThreadPool& pool);

// The tier's function for a dtype, or nullptr. tier: "avx2" or "avx512".
MatmulFn fast_matmul(const char* tier, DType dtype);
// The tier's fused matmul_multi for a dtype, or nullptr (the formats without one run per weight).
MatmulMultiFn fast_matmul_multi(const char* tier, DType dtype);
// The tier's function for MLX affine weights of `bits`, or nullptr.
MatmulFn fast_matmul_affine(const char* tier, int bits);

}  // namespace larder::kernels::cpu
