// ops.cpp — ops.h entry points: thin forwards through the active dispatch table.
#include "larder/kernels/ops.h"

#include "larder/core/status.h"
#include "larder/kernels/dispatch.h"

namespace larder::kernels {

uint64_t WeightView::row_bytes() const {
  if (is_affine()) return static_cast<uint64_t>(cols) * static_cast<uint64_t>(bits) / 8;
  return dtype_bytes(dtype, static_cast<uint64_t>(cols));
}

namespace {
MatmulFn matmul_fn(const KernelTable& t, const WeightView& w) {
  if (w.is_affine()) return w.bits <= kMaxAffineBits ? t.matmul_affine[w.bits] : nullptr;
  return t.matmul[static_cast<int>(w.dtype)];
}
DequantRowFn dequant_fn(const KernelTable& t, const WeightView& w) {
  if (w.is_affine()) return w.bits <= kMaxAffineBits ? t.dequant_row_affine[w.bits] : nullptr;
  return t.dequant_row[static_cast<int>(w.dtype)];
}
}  // namespace

bool weight_supported(const WeightView& w) {
  const KernelTable& t = active_table();
  if (matmul_fn(t, w) == nullptr || dequant_fn(t, w) == nullptr) return false;
  if (w.is_affine()) {
    // The fast tiers work on whole 32-element activation blocks per group.
    const bool scale_ok = w.scale_dtype == DType::kF32 || w.scale_dtype == DType::kF16 || w.scale_dtype == DType::kBF16;
    return w.dtype == DType::kU32 && scale_ok && w.group_size > 0 && w.group_size % 32 == 0 &&
           w.cols % w.group_size == 0 && w.scales != nullptr && w.biases != nullptr;
  }
  const uint32_t be = dtype_info(w.dtype).block_elems;
  return w.cols % be == 0;
}

void matmul(const WeightView& w, const float* x, int64_t n, float* y) {
  MatmulFn f = matmul_fn(active_table(), w);
  LARDER_CHECK(f != nullptr, "[kernels] no matmul for %s (affine bits %d)", dtype_name(w.dtype), w.bits);
  f(w, x, n, y);
}

void dequant_row(const WeightView& w, int64_t row, float* out) {
  DequantRowFn f = dequant_fn(active_table(), w);
  LARDER_CHECK(f != nullptr, "[kernels] no row lookup for %s (affine bits %d)", dtype_name(w.dtype), w.bits);
  LARDER_DCHECK(row >= 0 && row < w.rows, "row %lld of %lld", (long long)row, (long long)w.rows);
  f(w, row, out);
}

void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* out) {
  active_table().rmsnorm(x, weight, n, dim, eps, out);
}

void rope(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const int64_t* positions,
          const float* inv_freq, RopePairing pairing) {
  LARDER_DCHECK(rot_dim % 2 == 0 && rot_dim <= head_dim, "rot_dim %d head_dim %d", rot_dim, head_dim);
  active_table().rope(x, n, n_heads, head_dim, rot_dim, positions, inv_freq, pairing);
}

void softmax(float* x, int64_t n) { active_table().softmax(x, n); }

void silu_mul(const float* gate, const float* up, float* out, int64_t n) { active_table().silu_mul(gate, up, out, n); }
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  active_table().gelu_tanh_mul(gate, up, out, n);
}

void add(const float* a, const float* b, float* out, int64_t n) { active_table().add(a, b, out, n); }

void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
               const AttentionParams& p, float* out) {
  LARDER_DCHECK(p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0, "heads %d kv %d", p.n_heads, p.n_kv_heads);
  active_table().attention(q, n, q_pos0, spans, n_spans, p, out);
}

}  // namespace larder::kernels
