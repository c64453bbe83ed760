// attention_avx512.cpp — the AVX-512 tier of causal GQA attention: the arithmetic of one packed
// block, computed for tiles of (query row, query head) pairs at once (attention_driver.h cuts the
// work into items, chunks and blocks, packs K/V rows and folds the chunk states).
//
// Why tiles. The AVX2 tier computes a pair at a time as dot products: every K and V element it
// loads feeds one FMA, so it is bound by loads, and its 8 scores come out of a shuffle tree. Here
// the block is two small matrix products with register blocking:
//   scores S[pair][key] = Σ_d q[pair][d]·K[key][d], with K transposed once per block (keys in the
//     lanes) — per head dimension, 1-2 K vectors and up to 12 broadcast query elements feed up to
//     24 FMAs;
//   output O[pair][:] = O·c + Σ_key w[pair][key]·V[key][:] — per key, the V row's vectors and up
//     to 6 broadcast weights feed up to 24 FMAs.
// A prefill item holds 16 rows × the group's heads (64 pairs in Llama 3), so the transpose is
// amortized many times over; decode (1 row × 4 heads) still fills the FMA tiles.
//
// Why a pair's bits do not depend on its tile (attention_driver.h's canonical-order contract: a
// row computed in a 512-row prefill and the same row decoded alone must agree bit for bit):
//   - a score is one FMA chain over d = 0 .. head_dim−1 from +0, whatever the tile;
//   - the tile computes the key vectors (16 absolute block positions each) covering the union
//     of its pairs' ranges; lanes outside a pair's own [lo, hi) are set to −inf before the max,
//     so their weights are exactly +0, and adding +0 to the vertical sum of weights or an exactly
//     +0 product w·v to an accumulator changes no bit — so a wider union gives the same result;
//   - the weight sum adds the key vectors in ascending order, then one fixed horizontal reduce;
//   - each output element is one FMA chain over the keys in ascending order.
// (All for finite V rows. A non-finite V element — an f16 cache overflowing — turns the +0 terms
// of the tile's pairs that do not see it into NaN; the pairs that do see it are NaN or ±inf in
// either tier.)
//
// Numerics differ from the double-precision reference only by f32 rounding and the polynomial
// exp: tests/unit/kernels_fast bound the output and check the canonical-order contract.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "larder/kernels/cpu/avx512/simd_exp_avx512.h"
#include "larder/kernels/cpu/avx512/simd_transpose_avx512.h"
#include "larder/kernels/cpu/common/attention_driver.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/simd_avx2.h"

namespace larder::kernels::cpu::avx512 {

// Internal entry point, exposed (without a header) for tests/unit/kernels_fast only
// (AttentionDriver::attention_tiled).
void attention_tiled(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                     const AttentionParams& p, int64_t tile, int64_t chunk_keys, bool split, int64_t slots_per_item,
                     float* out);

namespace {

constexpr int kMaxBlock = 64;         // keys per block, upper bound (AttentionDriver::kMaxBlock)
// Pairs per score tile: 12 × 2 key vectors = 24 accumulators, and a multiple of every
// accumulation tile (6, 4 or 3 pairs), so the outputs are never computed in a ragged 2-pair tile.
constexpr int kScorePairs = 12;
constexpr int kScoreStride = kMaxBlock;  // floats per pair in the score scratch

// e^x for x <= 0, exactly 0 below −87 (and for −inf): the AVX2 tier's cut.
inline __m512 exp_neg16(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  return _mm512_maskz_mov_ps(keep, exp16(x));
}

// Scores of SP pairs against key vectors [v0, v0 + KVV) of the block: kt is K transposed,
// [hdp][bk]. Each score is one FMA chain over d (the contract above); written unscaled to
// sc[p·kScoreStride + key].
template <int KVV, int SP>
void scores(const AttnPair* pr, const float* kt, int bk, int v0, int hd, float* sc) {
  const float* qp[SP];
  LARDER_UNROLL for (int p = 0; p < SP; ++p) qp[p] = pr[p].q;
  __m512 acc[SP][KVV];
  LARDER_UNROLL for (int p = 0; p < SP; ++p) LARDER_UNROLL for (int v = 0; v < KVV; ++v) acc[p][v] = _mm512_setzero_ps();
  const float* kr = kt + 16 * v0;
  for (int d = 0; d < hd; ++d, kr += bk) {
    __m512 k[KVV];
    LARDER_UNROLL for (int v = 0; v < KVV; ++v) k[v] = _mm512_loadu_ps(kr + 16 * v);
    LARDER_UNROLL for (int p = 0; p < SP; ++p) {
      const __m512 qd = _mm512_set1_ps(qp[p][d]);
      LARDER_UNROLL for (int v = 0; v < KVV; ++v) acc[p][v] = _mm512_fmadd_ps(qd, k[v], acc[p][v]);
    }
  }
  LARDER_UNROLL for (int p = 0; p < SP; ++p)
    LARDER_UNROLL for (int v = 0; v < KVV; ++v) _mm512_storeu_ps(sc + p * kScoreStride + 16 * (v0 + v), acc[p][v]);
}

template <int KVV>
void scores_n(int np, const AttnPair* pr, const float* kt, int bk, int v0, int hd, float* sc) {
  switch (np) {
    case 12: scores<KVV, 12>(pr, kt, bk, v0, hd, sc); break;
    case 11: scores<KVV, 11>(pr, kt, bk, v0, hd, sc); break;
    case 10: scores<KVV, 10>(pr, kt, bk, v0, hd, sc); break;
    case 9: scores<KVV, 9>(pr, kt, bk, v0, hd, sc); break;
    case 8: scores<KVV, 8>(pr, kt, bk, v0, hd, sc); break;
    case 7: scores<KVV, 7>(pr, kt, bk, v0, hd, sc); break;
    case 6: scores<KVV, 6>(pr, kt, bk, v0, hd, sc); break;
    case 5: scores<KVV, 5>(pr, kt, bk, v0, hd, sc); break;
    case 4: scores<KVV, 4>(pr, kt, bk, v0, hd, sc); break;
    case 3: scores<KVV, 3>(pr, kt, bk, v0, hd, sc); break;
    case 2: scores<KVV, 2>(pr, kt, bk, v0, hd, sc); break;
    default: scores<KVV, 1>(pr, kt, bk, v0, hd, sc); break;
  }
}

// acc_p[0, 16·NV) = acc_p·c_p + Σ_{j ∈ [jlo, jhi)} w_p[j]·V[j][0, 16·NV) for AP pairs; V rows
// (already offset to this pass's dimensions) at stride hdp.
template <int NV, int AP>
void accum(float* const* acc, const float* const* w, const float* c, const float* v, int hdp, int jlo, int jhi) {
  __m512 a[AP][NV];
  LARDER_UNROLL for (int p = 0; p < AP; ++p) {
    LARDER_UNROLL for (int i = 0; i < NV; ++i) a[p][i] = _mm512_loadu_ps(acc[p] + 16 * i);
    if (c[p] != 1.0f) {
      const __m512 vc = _mm512_set1_ps(c[p]);
      LARDER_UNROLL for (int i = 0; i < NV; ++i) a[p][i] = _mm512_mul_ps(a[p][i], vc);
    }
  }
  const float* vr = v + static_cast<int64_t>(jlo) * hdp;
  for (int j = jlo; j < jhi; ++j, vr += hdp) {
    __m512 vv[NV];
    LARDER_UNROLL for (int i = 0; i < NV; ++i) vv[i] = _mm512_loadu_ps(vr + 16 * i);
    LARDER_UNROLL for (int p = 0; p < AP; ++p) {
      const __m512 wj = _mm512_set1_ps(w[p][j]);
      LARDER_UNROLL for (int i = 0; i < NV; ++i) a[p][i] = _mm512_fmadd_ps(wj, vv[i], a[p][i]);
    }
  }
  LARDER_UNROLL for (int p = 0; p < AP; ++p)
    LARDER_UNROLL for (int i = 0; i < NV; ++i) _mm512_storeu_ps(acc[p] + 16 * i, a[p][i]);
}

// Pairs per accumulation tile: AP·NV accumulators + NV V vectors within the 32 zmm registers.
template <int NV>
constexpr int kAccPairs = NV <= 4 ? 6 : NV <= 6 ? 4 : 3;

// One pass (NV vectors from dimension d0) over np pairs, in tiles of kAccPairs<NV>, each tile
// over the union of its pairs' key ranges.
template <int NV>
void accum_pass(int np, const AttnPair* pr, const float* const* w, const float* c, const float* v, int hdp, int d0) {
  constexpr int AP = kAccPairs<NV>;
  for (int p0 = 0; p0 < np; p0 += AP) {
    const int k = std::min(AP, np - p0);
    float* acc[AP];
    int jlo = kMaxBlock, jhi = 0;
    for (int p = 0; p < k; ++p) {
      acc[p] = pr[p0 + p].acc + d0;
      jlo = std::min(jlo, pr[p0 + p].lo);
      jhi = std::max(jhi, pr[p0 + p].hi);
    }
    const float* const* wp = w + p0;
    const float* cp = c + p0;
    switch (k) {
      case 1: accum<NV, 1>(acc, wp, cp, v + d0, hdp, jlo, jhi); break;
      case 2: accum<NV, 2>(acc, wp, cp, v + d0, hdp, jlo, jhi); break;
      case 3: accum<NV, 3>(acc, wp, cp, v + d0, hdp, jlo, jhi); break;
      case 4: if constexpr (AP >= 4) accum<NV, 4>(acc, wp, cp, v + d0, hdp, jlo, jhi); break;
      case 5: if constexpr (AP >= 5) accum<NV, 5>(acc, wp, cp, v + d0, hdp, jlo, jhi); break;
      default: if constexpr (AP >= 6) accum<NV, 6>(acc, wp, cp, v + d0, hdp, jlo, jhi); break;
    }
  }
}

using AccumPassFn = void (*)(int, const AttnPair*, const float* const*, const float*, const float*, int, int);
constexpr AccumPassFn kAccumPass[9] = {nullptr,        accum_pass<1>, accum_pass<2>, accum_pass<3>, accum_pass<4>,
                                       accum_pass<5>, accum_pass<6>, accum_pass<7>, accum_pass<8>};

// Bit j set for the block keys j in [lo, hi) (0 <= lo < hi <= kMaxBlock).
inline uint64_t key_bits(int lo, int hi) {
  const uint64_t below_hi = hi >= 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
  return below_hi & ~((uint64_t{1} << lo) - 1);
}

struct Avx512Tier {
  static int pad(int hd) { return (hd + 15) & ~15; }
  // 32 keys per block (two key vectors) from head_dim 64 up; below, up to 64 within 8 KiB of K as
  // in the AVX2 tier. A power of two, so it divides every chunk length. At head_dim 256 (Gemma 3)
  // K, its transpose and V of 32 keys exceed L1 and live in L2, but the per-block work of a pair
  // (tile setup, the max and sum reductions, the rescale) halves: 16-key blocks there measured
  // ~10 % slower (gemma-3-270m pp512 attention, 2 threads, 3 runs: 104 → 92 ms). 64-key blocks at
  // head_dim 64 made the 1B prefill's attention 10 % faster but its decode after 4096 tokens 10 %
  // slower (47–54 → 43–44 tok/s), and both must use one block size (the canonical order).
  static int block_keys(int hd) {
    if (hd >= 64) return 32;
    int b = 32;
    while (2 * b <= kMaxBlock && 2 * b * std::max(hd, 1) <= 2048) b *= 2;
    return b;
  }
  static constexpr size_t kScoreFloats = kScorePairs * kScoreStride;
  static size_t aux_floats(int bk, int hdp) { return static_cast<size_t>(bk) * hdp; }

  // K transposed: kt[d][j] = kp[j][d] for the block's bk rows (rows nobody sees included: finite).
  static void prepare(const float* kp, int bk, int hdp, float* kt) {
    __m512i r[16];
    for (int j0 = 0; j0 < bk; j0 += 16) {
      for (int d0 = 0; d0 < hdp; d0 += 16) {
        for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(kp + static_cast<int64_t>(j0 + i) * hdp + d0);
        transpose16x16(r);
        for (int i = 0; i < 16; ++i) _mm512_storeu_si512(kt + static_cast<int64_t>(d0 + i) * bk + j0, r[i]);
      }
    }
  }

  static void block(const AttnPair* pairs, int count, const AttnBlock& b) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512 vscale = _mm512_set1_ps(b.scale);
    for (int p0 = 0; p0 < count; p0 += kScorePairs) {
      const int np = std::min(kScorePairs, count - p0);
      const AttnPair* pr = pairs + p0;
      int lo = kMaxBlock, hi = 0;
      for (int p = 0; p < np; ++p) {
        lo = std::min(lo, pr[p].lo);
        hi = std::max(hi, pr[p].hi);
      }
      const int v0 = lo / 16, v1 = (hi + 15) / 16;
      for (int v = v0; v < v1; v += 2) {
        if (v1 - v >= 2) scores_n<2>(np, pr, b.aux, b.bk, v, b.hd, b.sc);
        else scores_n<1>(np, pr, b.aux, b.bk, v, b.hd, b.sc);
      }
      // Per pair: scale, mask, block max, rescale factor, weights and their sum. The scores stay in
      // registers between the passes, and the horizontal max is taken only when some lane exceeds
      // the running max — after the first blocks it rarely does, and then m and l need no scalar
      // exp and the accumulators no rescale (the same result as always taking it: m grows iff a
      // lane exceeds it).
      const float* w[kScorePairs];
      float c[kScorePairs];
      const int nv = v1 - v0;
      for (int p = 0; p < np; ++p) {
        const AttnPair& x = pr[p];
        float* s = b.sc + p * kScoreStride;
        w[p] = s;
        const uint64_t bits = key_bits(x.lo, x.hi);
        float& m = *x.m;
        const __m512 vm_old = _mm512_set1_ps(m);
        __m512 sv[kMaxBlock / 16];
        __mmask16 grow = 0;
        for (int v = 0; v < nv; ++v) {
          const auto lanes = static_cast<__mmask16>(bits >> (16 * (v0 + v)));
          sv[v] = _mm512_mask_mov_ps(ninf, lanes, _mm512_mul_ps(_mm512_loadu_ps(s + 16 * (v0 + v)), vscale));
          grow |= _mm512_cmp_ps_mask(sv[v], vm_old, _CMP_GT_OQ);
        }
        c[p] = 1.0f;
        if (grow) {
          __m512 vmax = sv[0];
          for (int v = 1; v < nv; ++v) vmax = _mm512_max_ps(vmax, sv[v]);
          const float bmax = _mm512_reduce_max_ps(vmax);
          c[p] = m == -INFINITY ? 0.0f : std::exp(m - bmax);
          m = bmax;
        }
        const __m512 vm = _mm512_set1_ps(m);
        __m512 lsum = _mm512_setzero_ps();
        for (int v = 0; v < nv; ++v) {
          const __m512 wv = exp_neg16(_mm512_sub_ps(sv[v], vm));
          _mm512_storeu_ps(s + 16 * (v0 + v), wv);
          lsum = _mm512_add_ps(lsum, wv);
        }
        *x.l = *x.l * c[p] + _mm512_reduce_add_ps(lsum);
      }
      // Outputs, 128 dimensions (8 vectors) per pass.
      for (int d0 = 0; d0 < b.hdp; d0 += 128) kAccumPass[std::min(128, b.hdp - d0) / 16](np, pr, w, c, b.vp, b.hdp, d0);
    }
  }
};

using Driver = AttentionDriver<Avx512Tier>;
static_assert(Driver::kMaxBlock == kMaxBlock);
static_assert(Avx512Tier::kScoreFloats >= static_cast<size_t>(kScorePairs) * kMaxBlock);

}  // namespace

void attention_tiled(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                     const AttentionParams& p, int64_t tile, int64_t chunk_keys, bool split, int64_t slots_per_item,
                     float* out) {
  Driver::attention_tiled(q, n, q_pos0, spans, n_spans, p, tile, chunk_keys, split, slots_per_item, out);
}

void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans, const AttentionParams& p,
               float* out) {
  Driver::attention(q, n, q_pos0, spans, n_spans, p, out);
}

}  // namespace larder::kernels::cpu::avx512
