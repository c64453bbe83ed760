// ops.cpp — ops.h entry points: thin forwards through the active dispatch table.
#include "larder/kernels/ops.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "larder/core/profile.h"
#include "larder/core/status.h"
#include "larder/kernels/dispatch.h"
#include "larder/kernels/microscaling.h"

// Every entry point is a core/profile.h scope (one relaxed load when profiling is off). The name is
// formatted only when it is on.
#define LARDER_OP_SCOPE(bytes, ...)                                              \
  char op_name_[160];                                                           \
  op_name_[0] = 0;                                                              \
  if (profile::enabled()) std::snprintf(op_name_, sizeof op_name_, __VA_ARGS__); \
  profile::Scope op_scope_(op_name_, (bytes))

namespace larder::kernels {

uint64_t WeightView::row_bytes() const {
  if (is_affine()) return static_cast<uint64_t>(cols) * static_cast<uint64_t>(bits) / 8;
  return dtype_bytes(dtype, static_cast<uint64_t>(cols));
}

uint64_t WeightView::scale_row_bytes() const {
  if (group_size <= 0 || !(is_affine() || is_mlx_microscaling(dtype))) return 0;
  return dtype_bytes(scale_dtype, static_cast<uint64_t>(cols / group_size));
}

namespace {
// For the profile table: the bytes a matmul streams, and its format's name.
double weight_bytes(const WeightView& w) {
  double b = static_cast<double>(w.rows) * static_cast<double>(w.row_bytes());
  b += (w.biases ? 2.0 : 1.0) * static_cast<double>(w.rows) * static_cast<double>(w.scale_row_bytes());
  return b;
}
std::string weight_format(const WeightView& w) {
  if (w.is_affine()) return "affine-q" + std::to_string(w.bits) + "-g" + std::to_string(w.group_size);
  return dtype_name(w.dtype);
}

// " [label]" of the calling thread's profile::Label (a model projection), or "". Called only while
// profiling is on.
std::string label_suffix() {
  const char* l = profile::current_label();
  return l && *l ? std::string(" [") + l + "]" : std::string();
}

// LARDER_FUSED=0: matmul_multi runs one matmul per weight (A/B measurements, debugging).
bool fused_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("LARDER_FUSED");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

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
  if (is_mlx_microscaling(w.dtype))  // whole 32-element activation blocks; the mode's own group
    return w.scale_dtype == DType::kU8 && w.scales != nullptr && w.group_size == mlx_microscaling_group(w.dtype) &&
           w.cols % 32 == 0;
  const uint32_t be = dtype_info(w.dtype).block_elems;
  return w.cols % be == 0;
}

void matmul(const WeightView& w, const float* x, int64_t n, float* y) {
  MatmulFn f = matmul_fn(active_table(), w);
  LARDER_CHECK(f != nullptr, "[kernels] no matmul for %s (affine bits %d)", dtype_name(w.dtype), w.bits);
  LARDER_OP_SCOPE(profile::enabled() ? weight_bytes(w) : 0.0, "matmul %s %lldx%lld%s%s", weight_format(w).c_str(),
                  (long long)w.rows, (long long)w.cols, n == 1 ? "" : n <= 8 ? " n<=8" : " n>8", label_suffix().c_str());
  f(w, x, n, y);
}

void matmul_multi(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  LARDER_CHECK(count >= 0 && count <= kMaxMultiMatmul, "[kernels] matmul_multi of %d weights", count);
  const KernelTable& t = active_table();
  bool done[kMaxMultiMatmul] = {};
  for (int i = 0; i < count; ++i) {
    if (done[i]) continue;
    // The weights of ws[i]'s format that are still to do (a Q4_K_M layer mixes Q4_K and Q6_K).
    WeightView group[kMaxMultiMatmul];
    float* outs[kMaxMultiMatmul];
    int m = 0;
    for (int j = i; j < count; ++j) {
      if (done[j] || ws[j].dtype != ws[i].dtype || ws[j].bits != ws[i].bits ||
          ws[j].group_size != ws[i].group_size || ws[j].scale_dtype != ws[i].scale_dtype)
        continue;
      LARDER_DCHECK(ws[j].cols == ws[i].cols, "matmul_multi: cols %lld vs %lld", (long long)ws[j].cols,
                    (long long)ws[i].cols);
      group[m] = ws[j];
      outs[m++] = ys[j];
      done[j] = true;
    }
    MatmulMultiFn f = !fused_enabled()      ? nullptr
                      : ws[i].is_affine() ? (ws[i].bits <= kMaxAffineBits ? t.matmul_multi_affine[ws[i].bits] : nullptr)
                                          : t.matmul_multi[static_cast<int>(ws[i].dtype)];
    if (f == nullptr || m == 1) {
      for (int k = 0; k < m; ++k) matmul(group[k], x, n, outs[k]);
      continue;
    }
    double bytes = 0;
    int64_t rows = 0;
    if (profile::enabled())
      for (int k = 0; k < m; ++k) bytes += weight_bytes(group[k]), rows += group[k].rows;
    LARDER_OP_SCOPE(bytes, "matmul_multi %s %d x (%lld rows)x%lld%s%s", weight_format(ws[i]).c_str(), m, (long long)rows,
                    (long long)ws[i].cols, n == 1 ? "" : n <= 8 ? " n<=8" : " n>8", label_suffix().c_str());
    f(group, outs, m, x, n);
  }
}

void dequant_row(const WeightView& w, int64_t row, float* out) {
  DequantRowFn f = dequant_fn(active_table(), w);
  LARDER_CHECK(f != nullptr, "[kernels] no row lookup for %s (affine bits %d)", dtype_name(w.dtype), w.bits);
  LARDER_DCHECK(row >= 0 && row < w.rows, "row %lld of %lld", (long long)row, (long long)w.rows);
  LARDER_OP_SCOPE(0.0, "dequant_row (embedding)");
  f(w, row, out);
}

void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* out) {
  LARDER_OP_SCOPE(0.0, "rmsnorm dim %lld", (long long)dim);
  active_table().rmsnorm(x, weight, n, dim, eps, out);
}

void rope(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const int64_t* positions,
          const float* inv_freq, RopePairing pairing) {
  LARDER_DCHECK(rot_dim % 2 == 0 && rot_dim <= head_dim, "rot_dim %d head_dim %d", rot_dim, head_dim);
  LARDER_OP_SCOPE(0.0, "rope");
  active_table().rope(x, n, n_heads, head_dim, rot_dim, positions, inv_freq, pairing);
}

void softmax(float* x, int64_t n) {
  LARDER_OP_SCOPE(0.0, "softmax");
  active_table().softmax(x, n);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  LARDER_OP_SCOPE(0.0, "silu_mul");
  active_table().silu_mul(gate, up, out, n);
}
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  LARDER_OP_SCOPE(0.0, "gelu_tanh_mul");
  active_table().gelu_tanh_mul(gate, up, out, n);
}

void swiglu_oai(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit) {
  LARDER_OP_SCOPE(0.0, "swiglu_oai");
  active_table().swiglu_oai(gate, up, out, n, alpha, limit);
}

void add(const float* a, const float* b, float* out, int64_t n) {
  LARDER_OP_SCOPE(0.0, "add");
  active_table().add(a, b, out, n);
}

// Not profiled ops: they run once per sampled token on the engine thread, outside a forward.
int64_t argmax(const float* x, int64_t n) { return n > 0 ? active_table().argmax(x, n) : 0; }
double sum_exp(const float* x, int64_t n, float shift, float scale) {
  return n > 0 ? active_table().sum_exp(x, n, shift, scale) : 0.0;
}
int64_t select_at_least(const float* x, int64_t n, float t, int32_t* out) {
  return n > 0 ? active_table().select_at_least(x, n, t, out) : 0;
}

void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
               const AttentionParams& p, float* out) {
  LARDER_DCHECK(p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0, "heads %d kv %d", p.n_heads, p.n_kv_heads);
  double kv_bytes = 0;  // the K and V rows the call must read at least once (f32)
  if (profile::enabled())
    for (int i = 0; i < n_spans; ++i) kv_bytes += 2.0 * 4.0 * static_cast<double>(spans[i].len) * p.n_kv_heads * p.head_dim;
  LARDER_OP_SCOPE(kv_bytes, "attention%s", n == 1 ? "" : " n>1");
  active_table().attention(q, n, q_pos0, spans, n_spans, p, out);
}

}  // namespace larder::kernels
