// logits_avx2.cpp — argmax, sum_exp and select_at_least over one row of logits, 8 lanes.
//
// A row is the vocabulary (49k–262k floats, 0.2–1 MiB: L2-resident after the lm-head matmul
// wrote it), read once per sampled token on the engine thread while the rest of the pool waits.
//   argmax          per-lane best value and index (four accumulators), replaced only on a
//                   strictly greater value (so each lane keeps its lowest index of a tie; NaN
//                   compares false and never enters), then the lanes reduced by value, lowest
//                   index on ties — exact.
//   sum_exp         simd::exp_ps of (x − shift)·scale, zeroed where x is NaN or −∞, accumulated
//                   in double lanes (a 262k-term f32 sum would drift by ~1e-5).
//   select_at_least one compare and movemask per 8 floats; the (few) set bits are appended in
//                   order — exact.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/simd_exp_avx2.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::cpu::avx2 {

int64_t argmax(const float* x, int64_t n) {
  int64_t i = 0;
  float best = -INFINITY;
  int64_t best_i = -1;
  if (n >= 32) {
    // Four (value, index) accumulators: one compare + blend chain per 8 floats would be bound by
    // its latency, not by the loads.
    __m256 bv[4];
    __m256i bi[4], idx[4];
    for (int a = 0; a < 4; ++a) {
      bv[a] = _mm256_set1_ps(-INFINITY);
      bi[a] = _mm256_set1_epi32(-1);
      idx[a] = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * a));
    }
    const __m256i step = _mm256_set1_epi32(32);
    for (; i + 32 <= n; i += 32) {
      for (int a = 0; a < 4; ++a) {
        const __m256 v = _mm256_loadu_ps(x + i + 8 * a);
        const __m256 gt = _mm256_cmp_ps(v, bv[a], _CMP_GT_OQ);
        bv[a] = _mm256_blendv_ps(bv[a], v, gt);
        bi[a] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bi[a]), _mm256_castsi256_ps(idx[a]), gt));
        idx[a] = _mm256_add_epi32(idx[a], step);
      }
    }
    alignas(32) float v8[32];
    alignas(32) int32_t i8[32];
    for (int a = 0; a < 4; ++a) {
      _mm256_store_ps(v8 + 8 * a, bv[a]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(i8 + 8 * a), bi[a]);
    }
    for (int l = 0; l < 32; ++l) {
      if (i8[l] < 0) continue;  // the lane saw only NaN and −∞
      if (best_i < 0 || v8[l] > best || (v8[l] == best && i8[l] < best_i)) best = v8[l], best_i = i8[l];
    }
  }
  for (; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (best_i < 0 || x[i] > best) best = x[i], best_i = i;
  }
  // A row whose maximum is −∞ (every token masked, or NaN): the lanes never left their initial
  // −∞, so the first −∞ index is not known here; the reference settles it.
  if (best_i < 0 || best == -INFINITY) return ref::argmax(x, n);
  return best_i;
}

double sum_exp(const float* x, int64_t n, float shift, float scale) {
  const __m256 vs = _mm256_set1_ps(shift), vk = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd(), a2 = _mm256_setzero_pd(), a3 = _mm256_setzero_pd();
  auto term = [&](__m256 v) {
    const __m256 e = simd::exp_ps(_mm256_mul_ps(_mm256_sub_ps(v, vs), vk));
    return _mm256_and_ps(e, _mm256_cmp_ps(v, ninf, _CMP_GT_OQ));  // NaN, −∞ → 0
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 e0 = term(_mm256_loadu_ps(x + i)), e1 = term(_mm256_loadu_ps(x + i + 8));
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e0)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e0, 1)));
    a2 = _mm256_add_pd(a2, _mm256_cvtps_pd(_mm256_castps256_ps128(e1)));
    a3 = _mm256_add_pd(a3, _mm256_cvtps_pd(_mm256_extractf128_ps(e1, 1)));
  }
  if (i < n) {  // the tail, padded with −∞ (adds nothing)
    alignas(32) float t[16];
    for (int l = 0; l < 16; ++l) t[l] = i + l < n ? x[i + l] : -INFINITY;
    const __m256 e0 = term(_mm256_load_ps(t)), e1 = term(_mm256_load_ps(t + 8));
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e0)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e0, 1)));
    a2 = _mm256_add_pd(a2, _mm256_cvtps_pd(_mm256_castps256_ps128(e1)));
    a3 = _mm256_add_pd(a3, _mm256_cvtps_pd(_mm256_extractf128_ps(e1, 1)));
  }
  const __m256d s = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
  alignas(32) double d[4];
  _mm256_store_pd(d, s);
  return (d[0] + d[1]) + (d[2] + d[3]);
}

int64_t select_at_least(const float* x, int64_t n, float t, int32_t* out) {
  const __m256 vt = _mm256_set1_ps(t);
  int64_t k = 0, i = 0;
  for (; i + 32 <= n; i += 32) {
    // Four compares per test: most of a row is far below the threshold.
    const __m256 c0 = _mm256_cmp_ps(_mm256_loadu_ps(x + i), vt, _CMP_GE_OQ);
    const __m256 c1 = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), vt, _CMP_GE_OQ);
    const __m256 c2 = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 16), vt, _CMP_GE_OQ);
    const __m256 c3 = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 24), vt, _CMP_GE_OQ);
    if (_mm256_testz_ps(_mm256_or_ps(_mm256_or_ps(c0, c1), _mm256_or_ps(c2, c3)), _mm256_castsi256_ps(_mm256_set1_epi32(-1))))
      continue;
    const uint32_t m = static_cast<uint32_t>(_mm256_movemask_ps(c0)) | static_cast<uint32_t>(_mm256_movemask_ps(c1)) << 8 |
                       static_cast<uint32_t>(_mm256_movemask_ps(c2)) << 16 |
                       static_cast<uint32_t>(_mm256_movemask_ps(c3)) << 24;
    for (uint32_t b = m; b != 0; b &= b - 1) out[k++] = static_cast<int32_t>(i + __builtin_ctz(b));
  }
  for (; i < n; ++i)
    if (x[i] >= t) out[k++] = static_cast<int32_t>(i);
  return k;
}

}  // namespace larder::kernels::cpu::avx2
