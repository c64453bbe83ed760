// attention_avx2.cpp — the AVX2/FMA/F16C tier of causal GQA attention: the arithmetic of one
// packed block (attention_driver.h cuts the work into items, chunks and blocks, packs K/V rows and
// folds the chunk states).
//
// Per (query row, query head) pair and block: scores 8 keys at a time (8 dot products reduced with
// one hadd tree), one vector max and one vector exp per 8 keys, the running sum and accumulator
// rescaled only when the maximum grows, then V rows accumulated in registers. Pairs are computed
// one after another, each over exactly the keys it sees, so a pair's bits never depend on the
// other pairs of the call.
//
// Numerics differ from the double-precision reference only by f32 rounding and the polynomial
// exp (< 1 ulp over [-87, 0], tested): tests/unit/kernels_fast bound the output.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "larder/kernels/cpu/common/attention_driver.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/cpu/common/simd_exp_avx2.h"

namespace larder::kernels::cpu::avx2 {

// Internal entry points, exposed (without a header) for tests/unit/kernels_fast only: attention
// with an explicit row tile, chunk length (rounded up to a multiple of the block) and split
// choice (AttentionDriver::attention_tiled), and the vector exp of the softmax.
void attention_tiled(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                     const AttentionParams& p, int64_t tile, int64_t chunk_keys, bool split, int64_t slots_per_item,
                     float* out);
void exp_neg_batch(const float* x, float* y, int64_t n);

namespace {

constexpr int kMaxBlock = 64;  // keys per block, upper bound (AttentionDriver::kMaxBlock)

inline __m256 exp_neg(__m256 x) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
  return _mm256_and_ps(simd::exp_ps(x), keep);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Eight dot products q·k_u. The eight accumulators are independent FMA chains (enough to cover
// the FMA latency), and one hadd tree turns them into a vector of 8 scores — 9 shuffle/add ops
// per 8 keys instead of a 6-op horizontal sum per key. q and the packed K rows are zero-padded
// to hdp (a multiple of 8), so every load is a full vector.
template <int HD>
inline __m256 scores8(const float* qh, const float* const* kr, int hdp) {
  const int nv = HD ? HD / 8 : hdp / 8;
  __m256 s[8];
  LARDER_UNROLL for (int u = 0; u < 8; ++u) s[u] = _mm256_setzero_ps();
  LARDER_UNROLL for (int i = 0; i < nv; ++i) {
    const __m256 qv = _mm256_loadu_ps(qh + 8 * i);
    LARDER_UNROLL for (int u = 0; u < 8; ++u) s[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[u] + 8 * i), s[u]);
  }
  const __m256 h01 = _mm256_hadd_ps(s[0], s[1]), h23 = _mm256_hadd_ps(s[2], s[3]);
  const __m256 h45 = _mm256_hadd_ps(s[4], s[5]), h67 = _mm256_hadd_ps(s[6], s[7]);
  const __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
  // Lane halves: low 128 bits hold keys 0-3 / 4-7 summed over dims 0-3 of each 8, high over 4-7.
  return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20), _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

// acc[0, 8·NV) = acc·c + Σ_j w[j]·v_j[0, 8·NV), with the NV accumulators in registers for the
// whole block (8 independent FMA chains at NV = 8 — exactly the 2-FMA/cycle × 4-cycle latency).
// V rows are packed and zero-padded like K, so the padding lanes of acc accumulate zeros.
template <int NV>
void accum(float* acc, const float* v0, int64_t stride, const float* w, int cnt, float c) {
  __m256 a[NV];
  LARDER_UNROLL for (int i = 0; i < NV; ++i) a[i] = _mm256_loadu_ps(acc + 8 * i);
  if (c != 1.0f) {
    const __m256 vc = _mm256_set1_ps(c);
    LARDER_UNROLL for (int i = 0; i < NV; ++i) a[i] = _mm256_mul_ps(a[i], vc);
  }
  const float* v = v0;
  for (int j = 0; j < cnt; ++j, v += stride) {
    const __m256 wj = _mm256_broadcast_ss(w + j);
    LARDER_UNROLL for (int i = 0; i < NV; ++i) a[i] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 8 * i), a[i]);
  }
  LARDER_UNROLL for (int i = 0; i < NV; ++i) _mm256_storeu_ps(acc + 8 * i, a[i]);
}

using AccumFn = void (*)(float*, const float*, int64_t, const float*, int, float);
constexpr AccumFn kAccum[9] = {nullptr,   accum<1>, accum<2>, accum<3>, accum<4>,
                               accum<5>, accum<6>, accum<7>, accum<8>};

// Any (padded) head size: 64 dims (8 registers) per pass over the block's V rows.
void accum_any(float* acc, const float* v0, int64_t stride, const float* w, int cnt, float c, int hdp) {
  for (int d0 = 0; d0 < hdp; d0 += 64) kAccum[std::min(64, hdp - d0) / 8](acc + d0, v0 + d0, stride, w, cnt, c);
}

// One (query row, query head) pair against keys [lo, hi) of a packed block (K and V rows of one
// KV head at stride hdp). m, l, acc: the pair's running max, sum and un-normalised output (acc
// padded to hdp).
template <int HD>
void pair_block(const float* qh, const float* kp, const float* vp, int lo, int hi, int hdp, float scale, float* sc,
                float& m, float& l, float* acc) {
  const int cnt = hi - lo;
  const int64_t stride = HD ? HD : hdp;
  const float* kb = kp + lo * stride;
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  const __m256 vscale = _mm256_set1_ps(scale);
  __m256 vmax = ninf;
  for (int j = 0; j < cnt; j += 8) {
    // A ragged last group reads up to 7 rows past the block's keys — the packed buffer has them,
    // holding finite stale or zero rows — and masks those lanes. With HD known the 8 row
    // addresses are one register plus constant displacements.
    const float* kr[8];
    LARDER_UNROLL for (int u = 0; u < 8; ++u) kr[u] = kb + (j + u) * stride;
    __m256 s = _mm256_mul_ps(scores8<HD>(qh, kr, hdp), vscale);
    if (j + 8 > cnt) s = _mm256_blendv_ps(ninf, s, _mm256_castsi256_ps(simd::first_lanes(cnt - j)));
    _mm256_storeu_ps(sc + j, s);
    vmax = _mm256_max_ps(vmax, s);
  }
  // Rescale what came before only when the maximum grows: after the first few blocks it rarely
  // does, and then the block costs no scalar exp and no accumulator multiply.
  const float bmax = hmax(vmax);
  float c = 1.0f;
  if (bmax > m) {
    c = m == -INFINITY ? 0.0f : std::exp(m - bmax);
    m = bmax;
  }
  const __m256 vm = _mm256_set1_ps(m);
  __m256 lsum = _mm256_setzero_ps();
  for (int j = 0; j < cnt; j += 8) {
    const __m256 w = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vm));
    _mm256_storeu_ps(sc + j, w);
    lsum = _mm256_add_ps(lsum, w);
  }
  l = l * c + simd::hsum(lsum);
  const float* vb = vp + lo * stride;
  if (HD == 64) {
    accum<8>(acc, vb, stride, sc, cnt, c);
  } else if (HD == 128) {  // two passes of 8 registers: 16 accumulators would spill
    accum<8>(acc, vb, stride, sc, cnt, c);
    accum<8>(acc + 64, vb + 64, stride, sc, cnt, c);
  } else {
    accum_any(acc, vb, stride, sc, cnt, c, hdp);
  }
}

// K+V of one packed block ≤ 16 KiB, half the 32 KiB L1d: room remains for q, the accumulators,
// the scores and the source lines the packing streams through. A power of two (32 keys at
// head_dim 64, 16 at 128, 8 at 256) so it divides every chunk length.
struct Avx2Tier {
  static int pad(int hd) { return (hd + 7) & ~7; }
  static int block_keys(int hd) {
    int b = 8;
    while (2 * b <= kMaxBlock && 2 * b * std::max(hd, 1) <= 2048) b *= 2;
    return b;
  }
  static constexpr size_t kScoreFloats = kMaxBlock + 8;
  static size_t aux_floats(int, int) { return 0; }
  static void prepare(const float*, int, int, float*) {}
  static void block(const AttnPair* pairs, int count, const AttnBlock& b) {
    for (int i = 0; i < count; ++i) {
      const AttnPair& x = pairs[i];
      if (b.hd == 64) {
        pair_block<64>(x.q, b.kp, b.vp, x.lo, x.hi, b.hdp, b.scale, b.sc, *x.m, *x.l, x.acc);
      } else if (b.hd == 128) {
        pair_block<128>(x.q, b.kp, b.vp, x.lo, x.hi, b.hdp, b.scale, b.sc, *x.m, *x.l, x.acc);
      } else {
        pair_block<0>(x.q, b.kp, b.vp, x.lo, x.hi, b.hdp, b.scale, b.sc, *x.m, *x.l, x.acc);
      }
    }
  }
};

using Driver = AttentionDriver<Avx2Tier>;
static_assert(Driver::kMaxBlock == kMaxBlock);

}  // namespace

void exp_neg_batch(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_neg(_mm256_loadu_ps(x + i)));
  if (i < n) {
    float bx[8] = {}, by[8];
    std::copy(x + i, x + n, bx);
    _mm256_storeu_ps(by, exp_neg(_mm256_loadu_ps(bx)));
    std::copy_n(by, n - i, y + i);
  }
}

void attention_tiled(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                     const AttentionParams& p, int64_t tile, int64_t chunk_keys, bool split, int64_t slots_per_item,
                     float* out) {
  Driver::attention_tiled(q, n, q_pos0, spans, n_spans, p, tile, chunk_keys, split, slots_per_item, out);
}

void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans, const AttentionParams& p,
               float* out) {
  Driver::attention(q, n, q_pos0, spans, n_spans, p, out);
}

}  // namespace larder::kernels::cpu::avx2
