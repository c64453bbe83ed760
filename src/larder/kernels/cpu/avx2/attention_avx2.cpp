// attention_avx2.cpp — causal GQA attention with an online (streaming) softmax, f32, AVX2/FMA.
//
// Work item = (tile of up to 16 query rows, KV head): the `group` query heads that share a KV
// head and the tile's rows are processed together, so each K and V row is pulled from memory
// once per item instead of once per (row, query head) — decode attention is a stream over the
// whole cache, GQA (group 4 in Llama 3) cuts its bytes 4x, and in prefill the row tile cuts them
// again (a first version without row tiles ran a 256-row chunk at 4k context at ~2 GFLOP/s,
// bound on L3 misses). Keys are taken in blocks of kBlock: the block's scores are computed, its
// maximum found, the running sum and accumulator rescaled once per block (not per key), then V
// rows are accumulated with exp weights. Items are spread over the thread pool.
//
// Numerics differ from the double-precision reference only by f32 rounding and the polynomial
// exp (relative error < 2e-7 on the range softmax uses): tests/unit/kernels_fast bound it.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/simd_avx2.h"

namespace larder::kernels::cpu::avx2 {

namespace {

constexpr int kBlock = 64;       // keys per softmax block
constexpr int kMaxGroup = 16;    // query heads per KV head handled in one item (larger: split)

// exp(x) for x <= 0 (scores minus their maximum), 8 lanes: x = k·ln2 + r with |r| <= ln2/2,
// exp(r) by a degree-6 polynomial (Taylor terms; error < 2e-7 relative on that interval),
// 2^k through the exponent bits. Inputs below -87 flush to 0 (their weight is < 1e-38).
inline __m256 exp_neg(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - k·ln2 in two steps (Cody–Waite) so r keeps full precision.
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

inline float dot(const float* a, const float* b, int d) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= d; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= d; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = simd::hsum(_mm256_add_ps(acc0, acc1));
  for (; i < d; ++i) s += a[i] * b[i];
  return s;
}

// acc[d] = acc·c + w·v
inline void axpby(float* acc, float c, float w, const float* v, int d) {
  const __m256 vc = _mm256_set1_ps(c), vw = _mm256_set1_ps(w);
  int i = 0;
  for (; i + 8 <= d; i += 8) {
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vw, _mm256_loadu_ps(v + i), _mm256_mul_ps(vc, _mm256_loadu_ps(acc + i))));
  }
  for (; i < d; ++i) acc[i] = acc[i] * c + w * v[i];
}

inline void axpy(float* acc, float w, const float* v, int d) {
  const __m256 vw = _mm256_set1_ps(w);
  int i = 0;
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vw, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
  for (; i < d; ++i) acc[i] += w * v[i];
}

// Block weights: sc[lo, hi) holds raw scores on entry and exp(score − m_new) on return; returns
// their sum and updates the running max `m` (c = exp(m_old − m_new) rescales what came before).
inline float block_softmax(float* sc, int lo, int hi, float bmax, float& m, float* c_out) {
  const float m_new = std::max(m, bmax);
  *c_out = m == -INFINITY ? 0.0f : std::exp(m - m_new);
  m = m_new;
  const __m256 vm = _mm256_set1_ps(m_new);
  int j = lo;
  __m256 lsum = _mm256_setzero_ps();
  for (; j + 8 <= hi; j += 8) {
    const __m256 w = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vm));
    _mm256_storeu_ps(sc + j, w);
    lsum = _mm256_add_ps(lsum, w);
  }
  float ls = simd::hsum(lsum);
  for (; j < hi; ++j) {
    sc[j] = std::exp(sc[j] - m_new);
    ls += sc[j];
  }
  return ls;
}

// One (query row, head) against keys [lo, hi) of a block, for the common head sizes: q and the
// output accumulator live in registers for the whole block (HD/8 ymm each), so a key costs HD/8
// FMAs for its score and HD/8 for its value, with no accumulator round trip through memory — the
// generic version below stores and reloads acc per key, a store-forwarding chain that capped it
// at ~180 cycles per key and head.
template <int HD>
void head_block(const float* qh, const float* const* kk, const float* const* vv, int lo, int hi, float scale, float* sc,
                float& m, float& l, float* acc_mem) {
  constexpr int V = HD / 8;
  __m256 qv[V];
  LARDER_UNROLL for (int i = 0; i < V; ++i) qv[i] = _mm256_loadu_ps(qh + 8 * i);
  float bmax = -INFINITY;
  for (int j = lo; j < hi; ++j) {
    const float* k = kk[j];
    __m256 s0 = _mm256_mul_ps(qv[0], _mm256_loadu_ps(k)), s1 = _mm256_mul_ps(qv[1], _mm256_loadu_ps(k + 8));
    LARDER_UNROLL for (int i = 2; i < V; i += 2) {
      s0 = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(k + 8 * i), s0);
      s1 = _mm256_fmadd_ps(qv[i + 1], _mm256_loadu_ps(k + 8 * i + 8), s1);
    }
    sc[j] = simd::hsum(_mm256_add_ps(s0, s1)) * scale;
    bmax = std::max(bmax, sc[j]);
  }
  float c;
  const float ls = block_softmax(sc, lo, hi, bmax, m, &c);
  l = l * c + ls;
  __m256 a[V];
  const __m256 vc = _mm256_set1_ps(c);
  LARDER_UNROLL for (int i = 0; i < V; ++i) a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc_mem + 8 * i), vc);
  for (int j = lo; j < hi; ++j) {
    const __m256 w = _mm256_set1_ps(sc[j]);
    const float* v = vv[j];
    LARDER_UNROLL for (int i = 0; i < V; ++i) a[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * i), a[i]);
  }
  LARDER_UNROLL for (int i = 0; i < V; ++i) _mm256_storeu_ps(acc_mem + 8 * i, a[i]);
}

// Any head size (tails handled by dot/axpy).
void head_block_any(const float* qh, const float* const* kk, const float* const* vv, int lo, int hi, float scale, int hd,
                    float* sc, float& m, float& l, float* acc) {
  float bmax = -INFINITY;
  for (int j = lo; j < hi; ++j) {
    sc[j] = dot(qh, kk[j], hd) * scale;
    bmax = std::max(bmax, sc[j]);
  }
  float c;
  const float ls = block_softmax(sc, lo, hi, bmax, m, &c);
  l = l * c + ls;
  axpby(acc, c, sc[lo], vv[lo], hd);
  for (int jj = lo + 1; jj < hi; ++jj) axpy(acc, sc[jj], vv[jj], hd);
}

struct Scratch {
  std::vector<float> scores;  // [kBlock]
  std::vector<float> acc;     // [rows, group, head_dim]
  std::vector<float> m, l;    // [rows, group] running max and sum
};

// One work item: query rows [t0, t0 + nt) × the `g` query heads [h0, h0 + g) that read KV head
// `kvh`. Keys are visited once per item in blocks of kBlock (K and V of a block: 32 KiB at
// head_dim 64, L1/L2-resident), and every (row, head) pair of the item consumes the block while
// it is hot — so K/V bytes pulled from L3/DRAM are divided by nt·g instead of paid per query.
void attend_tile(const float* q, int64_t t0, int64_t nt, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                 const AttentionParams& p, int kvh, int h0, int g, Scratch& s, float* out) {
  const int hd = p.head_dim;
  const int64_t kv_row = static_cast<int64_t>(p.n_kv_heads) * hd;
  const int64_t q_row = static_cast<int64_t>(p.n_heads) * hd;
  const size_t pairs = static_cast<size_t>(nt) * static_cast<size_t>(g);
  s.scores.resize(kBlock);
  s.acc.assign(pairs * static_cast<size_t>(hd), 0.0f);
  s.m.assign(pairs, -INFINITY);
  s.l.assign(pairs, 0.0f);
  const int64_t pos_lo = q_pos0 + t0, pos_hi = q_pos0 + t0 + nt - 1;  // the item's query positions
  const int64_t first_lo = p.window > 0 ? std::max<int64_t>(0, pos_lo - p.window + 1) : 0;
  const float* kv_k[kBlock];
  const float* kv_v[kBlock];
  int64_t kpos0 = 0;  // position of the block's first key (blocks hold consecutive positions)
  int nb = 0;
  auto flush_block = [&]() {
    if (nb == 0) return;
    for (int64_t r = 0; r < nt; ++r) {
      const int64_t pos = pos_lo + r;
      const int64_t first = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
      // This row sees keys [first, pos]: a contiguous range of the block.
      const int lo = static_cast<int>(std::clamp<int64_t>(first - kpos0, 0, nb));
      const int hi = static_cast<int>(std::clamp<int64_t>(pos + 1 - kpos0, 0, nb));
      if (lo >= hi) continue;
      for (int i = 0; i < g; ++i) {
        const size_t pi = static_cast<size_t>(r) * static_cast<size_t>(g) + static_cast<size_t>(i);
        const float* qh = q + (t0 + r) * q_row + static_cast<int64_t>(h0 + i) * hd;
        float* acc = s.acc.data() + pi * static_cast<size_t>(hd);
        if (hd == 64) {
          head_block<64>(qh, kv_k, kv_v, lo, hi, p.scale, s.scores.data(), s.m[pi], s.l[pi], acc);
        } else if (hd == 128) {
          head_block<128>(qh, kv_k, kv_v, lo, hi, p.scale, s.scores.data(), s.m[pi], s.l[pi], acc);
        } else {
          head_block_any(qh, kv_k, kv_v, lo, hi, p.scale, hd, s.scores.data(), s.m[pi], s.l[pi], acc);
        }
      }
    }
    nb = 0;
  };
  for (int si = 0; si < n_spans; ++si) {
    const KvSpanView& sp = spans[si];
    const int64_t a = std::max<int64_t>(first_lo, sp.start), b = std::min<int64_t>(pos_hi + 1, sp.start + sp.len);
    for (int64_t kp = a; kp < b; ++kp) {
      const int64_t j = kp - sp.start;
      if (nb == 0) kpos0 = kp;
      kv_k[nb] = sp.k + j * kv_row + static_cast<int64_t>(kvh) * hd;
      kv_v[nb] = sp.v + j * kv_row + static_cast<int64_t>(kvh) * hd;
      // Pull the next block's rows toward L1 while this one is consumed (decode streams the
      // whole cache once; its stride is a full KV row, which the hardware prefetcher ramps on
      // slowly).
      if (kp + kBlock < b) {
        const float* nk = kv_k[nb] + kBlock * kv_row;
        const float* nv = kv_v[nb] + kBlock * kv_row;
        for (int off = 0; off < hd; off += 16) {
          _mm_prefetch(reinterpret_cast<const char*>(nk + off), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(nv + off), _MM_HINT_T0);
        }
      }
      if (++nb == kBlock) flush_block();
    }
  }
  flush_block();
  for (int64_t r = 0; r < nt; ++r) {
    for (int i = 0; i < g; ++i) {
      const size_t pi = static_cast<size_t>(r) * static_cast<size_t>(g) + static_cast<size_t>(i);
      float* o = out + (t0 + r) * q_row + static_cast<int64_t>(h0 + i) * hd;
      const float inv = s.l[pi] > 0 ? 1.0f / s.l[pi] : 0.0f;
      const float* acc = s.acc.data() + pi * static_cast<size_t>(hd);
      for (int d = 0; d < hd; ++d) o[d] = acc[d] * inv;
    }
  }
}

}  // namespace

void attention(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans, const AttentionParams& p,
               float* out) {
  const int group = p.n_heads / p.n_kv_heads;
  const int splits = (group + kMaxGroup - 1) / kMaxGroup;  // query-head slices per KV head
  const int g = (group + splits - 1) / splits;
  // Query rows per item: enough to amortize each K/V block over many queries, while leaving
  // ≥ 4 items per thread for load balance.
  const int64_t slots = static_cast<int64_t>(p.n_kv_heads) * splits;
  const int64_t want_items = 4 * default_pool().n_threads();
  int64_t tile = std::clamp<int64_t>(n * slots / std::max<int64_t>(want_items, 1), 1, 16);
  const int64_t row_tiles = (n + tile - 1) / tile;
  const int64_t items = row_tiles * slots;
  thread_local Scratch scratch;
  default_pool().parallel_for(items, [&](int64_t it, int) {
    const int64_t rt = it / slots;
    const int rem = static_cast<int>(it % slots);
    const int kvh = rem / splits, part = rem % splits;
    const int h0 = kvh * group + part * g;
    const int gg = std::min(g, kvh * group + group - h0);
    if (gg <= 0) return;
    const int64_t t0 = rt * tile, nt = std::min(tile, n - t0);
    attend_tile(q, t0, nt, q_pos0, spans, n_spans, p, kvh, h0, gg, scratch, out);
  });
}

}  // namespace larder::kernels::cpu::avx2
