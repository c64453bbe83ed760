#include "larder/kernels/numerics.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <mutex>
#include <type_traits>
#include <vector>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/common/probe_weights.h"
#include "larder/kernels/ops.h"

namespace larder::kernels {

namespace {

class Hasher {
 public:
  Hasher() : st_(XXH3_createState()) { XXH3_64bits_reset(st_); }
  ~Hasher() { XXH3_freeState(st_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void add(const void* p, size_t n) { XXH3_64bits_update(st_, p, n); }
  void add(const std::vector<float>& v) { add(v.data(), v.size() * sizeof(float)); }
  void add_tag(const char* s) { add(s, std::strlen(s) + 1); }
  uint64_t digest() const { return XXH3_64bits_digest(st_); }

 private:
  XXH3_state_t* st_;
};

// Activations with a spread of magnitudes, one outlier per row (int8 activation scales and
// F16 decode's range fallback both key on the row's largest value).
std::vector<float> probe_acts(int64_t n, int64_t cols, float outlier) {
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + 0.11f) * (1.0f + static_cast<float>(i % 7));
  for (int64_t t = 0; t < n; ++t) x[static_cast<size_t>(t * cols + (t * 13) % cols)] = outlier;
  return x;
}

// Decode tiles (1–4 tokens, 8: the last decode tile count), the GEMM from 9 tokens with ragged
// 16-token groups, and a 70-token prefill (the AMX paths start at 64).
constexpr int64_t kTokenCounts[] = {1, 2, 3, 4, 8, 9, 17, 70};

void hash_matmul(Hasher& h, MatmulFn fn, MatmulMultiFn multi, const WeightView& v) {
  for (int64_t n : kTokenCounts) {
    // An activation past f16's range (F16 decode falls back to f32 activations) at one decode
    // and one prefill count; an ordinary outlier elsewhere.
    const float outlier = n == 1 || n == 17 ? 1e5f : 3.0f;
    const std::vector<float> x = probe_acts(n, v.cols, outlier);
    std::vector<float> y(static_cast<size_t>(n * v.rows));
    fn(v, x.data(), n, y.data());
    h.add(&n, sizeof n);
    h.add(y);
    if (multi && (n == 1 || n == 3 || n == 8 || n == 17)) {
      // The fused q/k/v path shares one activation quantization between its weights.
      std::vector<float> y0(y.size()), y1(y.size());
      const WeightView ws[2] = {v, v};
      float* ys[2] = {y0.data(), y1.data()};
      multi(ws, ys, 2, x.data(), n);
      h.add(y0);
      h.add(y1);
    }
  }
}

std::vector<uint8_t> f32_weights(int64_t rows, int64_t cols) {
  std::vector<uint8_t> w(static_cast<size_t>(rows * cols) * 4);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float f = std::cos(0.013f * static_cast<float>(i)) * 0.05f;
    std::memcpy(&w[static_cast<size_t>(i) * 4], &f, 4);
  }
  return w;
}

void hash_formats(Hasher& h, const KernelTable& t) {
  for (int d = 0; d < kNumDTypes; ++d) {
    const MatmulFn fn = t.matmul[d];
    if (!fn) continue;
    const DType dt = static_cast<DType>(d);
    if (!dtype_is_block(dt) && dt != DType::kMlxMXFP8 && dt != DType::kBF16 && dt != DType::kF16 && dt != DType::kF32) continue;
    const int64_t rows = 37, cols = dtype_info(dt).block_elems == 256 ? 512 : 352;
    const std::vector<uint8_t> f32 = dt == DType::kF32 ? f32_weights(rows, cols) : std::vector<uint8_t>();
    const cpu::ProbeWeights pw = dt == DType::kF32 ? cpu::ProbeWeights{}
                                                   : cpu::probe_weights(dt, rows, cols, 4242u + static_cast<uint32_t>(d));
    WeightView v = pw.view;
    v.dtype = dt;
    v.rows = rows;
    v.cols = cols;
    if (dt == DType::kF32) v.data = f32.data();
    h.add_tag(dtype_name(dt));
    hash_matmul(h, fn, t.matmul_multi[d], v);
  }
  for (int bits = 1; bits <= kMaxAffineBits; ++bits) {
    const MatmulFn fn = t.matmul_affine[bits];
    if (!fn) continue;
    const cpu::AffineProbe w = cpu::affine_probe_weights(bits, 37, 384, 64, DType::kBF16);
    h.add(&bits, sizeof bits);
    hash_matmul(h, fn, t.matmul_multi_affine[bits], w.view());
  }
}

void hash_attention(Hasher& h, const KernelTable& t) {
  if (!t.attention) return;
  AttentionParams p;
  p.n_heads = 4;
  p.n_kv_heads = 2;
  p.head_dim = 64;
  p.scale = 0.125f;
  const int64_t ctx = 300, row = p.n_kv_heads * p.head_dim;
  const std::vector<float> k = probe_acts(ctx, row, 2.0f), v = probe_acts(ctx, row, -2.0f);
  for (DType kv : {DType::kF32, DType::kF16, DType::kQ8_0}) {
    std::vector<uint8_t> kb(static_cast<size_t>(kv_bytes(kv, ctx * row))), vb(kb.size());
    kv_encode(kv, k.data(), ctx * row, kb.data());
    kv_encode(kv, v.data(), ctx * row, vb.data());
    for (int64_t window : {int64_t{0}, int64_t{40}}) {
      p.window = window;
      // A prefill chunk at the end of the context and a single decode row.
      for (int64_t n : {int64_t{70}, int64_t{1}}) {
        const std::vector<float> q = probe_acts(n, p.n_heads * p.head_dim, 1.5f);
        std::vector<float> out(q.size());
        const KvSpanView span{kb.data(), vb.data(), 0, ctx, kv};
        t.attention(q.data(), n, ctx - n, &span, 1, p, out.data());
        h.add(out);
      }
    }
  }
  // Attention sinks (gpt-oss) are folded in by the kernel too: their arithmetic is part of the
  // numerics a model's later layers' K/V rows depend on.
  const std::vector<float> sinks = probe_acts(1, p.n_heads, 3.0f);
  p.window = 0;
  p.sinks = sinks.data();
  for (int64_t n : {int64_t{70}, int64_t{1}}) {
    const std::vector<float> q = probe_acts(n, p.n_heads * p.head_dim, 1.5f);
    std::vector<float> out(q.size());
    const KvSpanView span{k.data(), v.data(), 0, ctx, DType::kF32};
    t.attention(q.data(), n, ctx - n, &span, 1, p, out.data());
    h.add(out);
  }
}

void hash_elementwise(Hasher& h, const KernelTable& t) {
  const int64_t n = 3, dim = 576;
  const std::vector<float> x = probe_acts(n, dim, 7.0f), g = probe_acts(n, dim, -4.0f);
  std::vector<float> out(x.size());
  if (t.rmsnorm) {
    t.rmsnorm(x.data(), g.data(), n, dim, 1e-6f, out.data());
    h.add(out);
  }
  if (t.silu_mul) {
    t.silu_mul(x.data(), g.data(), out.data(), n * dim);
    h.add(out);
  }
  if (t.gelu_tanh_mul) {
    t.gelu_tanh_mul(x.data(), g.data(), out.data(), n * dim);
    h.add(out);
  }
  if (t.swiglu_oai) {  // gpt-oss's alpha; a limit that x and g (|.| <= 7) cross both ways
    t.swiglu_oai(x.data(), g.data(), out.data(), n * dim, 1.702f, 3.0f);
    h.add(out);
  }
  if (t.add) {
    t.add(x.data(), g.data(), out.data(), n * dim);
    h.add(out);
  }
  if (t.softmax) {
    out = x;
    t.softmax(out.data(), n * dim);
    h.add(out);
  }
  if (t.rope) {
    const int heads = 4, head_dim = 64;
    std::vector<float> inv(head_dim / 2);
    for (int i = 0; i < head_dim / 2; ++i) inv[static_cast<size_t>(i)] = std::pow(10000.f, -2.f * static_cast<float>(i) / head_dim);
    const int64_t pos[2] = {5, 4000};
    for (RopePairing pairing : {RopePairing::kHalf, RopePairing::kInterleaved}) {
      std::vector<float> r = probe_acts(2, heads * head_dim, 1.0f);
      t.rope(r.data(), 2, heads, head_dim, head_dim, pos, inv.data(), pairing);
      h.add(r);
    }
  }
  if (t.to_f16) {
    std::vector<uint16_t> half(x.size());
    t.to_f16(x.data(), static_cast<int64_t>(x.size()), half.data());
    h.add(half.data(), half.size() * 2);
  }
  if (t.sum_exp) {
    const double s = t.sum_exp(x.data(), n * dim, 7.0f, 0.5f);
    h.add(&s, sizeof s);
  }
}

// Gated DeltaNet (gated_delta.h): conv1d+SiLU with a carried state, the q/k norm, the gates, both
// forms of the delta rule from a non-zero state, the gated norm. Head dims with a vector tail.
void hash_gated_delta(Hasher& h, const KernelTable& t) {
  if (!t.causal_conv1d || !t.l2norm_heads || !t.gated_delta_gates || !t.gated_delta_recurrent ||
      !t.gated_delta_chunked || !t.rmsnorm_gated)
    return;
  const int hk = 1, hv = 2, dk = 20, dv = 12, K = 4;
  const int64_t n = 3, C = 2 * hk * dk + hv * dv;
  const std::vector<float> x = probe_acts(n, C, 3.0f), w = probe_acts(C, K, -1.0f);
  std::vector<float> conv_state = probe_acts(K - 1, C, 2.0f), qkv(x.size());
  t.causal_conv1d(x.data(), n, {C, K, w.data(), nullptr, true}, conv_state.data(), qkv.data());
  h.add(qkv);
  h.add(conv_state);
  t.l2norm_heads(qkv.data(), n, {hk, dk, C, 1e-6f, 0.25f});
  t.l2norm_heads(qkv.data() + hk * dk, n, {hk, dk, C, 1e-6f, 1.0f});
  h.add(qkv);
  const std::vector<float> ab = probe_acts(2, n * hv, 1.5f), params = probe_acts(2, hv, 0.5f);
  std::vector<float> log_g(static_cast<size_t>(n * hv)), beta(log_g.size());
  t.gated_delta_gates(ab.data(), ab.data() + n * hv, n, {hv, params.data(), params.data() + hv}, log_g.data(),
                      beta.data());
  h.add(log_g);
  h.add(beta);
  const GatedDeltaInputs in{qkv.data(), qkv.data() + hk * dk, qkv.data() + 2 * hk * dk, C, log_g.data(), beta.data(), n, 0};
  for (GatedDeltaFn fn : {t.gated_delta_recurrent, t.gated_delta_chunked}) {
    std::vector<float> state = probe_acts(hv * dv, dk, 0.5f), y(static_cast<size_t>(n * hv * dv));
    for (float& s : state) s *= 0.05f;
    fn(in, {hk, hv, dk, dv}, state.data(), y.data());
    h.add(y);
    h.add(state);
  }
  std::vector<float> out(static_cast<size_t>(n * hv * dv));
  const std::vector<float> z = probe_acts(n * hv, dv, -2.0f), nw = probe_acts(1, dv, 1.0f);
  t.rmsnorm_gated(qkv.data(), z.data(), nw.data(), n * hv, dv, 1e-6f, out.data());
  h.add(out);
}

}  // namespace

std::string numerics_fingerprint(const KernelTable& t) {
  Hasher h;
  const int rev = kNumericsRevision;
  h.add(&rev, sizeof rev);
  hash_formats(h, t);
  hash_attention(h, t);
  hash_elementwise(h, t);
  hash_gated_delta(h, t);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h.digest()));
  return std::string("cpu:") + t.name + ":" + hex;
}

std::string active_numerics_id() {
  static_assert(std::is_trivially_copyable_v<KernelTable>);
  static std::mutex mu;
  static KernelTable for_table;
  static std::string id;
  std::lock_guard<std::mutex> lock(mu);
  const KernelTable& t = active_table();
  if (id.empty() || std::memcmp(&for_table, &t, sizeof t) != 0) {
    id = numerics_fingerprint(t);
    std::memcpy(static_cast<void*>(&for_table), &t, sizeof t);
  }
  return id;
}

}  // namespace larder::kernels
