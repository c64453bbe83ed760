// attention_avx2.cpp — causal GQA attention with an online (streaming) softmax, f32, AVX2/FMA.
//
// Work item = (tile of up to 16 query rows, KV heads, KV chunk). The `group` query heads that
// share a KV head and the tile's rows are processed together, so each K and V row is pulled from
// memory once per item instead of once per (row, query head) — decode attention is a stream over
// the whole cache, GQA (group 4 in Llama 3) cuts its bytes 4x, and in prefill the row tile cuts
// them again (a first version without row tiles ran a 256-row chunk at 4k context at ~2 GFLOP/s,
// bound on L3 misses).
//
// Prefill and short contexts: one KV head per item, the whole key range, row tiles sized for
// load balance. Decode (n <= 16 rows) at long contexts has too few such items to keep the pool
// busy — with one KV head there is one serial item — and shrinking the row tile to make more
// would re-read the cache once per tile. There the KV range is split instead (flash-decoding):
// each item takes all rows and all KV heads of one chunk of keys and leaves a partial (max, sum,
// un-normalised output) per (row, head); a second pass merges the chunks with the log-sum-exp
// rule. The cache is still read exactly once, front to back.
//
// Inside an item, keys are taken in blocks whose K and V rows (packed contiguously, see
// pack_rows) stay in L1 while every (row, head) pair of the item consumes them. Per pair and
// block: scores are computed 8 keys at a time (8 dot products reduced together with one hadd
// tree, no per-key horizontal sum), one vector max and one vector exp per 8 keys, the running
// sum and accumulator rescaled only when the maximum grows, then V rows are accumulated into
// registers.
//
// Numerics differ from the double-precision reference only by f32 rounding and the polynomial
// exp (< 1 ulp over [-87, 0], tested): tests/unit/kernels_fast bound the output.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/cpu/common/simd_exp_avx2.h"

namespace larder::kernels::cpu::avx2 {

// Internal entry points, exposed (without a header) for tests/unit/kernels_fast only: attention
// with an explicit row tile and KV chunk length, so the chunk/merge path can be driven with
// chunks small enough that some are fully masked for some rows, whatever the thread count.
void attention_tiled(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                     const AttentionParams& p, int64_t tile, int64_t chunk_keys, int64_t slots_per_item, float* out);
void exp_neg_batch(const float* x, float* y, int64_t n);

namespace {

constexpr int kMaxGroup = 16;       // query heads per KV head handled in one item (larger: split)
constexpr int64_t kMaxTile = 16;    // query rows per item
constexpr int kMaxBlock = 64;       // keys per block, upper bound
// What a chunk adds per (query row, head): initialising, writing and merging one partial
// accumulator (~3 passes over head_dim floats, one scalar exp), plus a ragged last block — about
// the work of 2-4 keys. At 256 keys per chunk that stays near 1%, so shorter chunks would buy
// nothing but overhead, and a context shorter than two chunks (512 keys) is never split.
constexpr int64_t kMinChunk = 256;
constexpr int64_t kSplitMinKeys = 2 * kMinChunk;

// K+V of one packed block ≈ 16 KiB, half the 32 KiB L1d: room remains for q, the accumulators,
// the scores and the source lines the packing streams through. (32 keys at head_dim 64, 16 at
// 128; larger blocks would only amortise the per-block max/exp bookkeeping further.)
inline int block_keys(int hd) { return std::clamp((2048 / std::max(hd, 1)) & ~7, 8, kMaxBlock); }

// exp(x) for x <= 0 (scores minus their maximum), 8 lanes: simd::exp_ps (Cody–Waite reduction,
// degree-7 polynomial; max error against a double exp over [-87, 0]: 0.89 ulp, bounded by 1 ulp in
// AttentionAvx2.ExpNegWithinOneUlp). Inputs below -87 (and -inf, masked keys) flush to 0: their
// weight is < 1e-37 of the maximum's.
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

// Lanes [0, k) set.
inline __m256i first_lanes(int k) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
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
    if (j + 8 > cnt) s = _mm256_blendv_ps(ninf, s, _mm256_castsi256_ps(first_lanes(cnt - j)));
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

struct Scratch {
  std::vector<float> q;       // [rows, group, hdp] zero-padded query heads
  std::vector<float> acc;     // [rows, group, hdp]
  std::vector<float> m, l;    // [rows, group]
  std::vector<float> kv;      // packed block: K [block_keys + 8, hdp], V [block_keys, hdp], 64-byte aligned
  float sc[kMaxBlock + 8];    // one pair's block scores / weights
};

// Copies `rows` K/V rows of one KV head (source stride `stride`) into dst at stride hdp,
// zero-padding each row. Why pack: one head's rows sit n_kv_heads·head_dim·4 bytes apart — 2 KiB
// for Llama's 8×64, a power of two — so a 32-key block of them (128 lines of K alone) maps onto
// only 8 of L1d's 64 sets (64 lines) and evicts itself before the group's other query heads
// re-read it. Packed, K+V of a block are 16 contiguous KiB, and the padding lets every load be
// a full vector. The copy is also where the cache is streamed from memory, so it prefetches the
// next block (`pf`, into L2: an L1 prefetch of the strided rows would alias the same sets).
template <int HD>  // 0: any head size (runtime hd)
void pack_rows(float* dst, const float* src, int64_t stride, int rows, int hd, int hdp, const float* pf, int pf_rows) {
  const int d = HD ? HD : hd;
  const int nv = d / 8;
  const __m256i tmask = first_lanes(d & 7);
  for (int j = 0; j < rows; ++j, src += stride, pf += stride, dst += hdp) {
    if (j < pf_rows)
      LARDER_UNROLL for (int off = 0; off < d; off += 16) _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T1);
    LARDER_UNROLL for (int i = 0; i < nv; ++i) _mm256_store_ps(dst + 8 * i, _mm256_loadu_ps(src + 8 * i));
    if (d & 7) _mm256_store_ps(dst + 8 * nv, _mm256_maskload_ps(src + 8 * nv, tmask));  // zeros past hd
  }
}

void pack(float* dst, const float* src, int64_t stride, int rows, int hd, int hdp, const float* pf, int pf_rows) {
  if (hd == 64) return pack_rows<64>(dst, src, stride, rows, hd, hdp, pf, pf_rows);
  if (hd == 128) return pack_rows<128>(dst, src, stride, rows, hd, hdp, pf, pf_rows);
  pack_rows<0>(dst, src, stride, rows, hd, hdp, pf, pf_rows);
}

// Which query heads a slot covers: slot = (KV head, slice of its group); groups larger than
// kMaxGroup are sliced so one pair loop never holds more than kMaxGroup heads.
struct Slots {
  int group, splits, g;
  explicit Slots(const AttentionParams& p)
      : group(p.n_heads / p.n_kv_heads),
        splits((group + kMaxGroup - 1) / kMaxGroup),
        g((group + splits - 1) / splits) {}
  int64_t count(const AttentionParams& p) const { return static_cast<int64_t>(p.n_kv_heads) * splits; }
  int kvh(int64_t slot) const { return static_cast<int>(slot / splits); }
  int h0(int64_t slot) const { return kvh(slot) * group + static_cast<int>(slot % splits) * g; }
  int heads(int64_t slot) const { return std::max(0, std::min(g, kvh(slot) * group + group - h0(slot))); }
};

// Where an item keeps its partial results: the pair (query row t0 + r, query head h) at index
// r·row_pairs + (h − head0) of m, l and (times hdp) acc.
struct Partial {
  float* m;
  float* l;
  float* acc;
  int64_t row_pairs;
  int head0;
};

// One work item: query rows [t0, t0 + nt) × the query heads of slots [sl0, sl1), over key
// positions [k_lo, k_hi). Leaves the un-normalised online-softmax state in `out` (m = -inf,
// l = 0, acc = 0 for pairs that see no key of the range).
//
// The block loop is outside the slot loop: with every KV head of a block handled before the
// next block, the item walks the cache's token-major rows front to back — one sequential stream
// the hardware prefetcher follows — instead of one 256-byte-of-2-KiB strided stream per head.
// The other heads' parts of a block are L2 hits when their turn comes.
void attend_range(const float* q, int64_t t0, int64_t nt, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                  const AttentionParams& p, const Slots& sl, int64_t sl0, int64_t sl1, int64_t k_lo, int64_t k_hi,
                  Scratch& s, const Partial& out) {
  const int hd = p.head_dim;
  const int hdp = (hd + 7) & ~7;
  const int64_t kv_row = static_cast<int64_t>(p.n_kv_heads) * hd;
  const int64_t q_row = static_cast<int64_t>(p.n_heads) * hd;
  const int head0 = sl.h0(sl0);
  const int nh = sl.h0(sl1 - 1) + sl.heads(sl1 - 1) - head0;  // heads of the item (contiguous)
  s.q.assign(static_cast<size_t>(nt * nh * hdp), 0.0f);
  for (int64_t r = 0; r < nt; ++r) {
    for (int i = 0; i < nh; ++i) {
      const size_t pi = static_cast<size_t>(r * out.row_pairs + (head0 + i - out.head0));
      out.m[pi] = -INFINITY;
      out.l[pi] = 0.0f;
      std::fill_n(out.acc + pi * hdp, hdp, 0.0f);
      std::copy_n(q + (t0 + r) * q_row + static_cast<int64_t>(head0 + i) * hd, hd, s.q.data() + (r * nh + i) * hdp);
    }
  }
  // Keys a row of the item can see at all.
  const int64_t pos_lo = q_pos0 + t0, pos_hi = q_pos0 + t0 + nt - 1;
  const int64_t first_lo = p.window > 0 ? std::max<int64_t>(0, pos_lo - p.window + 1) : 0;
  k_lo = std::max(k_lo, first_lo);
  k_hi = std::min(k_hi, pos_hi + 1);
  const int bk = block_keys(hd);
  // resize() zero-fills what it adds, so K rows past a block's end are always finite.
  s.kv.resize(static_cast<size_t>((2 * bk + 8) * hdp + 16));
  float* const kp = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(s.kv.data()) + 63) & ~uintptr_t{63});
  float* const vp = kp + (bk + 8) * hdp;
  for (int si = 0; si < n_spans; ++si) {
    const KvSpanView& sp = spans[si];
    const int64_t a = std::max(k_lo, sp.start), e = std::min(k_hi, sp.start + sp.len);
    for (int64_t kb = a; kb < e; kb += bk) {
      const int nb = static_cast<int>(std::min<int64_t>(bk, e - kb));
      const int pf_rows = static_cast<int>(std::clamp<int64_t>(e - (kb + bk), 0, bk));
      int packed = -1;  // KV head now in kp/vp (consecutive slots may share one)
      for (int64_t slot = sl0; slot < sl1; ++slot) {
        const int kvh = sl.kvh(slot), h0 = sl.h0(slot), g = sl.heads(slot);
        if (kvh != packed) {
          const float* ks = sp.k + (kb - sp.start) * kv_row + static_cast<int64_t>(kvh) * hd;
          const float* vs = sp.v + (kb - sp.start) * kv_row + static_cast<int64_t>(kvh) * hd;
          pack(kp, ks, kv_row, nb, hd, hdp, ks + bk * kv_row, pf_rows);
          pack(vp, vs, kv_row, nb, hd, hdp, vs + bk * kv_row, pf_rows);
          packed = kvh;
        }
        for (int64_t r = 0; r < nt; ++r) {
          const int64_t pos = pos_lo + r;
          const int64_t first = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
          // This row sees keys [first, pos]: a contiguous range of the block.
          const int lo = static_cast<int>(std::clamp<int64_t>(first - kb, 0, nb));
          const int hi = static_cast<int>(std::clamp<int64_t>(pos + 1 - kb, 0, nb));
          if (lo >= hi) continue;
          for (int i = 0; i < g; ++i) {
            const int h = h0 + i;
            const size_t pi = static_cast<size_t>(r * out.row_pairs + (h - out.head0));
            const float* qh = s.q.data() + (r * nh + (h - head0)) * hdp;
            float* acc = out.acc + pi * hdp;
            if (hd == 64) {
              pair_block<64>(qh, kp, vp, lo, hi, hdp, p.scale, s.sc, out.m[pi], out.l[pi], acc);
            } else if (hd == 128) {
              pair_block<128>(qh, kp, vp, lo, hi, hdp, p.scale, s.sc, out.m[pi], out.l[pi], acc);
            } else {
              pair_block<0>(qh, kp, vp, lo, hi, hdp, p.scale, s.sc, out.m[pi], out.l[pi], acc);
            }
          }
        }
      }
    }
  }
}

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
                     const AttentionParams& p, int64_t tile, int64_t chunk_keys, int64_t slots_per_item, float* out) {
  const Slots sl(p);
  const int hd = p.head_dim;
  const int hdp = (hd + 7) & ~7;
  const int64_t q_row = static_cast<int64_t>(p.n_heads) * hd;
  const int64_t slots = sl.count(p);
  tile = std::clamp<int64_t>(tile, 1, kMaxTile);
  const int64_t row_tiles = (n + tile - 1) / tile;
  const int64_t sgs = std::clamp<int64_t>(slots_per_item, 1, slots);
  const int64_t slot_groups = (slots + sgs - 1) / sgs;
  // The key positions any row sees; chunks tile this range.
  const int64_t r0 = p.window > 0 ? std::max<int64_t>(0, q_pos0 - p.window + 1) : 0;
  const int64_t keys = q_pos0 + n - r0;
  const int64_t chunks = chunk_keys > 0 ? std::max<int64_t>(1, (keys + chunk_keys - 1) / chunk_keys) : 1;
  thread_local Scratch scratch;

  if (chunks == 1) {
    default_pool().parallel_for(row_tiles * slot_groups, [&](int64_t it, int) {
      const int64_t sl0 = (it % slot_groups) * sgs, sl1 = std::min(slots, sl0 + sgs);
      const int head0 = sl.h0(sl0);
      const int nh = sl.h0(sl1 - 1) + sl.heads(sl1 - 1) - head0;
      if (nh <= 0) return;
      const int64_t t0 = (it / slot_groups) * tile, nt = std::min(tile, n - t0);
      Scratch& s = scratch;
      const size_t pairs = static_cast<size_t>(nt * nh);
      s.m.resize(pairs);
      s.l.resize(pairs);
      s.acc.resize(pairs * hdp);
      attend_range(q, t0, nt, q_pos0, spans, n_spans, p, sl, sl0, sl1, INT64_MIN, INT64_MAX, s,
                   {s.m.data(), s.l.data(), s.acc.data(), nh, head0});
      for (int64_t r = 0; r < nt; ++r) {
        for (int i = 0; i < nh; ++i) {
          const size_t pi = static_cast<size_t>(r * nh + i);
          float* o = out + (t0 + r) * q_row + static_cast<int64_t>(head0 + i) * hd;
          const float inv = s.l[pi] > 0 ? 1.0f / s.l[pi] : 0.0f;
          const float* acc = s.acc.data() + pi * hdp;
          for (int d = 0; d < hd; ++d) o[d] = acc[d] * inv;
        }
      }
    });
    return;
  }

  // Split: partials of chunk c for (row t, head h) at (c·n + t)·n_heads + h. Owned by the
  // calling thread and reused across calls (decode calls this once per layer and step).
  thread_local std::vector<float> part_m, part_l, part_acc;
  const size_t planes = static_cast<size_t>(chunks * n * p.n_heads);
  part_m.resize(planes);
  part_l.resize(planes);
  part_acc.resize(planes * hdp);
  // Workers must write the caller's buffers, not their own thread_locals of the same name.
  float* const pm = part_m.data();
  float* const pl = part_l.data();
  float* const pa = part_acc.data();
  const int64_t clen = chunk_keys;
  default_pool().parallel_for(row_tiles * slot_groups * chunks, [&](int64_t it, int) {
    const int64_t c = it % chunks, rest = it / chunks;
    const int64_t sl0 = (rest % slot_groups) * sgs, sl1 = std::min(slots, sl0 + sgs);
    const int64_t t0 = (rest / slot_groups) * tile, nt = std::min(tile, n - t0);
    const size_t base = static_cast<size_t>((c * n + t0) * p.n_heads);
    attend_range(q, t0, nt, q_pos0, spans, n_spans, p, sl, sl0, sl1, r0 + c * clen, r0 + (c + 1) * clen, scratch,
                 {pm + base, pl + base, pa + base * hdp, p.n_heads, 0});
  });
  // Log-sum-exp merge: chunk c's state is (m_c, l_c, acc_c) relative to its own max; rescaled to
  // the global max M, the chunk contributes exp(m_c − M)·l_c to the sum and exp(m_c − M)·acc_c to
  // the output. A chunk the row cannot see (m_c = -inf) contributes nothing.
  const int64_t pairs = n * p.n_heads;
  default_pool().parallel_for(pairs, [&](int64_t pi, int) {
    const size_t stride = static_cast<size_t>(pairs);
    float mx = -INFINITY;
    for (int64_t c = 0; c < chunks; ++c) mx = std::max(mx, pm[c * stride + pi]);
    float* o = out + pi * hd;  // pair index t·n_heads + h is also the output's row-major head index
    std::fill_n(o, hd, 0.0f);
    if (mx == -INFINITY) return;
    float sum = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t ci = c * stride + pi;
      if (pm[ci] == -INFINITY) continue;
      const float w = std::exp(pm[ci] - mx);
      sum += w * pl[ci];
      const float* acc = pa + ci * hdp;
      for (int d = 0; d < hd; ++d) o[d] += w * acc[d];
    }
    const float inv = 1.0f / sum;
    for (int d = 0; d < hd; ++d) o[d] *= inv;
  });
}

void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans, const AttentionParams& p,
               float* out) {
  const int64_t slots = Slots(p).count(p);
  const int64_t threads = default_pool().n_threads();
  const int64_t r0 = p.window > 0 ? std::max<int64_t>(0, q_pos0 - p.window + 1) : 0;
  const int64_t keys = q_pos0 + n - r0;
  if (n <= kMaxTile && keys >= kSplitMinKeys) {
    // Decode: all rows and all KV heads in each item (the cache is read once, front to back),
    // parallel over KV chunks: ~8 items per thread (dynamic balancing on a shared host, like the
    // matmuls), never shorter than kMinChunk keys.
    const int64_t chunks = std::clamp<int64_t>(8 * threads, 1, keys / kMinChunk);
    attention_tiled(q, n, q_pos0, spans, n_spans, p, n, chunks > 1 ? (keys + chunks - 1) / chunks : 0, slots, out);
    return;
  }
  // Prefill, or short contexts: one KV head per item; query rows per item enough to amortize
  // each K/V block over many queries, while leaving ≥ 4 items per thread for load balance.
  const int64_t want_items = 4 * threads;
  const int64_t tile = std::clamp<int64_t>(n * slots / std::max<int64_t>(want_items, 1), 1, kMaxTile);
  attention_tiled(q, n, q_pos0, spans, n_spans, p, tile, 0, 1, out);
}

}  // namespace larder::kernels::cpu::avx2
