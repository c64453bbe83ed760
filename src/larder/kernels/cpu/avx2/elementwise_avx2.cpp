// elementwise_avx2.cpp — rmsnorm, rope, silu·mul, gelu_tanh·mul and add for the AVX2 tier, on the thread pool.
//
// Why they matter: in a 512-token prefill these ops touch tokens × (hidden or ffn) floats per
// layer. The single-threaded scalar references (double-precision exp; rope then took a sin/cos per head) were ~0.4 s
// of a 1B model's 512-token prefill and did not speed up with threads, which is what held back the
// 2-thread prefill scaling (Amdahl). Here each op splits its rows/elements over the pool when the
// job is big enough to pay for a fork (≥ kMinParallelWork floats, common/parallel_split.h), and vectorises the arithmetic:
//   silu·mul  g / (1 + e^-g) · u with an 8-lane exp (simd::exp_ps, ≤ ~1 ulp) — vs the double reference
//             the relative error is a few f32 ulps;
//   rmsnorm   sum of squares in 4 f32 accumulators of 8 lanes (the reference sums in double; for the
//             dims of real models the difference is ~1e-7 relative), then HF's order: x·inv rounded
//             to f32, times the weight;
//   rope      the reference's two halves (double sin/cos once per token and pair, double
//             rotation) on token ranges, the angles kept across layers — bit-identical;
//   add       a plain vector add — bit-identical.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/parallel_split.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/cpu/common/simd_exp_avx2.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::cpu::avx2 {

namespace {

// Lanes [0, m) of 8 (m < 8): the tails of the ranges below run the vector formula under this mask,
// so an element's result does not depend on whether a call's range ends near it (a scalar tail
// with std::exp gave other bits than exp_ps: a token's FFN then depended on its batch, issue 41).
inline __m256i tail_mask(int64_t m) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(m)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

void silu_mul_range(const float* g, const float* u, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  auto step = [&](__m256 gv, __m256 uv) {
    const __m256 e = simd::exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    return _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), uv);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, step(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(out + i, m, step(_mm256_maskload_ps(g + i, m), _mm256_maskload_ps(u + i, m)));
  }
}

// gelu_tanh(g)·u = g·u·½(1 + tanh z) = g·u / (1 + e^(−2z)), z = √(2/π)(g + 0.044715 g³): one exp,
// no tanh. For g ≪ 0 e^(−2z) saturates at e^88.3 and the result is ~g·u·1e-38 (the reference: 0).
void gelu_tanh_mul_range(const float* g, const float* u, float* out, int64_t n) {
  constexpr float kC = 0.7978845608028654f;  // √(2/π)
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 c1 = _mm256_set1_ps(-2.0f * kC), c3 = _mm256_set1_ps(-2.0f * kC * 0.044715f);
  auto step = [&](__m256 gv, __m256 uv) {
    const __m256 t = _mm256_mul_ps(gv, _mm256_fmadd_ps(_mm256_mul_ps(gv, gv), c3, c1));  // −2z
    const __m256 e = simd::exp_ps(t);
    return _mm256_div_ps(_mm256_mul_ps(gv, uv), _mm256_add_ps(one, e));
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, step(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  if (i < n) {  // the same formula under a mask (silu_mul_range's reason)
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(out + i, m, step(_mm256_maskload_ps(g + i, m), _mm256_maskload_ps(u + i, m)));
  }
}

void rmsnorm_row(const float* x, const float* w, int64_t dim, float eps, float* out) {
  __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= dim; i += 32)
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * k);
      s[k] = _mm256_fmadd_ps(v, v, s[k]);
    }
  for (; i + 8 <= dim; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    s[0] = _mm256_fmadd_ps(v, v, s[0]);
  }
  double ss = simd::hsum(_mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])));
  for (; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + static_cast<double>(eps)));
  const __m256 iv = _mm256_set1_ps(inv);
  i = 0;
  for (; i + 8 <= dim; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv), _mm256_loadu_ps(w + i)));
  for (; i < dim; ++i) out[i] = (x[i] * inv) * w[i];
}

}  // namespace

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  parallel_split(n, 4096, 1, [&](int64_t b, int64_t e) { silu_mul_range(gate + b, up + b, out + b, e - b); });
}

void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  parallel_split(n, 4096, 1, [&](int64_t b, int64_t e) { gelu_tanh_mul_range(gate + b, up + b, out + b, e - b); });
}

void add(const float* a, const float* b, float* out, int64_t n) {
  parallel_split(n, 8192, 1, [&](int64_t s, int64_t e) {
    int64_t i = s;
    for (; i + 8 <= e; i += 8) _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < e; ++i) out[i] = a[i] + b[i];
  });
}

// One thread: a prefill's K or V rows (512 tokens × 512 values) take ~10 µs, less than a pool
// round trip would save.
void to_f16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* out) {
  parallel_split(n, 1, dim, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) rmsnorm_row(x + t * dim, weight, dim, eps, out + t * dim);
  });
}

namespace {

// The angle tables of the last few (frequencies, positions) the calling thread rotated by. Every
// layer of a forward rotates q and k at the same positions by one of the model's one or two
// frequency tables, so computing the sin/cos — most of rope's cost — once per table and forward
// instead of twice per layer saves 2·layers/tables of them (gemma-3-270m: 36 → 2 per forward;
// they were 8 % of its 512-token prefill). The key is the content, positions and frequencies, so
// an entry can never be used for other angles; rope_angles is the reference's own, so the result
// stays bit-identical.
struct RopeAngles {
  std::vector<float> inv_freq;
  std::vector<int64_t> positions;
  std::vector<double> cs;  // [n][2·half]
  uint64_t last_use = 0;
};

// Entries hold at most this much (a 512-token chunk at head_dim 256 is 1 MiB); a larger call's
// table is computed into `big` for that call only, so the cache never pins a long prompt's
// tables for the life of the thread.
constexpr size_t kMaxCachedBytes = size_t{8} << 20;

const double* rope_angles_cached(const int64_t* positions, int64_t n, const float* inv_freq, int half,
                                 std::vector<double>& big) {
  // A sin/cos pair costs ~20 ns: count it as 16 floats of elementwise work.
  auto fill = [&](double* cs) {
    parallel_split(n, 1, 16 * half, [&](int64_t b, int64_t e) { ref::rope_angles(positions + b, e - b, inv_freq, half, cs + b * 2 * half); });
  };
  if (static_cast<size_t>(n * 2 * half) * sizeof(double) > kMaxCachedBytes) {
    big.resize(static_cast<size_t>(n * 2 * half));
    fill(big.data());
    return big.data();
  }
  thread_local std::array<RopeAngles, 4> cache;  // gemma: 2 tables; room for a second sequence
  thread_local uint64_t clock = 0;
  ++clock;
  for (RopeAngles& e : cache) {
    if (static_cast<int64_t>(e.positions.size()) == n && static_cast<int>(e.inv_freq.size()) == half &&
        std::equal(positions, positions + n, e.positions.begin()) &&
        std::equal(inv_freq, inv_freq + half, e.inv_freq.begin())) {
      e.last_use = clock;
      return e.cs.data();
    }
  }
  RopeAngles& e = *std::min_element(cache.begin(), cache.end(),
                                    [](const RopeAngles& a, const RopeAngles& b) { return a.last_use < b.last_use; });
  e.inv_freq.assign(inv_freq, inv_freq + half);
  e.positions.assign(positions, positions + n);
  e.cs.resize(static_cast<size_t>(n * 2 * half));
  e.cs.shrink_to_fit();  // an entry keeps only what its table needs
  fill(e.cs.data());
  e.last_use = clock;
  return e.cs.data();
}

}  // namespace

void rope(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const int64_t* positions,
          const float* inv_freq, RopePairing pairing) {
  const int half = rot_dim / 2;
  std::vector<double> big;
  const double* cs = rope_angles_cached(positions, n, inv_freq, half, big);
  const int64_t stride = static_cast<int64_t>(n_heads) * head_dim;
  parallel_split(n, 1, stride, [&](int64_t b, int64_t e) {
    ref::rope_rotate(x + b * stride, e - b, n_heads, head_dim, rot_dim, cs + b * 2 * half, pairing);
  });
}

}  // namespace larder::kernels::cpu::avx2
