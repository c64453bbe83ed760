// ops.h — the kernel API: math on caller-owned buffers, one entry point per op.
//
// Every op here forwards through the dispatch table (dispatch.h), chosen once at startup. The
// scalar reference implementations in ref/ are the oracle every faster tier is tested against.
//
// Conventions
// - Activations are f32, row-major, one row per token: x[n, dim].
// - Weights are views into the mapped model file (WeightView): no conversion at load, so a BF16
//   or Q4_0 checkpoint costs its file size in RAM, shared with the page cache.
// - Shapes in comments are outermost-first.
// - Kernels assume validated inputs (the models layer validates at load) and only DCHECK them.
#pragma once

#include <cstdint>

#include "larder/core/dtype.h"

namespace larder::kernels {

// A 2-D weight matrix [rows = out_features, cols = in_features], row-major, in its stored dtype.
//
// Plain dtypes (F32/F16/BF16): `data` holds rows*cols elements.
// GGUF block dtypes (Q8_0/Q4_0/...): each row is cols/block_elems consecutive blocks (ggml puts
// blocks along the innermost axis, which after the reader's shape reversal is `cols`).
// MLX affine: dtype = kU32, `data` = packed codes [rows, cols*bits/32] (a little-endian bit
// stream per row), `scales`/`biases` [rows, cols/group_size] in `scale_dtype` (F32/F16/BF16),
// `bits` in {2,3,4,5,6,8}, group_size in {32,64,128}; value = scale·code + bias per group
// (quantization.md §2). `bits > 0` marks an affine view.
// MLX microscaling (kernels/microscaling.h): dtype kMlxMXFP4/kMlxNVFP4/kMlxMXFP8, `data` = the
// codes, `scales` = U8 [rows, cols/group_size] (scale_dtype kU8), no biases, bits = 0.
struct WeightView {
  DType dtype = DType::kUnknown;
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
  const uint8_t* biases = nullptr;
  DType scale_dtype = DType::kUnknown;
  int bits = 0;
  int group_size = 0;

  bool is_affine() const { return bits > 0; }
  // Bytes of one stored row of `data`.
  uint64_t row_bytes() const;
  // Bytes of one row of `scales` (and of `biases`): affine and MLX microscaling views; else 0.
  uint64_t scale_row_bytes() const;
};

// KV row formats (memory/kv_cache.h): a K or V row is [n_kv_heads, head_dim] in one of
//   kF32  — 4 bytes per element;
//   kF16  — IEEE half, round-to-nearest-even (llama.cpp's default cache type);
//   kQ8_0 — GGUF Q8_0 blocks of 32 elements along head_dim (f16 scale + 32 int8), so each head's
//           part of a row is head_dim/32 whole blocks (head_dim % 32 == 0).
// The attention kernels read every format; they widen rows to f32 as they stream them (the
// widening is exact), so a format only changes what is stored, never how it is attended.
bool kv_dtype_supported(DType dt);
// Why `dt` cannot hold KV rows of this head size (empty when it can).
const char* kv_dtype_unsupported_reason(DType dt, int head_dim);
// Bytes of n elements of a KV row in `dt` (n a multiple of the block size for kQ8_0).
inline int64_t kv_bytes(DType dt, int64_t n) { return static_cast<int64_t>(dtype_bytes(dt, static_cast<uint64_t>(n))); }
// dst = src[n] converted to `dt` (n a multiple of 32 for kQ8_0). Scalar: writes are one row per
// token and layer, tiny next to the reads; the converters are the reference ones, so every tier
// stores the same bits.
void kv_encode(DType dt, const float* src, int64_t n, void* dst);
// dst[n] = src converted back to f32 (exact for kF32/kF16; Q8_0: q·d rounded once).
void kv_decode(DType dt, const void* src, int64_t n, float* dst);

// Contiguous K/V rows of token positions [start, start + len): [len, n_kv_heads, head_dim] in
// `dtype` (see above). Attention takes a list of these (oldest first, positions contiguous from
// 0) because a sequence may read a shared prefix segment followed by its private tail
// (memory/kv_cache.h); spans of one call may differ in dtype (a ring's f32 rows beside f16 ones).
struct KvSpanView {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t start = 0;
  int64_t len = 0;
  DType dtype = DType::kF32;
};

// Which dimensions RoPE pairs up within a head's first `rot_dim` dims.
enum class RopePairing {
  kHalf,         // HF "rotate_half" / NeoX: (i, i + rot_dim/2)
  kInterleaved,  // adjacent pairs (2i, 2i+1): Meta's original, llama2.c, llama GGUFs
};

struct AttentionParams {
  int n_heads = 0;
  int n_kv_heads = 0;  // n_heads % n_kv_heads == 0 (GQA: query head h reads kv head h / group)
  int head_dim = 0;
  float scale = 0;      // usually 1/sqrt(head_dim)
  int64_t window = 0;   // >0: sliding window, a query at p sees keys (p - window, p]
  // Attention sinks (gpt-oss): [n_heads] learned logits, or null. Head h's softmax denominator
  // gains e^{sinks[h]} — a virtual key with that (unscaled) score and a zero value — so a row's
  // weights over its real keys sum to less than 1 (mlx's `sdpa(..., sinks=)`).
  const float* sinks = nullptr;
};

// Whether the active dispatch table can run matmul / row lookup for this weight's format.
bool weight_supported(const WeightView& w);

// y[n, w.rows] = x[n, w.cols] · Wᵀ.
void matmul(const WeightView& w, const float* x, int64_t n, float* y);

// Several matmuls of one input (q/k/v; gate/up): ys[i][n, ws[i].rows] = x[n, cols] · ws[i]ᵀ for
// i < count (<= kMaxMultiMatmul), all ws[i].cols equal. Equal to count matmul() calls; where the
// active tier has a fused path for the format (decode), weights of the same format share one
// activation quantization and one thread-pool job, so a layer pays one fork/join for q/k/v and
// one for gate/up instead of five.
constexpr int kMaxMultiMatmul = 4;
void matmul_multi(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n);

// out[w.cols] = row `row` of W, dequantized to f32 (embedding lookup, tied-embedding rows).
void dequant_row(const WeightView& w, int64_t row, float* out);

// out[n, dim] = x / sqrt(mean(x²) + eps) * weight, per row. out may alias x.
void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* out);

// In-place rotary embedding on x[n, n_heads, head_dim]; token t is at position positions[t].
// Only the first rot_dim dims of each head rotate (rot_dim even, <= head_dim). inv_freq[rot_dim/2]
// holds the per-pair angular frequency (theta_i = positions[t] * inv_freq[i]); computing it is the
// model's business (plain, llama3-scaled, ...).
void rope(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const int64_t* positions,
          const float* inv_freq, RopePairing pairing);

// In place, numerically stable: x[i] = exp(x[i] - max) / Σ.
void softmax(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g). out may alias gate or up.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

// out[i] = gelu_tanh(gate[i]) * up[i] (GeGLU, Gemma), with the tanh approximation
// gelu_tanh(g) = g/2 · (1 + tanh(√(2/π) · (g + 0.044715 g³))) that Gemma's `gelu_pytorch_tanh`
// and mlx's `gelu_approx` compute. out may alias gate or up.
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n);

// gpt-oss's clamped SwiGLU (mlx-lm `swiglu_oai`, transformers `GptOssExperts._apply_gate`):
//   g = min(gate, limit);  u = clamp(up, -limit, limit);  out = (u + 1) · g · σ(alpha · g)
// in f32 as mlx-lm computes it (the gpt-oss fixtures' reference). out may alias gate or up.
void swiglu_oai(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit);

// out[i] = a[i] + b[i]. out may alias a or b.
void add(const float* a, const float* b, float* out, int64_t n);

// ---- One row of logits (runtime/sampler.h). Sampling a token must cost tens of µs, not the
// step's time: a full-vocabulary pass in double precision or a sort of 49k–262k ids took
// 0.25–4.4 ms per token. Each op here is one vectorised pass over the row.

// The index of the largest value, the lowest index among equal maxima; NaN never wins. 0 when n <= 0
// or every value is NaN.
int64_t argmax(const float* x, int64_t n);

// Σ e^{(x[i] − shift)·scale} over the i with x[i] > −∞ (NaN and −∞ add exactly nothing), summed in
// double. The caller keeps the exponents <= 0 (shift = the maximum, scale > 0); exponents below
// about −87 add ~1e-38 instead of their true tiny value. Fast tiers: within 2e-6 relative.
double sum_exp(const float* x, int64_t n, float shift, float scale);

// Writes the indices i with x[i] >= t to out in ascending order (room for n) and returns how many.
// NaN is never selected. Exact in every tier.
int64_t select_at_least(const float* x, int64_t n, float t, int32_t* out);

// Causal attention for n query tokens at positions q_pos0 .. q_pos0+n-1, whose own K/V rows are
// already in the spans. q, out: [n, n_heads, head_dim]; spans cover positions [0, q_pos0 + n).
// Query at position p attends to keys [0, p] (or its window).
// The result for a (query row, head) depends only on q, the keys it sees and their positions —
// not on how the keys are cut into spans, how many rows are in the call, or the thread count:
// keys are taken in fixed chunks of absolute positions and the chunks merged in position order
// (so attending a cached prefix + a tail gives the bits of one contiguous cold prefill).
void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
               const AttentionParams& p, float* out);

}  // namespace larder::kernels
