// dispatch.h — the table of kernel implementations, chosen once at startup.
//
// One binary runs on every x86-64-v3 machine; faster tiers (kernels/cpu/avx2, kernels/cpu/avx512)
// live in their own translation units and overwrite entries of this table when CPUID says they
// can run. An entry left null means "this format cannot be executed" — the models layer checks
// `weight_supported()` at load, so a missing kernel is a load error, never a crash mid-request.
//
// Matmul and row lookup are per weight format: plain/GGUF dtypes index `matmul[]`/`dequant_row[]`
// by DType; MLX affine weights (dtype kU32 + bits) index `matmul_affine[bits]`.
#pragma once

#include <array>

#include "larder/kernels/gated_delta.h"
#include "larder/kernels/lora.h"
#include "larder/kernels/moe.h"
#include "larder/kernels/ops.h"

namespace larder::kernels {

using MatmulFn = void (*)(const WeightView& w, const float* x, int64_t n, float* y);
// Several weights of one format over the same activations as one job (kernels::matmul_multi).
using MatmulMultiFn = void (*)(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);
using DequantRowFn = void (*)(const WeightView& w, int64_t row, float* out);
using RmsNormFn = void (*)(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* out);
using RopeFn = void (*)(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const int64_t* positions,
                        const float* inv_freq, RopePairing pairing);
using SoftmaxFn = void (*)(float* x, int64_t n);
using BinaryFn = void (*)(const float* a, const float* b, float* out, int64_t n);
using SwigluOaiFn = void (*)(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit);
// f32 → f16 (IEEE half, round to nearest even), n elements: the f16 KV cache's row writes.
using ToF16Fn = void (*)(const float* x, int64_t n, uint16_t* out);
using ArgmaxFn = int64_t (*)(const float* x, int64_t n);
using SumExpFn = double (*)(const float* x, int64_t n, float shift, float scale);
using SelectFn = int64_t (*)(const float* x, int64_t n, float t, int32_t* out);
using AttentionFn = void (*)(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                             const AttentionParams& p, float* out);

// Gated DeltaNet (gated_delta.h).
using CausalConv1dFn = void (*)(const float* x, int64_t n, const CausalConv1dParams& p, float* state, float* out);
using L2NormHeadsFn = void (*)(float* x, int64_t n, const L2NormParams& p);
using GatedDeltaGatesFn = void (*)(const float* a, const float* b, int64_t n, const GatedDeltaGateParams& p,
                                   float* log_g, float* beta);
using GatedDeltaFn = void (*)(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y);
// Mixture-of-experts routing (moe.h).
using RouteTopKFn = void (*)(const float* logits, int64_t n, const RouteParams& p, int32_t* ids, float* weights);
// LoRA delta rows (lora.h).
using LoraDeltaFn = void (*)(const LoraFactors& f, const float* const* xs, int64_t nx, float* t, float* const* us);
using RmsNormGatedFn = void (*)(const float* x, const float* z, const float* weight, int64_t rows, int64_t dim,
                                float eps, float* out);

constexpr int kNumDTypes = static_cast<int>(DType::kUnknown) + 1;
constexpr int kMaxAffineBits = 8;

struct KernelTable {
  const char* name = "ref";  // tier name for logs and benchmarks
  std::array<MatmulFn, kNumDTypes> matmul{};
  std::array<DequantRowFn, kNumDTypes> dequant_row{};
  // Optional, per format: matmul_multi's fused path (absent: one matmul per weight).
  std::array<MatmulMultiFn, kNumDTypes> matmul_multi{};
  std::array<MatmulFn, kMaxAffineBits + 1> matmul_affine{};
  // Optional, per width: matmul_multi's fused path for MLX affine weights.
  std::array<MatmulMultiFn, kMaxAffineBits + 1> matmul_multi_affine{};
  std::array<DequantRowFn, kMaxAffineBits + 1> dequant_row_affine{};
  RmsNormFn rmsnorm = nullptr;
  RopeFn rope = nullptr;
  SoftmaxFn softmax = nullptr;
  BinaryFn silu_mul = nullptr;
  BinaryFn gelu_tanh_mul = nullptr;
  SwigluOaiFn swiglu_oai = nullptr;
  BinaryFn add = nullptr;
  ToF16Fn to_f16 = nullptr;
  AttentionFn attention = nullptr;
  ArgmaxFn argmax = nullptr;
  SumExpFn sum_exp = nullptr;
  SelectFn select_at_least = nullptr;
  CausalConv1dFn causal_conv1d = nullptr;
  L2NormHeadsFn l2norm_heads = nullptr;
  GatedDeltaGatesFn gated_delta_gates = nullptr;
  GatedDeltaFn gated_delta_recurrent = nullptr;
  GatedDeltaFn gated_delta_chunked = nullptr;
  RmsNormGatedFn rmsnorm_gated = nullptr;
  RouteTopKFn route_topk = nullptr;
  LoraDeltaFn lora_delta = nullptr;
};

// The scalar reference table (every entry the ref set implements).
const KernelTable& ref_table();

// The table ops.h forwards to. Built on first use: the ref table, then each ISA tier the CPU
// supports overwrites the entries it implements (kernels/cpu/common/register.cpp).
const KernelTable& active_table();

// Tests and benchmarks: replace the active table (e.g. force the ref set). Not thread-safe;
// call before any kernel runs on another thread.
void set_active_table(const KernelTable& t);

}  // namespace larder::kernels
